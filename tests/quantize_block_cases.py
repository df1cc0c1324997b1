"""FP8-block and NVFP4 quantizer cases shared by the pytorch, jax and parity tests, and their
reference bytes (through ``twinengine.testing.reference_quantize``, the public bridge from a
quantizer spec to the independent NumPy reference)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from helpers import NUMPY_DTYPES, assert_bytes_equal, fields_as_numpy

import twinengine as te
from twinengine.testing import reference_dequantize as reference_dequantize_qt
from twinengine.testing import reference_quantize as reference_quantize_qt

FP8_BLOCK_QUANTIZERS = [
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    te.Float8BlockQuantizer("e5m2", block_scaling_dim=1, force_pow_2_scales=False),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=2, force_pow_2_scales=False, amax_epsilon=0.5),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=1, columnwise=False, amax_epsilon=1e-3),
    te.Float8BlockQuantizer("e5m2", block_scaling_dim=2, rowwise=False),
]

FP8_BLOCK_SHAPES = [(128, 256), (2, 128, 128), (256, 128)]

NVFP4_QUANTIZERS = [
    te.NVFP4Quantizer(),
    te.NVFP4Quantizer(with_2d_quantization=True),
    te.NVFP4Quantizer(with_rht=True),
    te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
    te.NVFP4Quantizer(stochastic_rounding=True, with_2d_quantization=True),
    te.NVFP4Quantizer(with_rht=True, with_2d_quantization=True, stochastic_rounding=True),
    te.NVFP4Quantizer(columnwise=False, with_rht=True, stochastic_rounding=True),
    te.NVFP4Quantizer(rowwise=False, with_rht=True),
]

NVFP4_SHAPES = [(32, 64), (2, 16, 48), (64, 16)]

RNG_STATE = np.array([0x1234ABCD, 4_000_000_007], np.uint32)
"""A fixed [seed, offset] (the offset above 2**31 exercises the full 32-bit range)."""

NON_MULTIPLE_SHAPES = {"fp8_block": [(128, 64), (96, 128), (3, 40, 128)], "nvfp4": [(16, 24), (8, 32), (3, 5, 16)]}
"""Shapes whose flattened (R, K) breaks the format's divisibility rule."""

DIVISIBILITY_MESSAGES = {"fp8_block": "FP8 block scaling needs R and K divisible by 128",
                         "nvfp4": "NVFP4 needs R and K divisible by 16"}


def dtypes_for(q: te.Quantizer) -> list[str]:
    """Input dtypes valid for `q` (the RHT of a columnwise copy needs bfloat16)."""
    if getattr(q, "with_rht", False) and q.columnwise:
        return ["bfloat16"]
    return ["float32", "bfloat16", "float16"]


def block_cases() -> list[tuple[te.Quantizer, tuple[int, ...], str]]:
    """(quantizer, shape, input dtype) triples covering every quantizer above."""
    out = []
    for quantizers, shapes in ((FP8_BLOCK_QUANTIZERS, FP8_BLOCK_SHAPES), (NVFP4_QUANTIZERS, NVFP4_SHAPES)):
        for q in quantizers:
            out += [(q, s, d) for s in shapes for d in dtypes_for(q)]
    return out


def case_id(value) -> str:
    if isinstance(value, te.Quantizer):
        return value.__fx_repr__()[0].replace(" ", "")
    return str(value)


def rng_for(q: te.Quantizer, state: np.ndarray = RNG_STATE) -> np.ndarray | None:
    """The rng array a quantize call with `q` takes (None without stochastic rounding)."""
    return state if getattr(q, "stochastic_rounding", False) else None


def reference_quantize(x: np.ndarray, q: te.Quantizer, rng: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The NumPy reference's fields for quantizing `x` with `q` (rng = [seed, offset])."""
    return fields_as_numpy(reference_quantize_qt(x, q, rng=rng))


def reference_dequantize(fields: dict[str, np.ndarray], q: te.Quantizer, shape, dtype: str,
                         columnwise: bool) -> np.ndarray:
    """The reference dequantization of one copy, rounded to `dtype`."""
    return reference_dequantize_qt(te.QuantizedTensor(**fields, quantizer=q, shape=tuple(shape)), dtype,
                                   columnwise=columnwise)


def check_dequantize_copies(dequantize: Callable[[Any, str, bool], Any], to_numpy: Callable[[Any], np.ndarray], qt,
                            fields: dict[str, np.ndarray], out_dtype: str) -> None:
    """Dequantizes both copies of `qt` with a frontend's ``dequantize(qt, dtype_name, columnwise)``
    and compares each to the reference (`fields` are the reference's quantized fields); an absent
    copy must raise the shared "no ... copy" error."""
    q, shape = qt.quantizer, tuple(qt.shape)
    for columnwise in (False, True):
        if not (q.columnwise if columnwise else q.rowwise):
            with pytest.raises(ValueError, match="no (rowwise|columnwise) copy"):
                dequantize(qt, out_dtype, columnwise)
            continue
        y = to_numpy(dequantize(qt, out_dtype, columnwise))
        assert y.dtype == NUMPY_DTYPES[out_dtype] and y.shape == shape
        expected = reference_dequantize(fields, q, shape, out_dtype, columnwise)
        assert_bytes_equal(y, expected, f"{case_id(q)} dequantize columnwise={columnwise}")


SR_DRAWS = 256
"""Stochastic-rounding draws (offsets) averaged by the unbiasedness tests."""


def unit_scale_blocks(values: np.ndarray) -> np.ndarray:
    """fp32 (rows, 16·n) with column 16·b of every row set to 6.0 and `values` (rows, 15·n) in
    the other columns of block b.

    With |values| <= 6, every block amax and the global amax are 6, so S_enc = 448, d_b = 448,
    the encode multiplier m_b = 1/fl(448·fl(1/448)) = 1 and the decode multiplier
    fl(fl(448·6)·fl(1/2688)) = 1, all exactly (NUMERICS.md §7): quantizing rounds x itself onto
    the E2M1 grid and dequantizing returns the grid value.
    """
    rows, n = values.shape[0], values.shape[1] // 15
    x = np.full((rows, n, 16), 6.0, np.float32)
    x[:, :, 1:] = values.reshape(rows, n, 15)
    return x.reshape(rows, 16 * n)


def sr_probe_input(rows: int = 64, blocks: int = 4, seed: int = 5) -> np.ndarray:
    """unit_scale_blocks of values uniform in (-6, 6): the stochastic-rounding probe."""
    g = np.random.default_rng(seed)
    return unit_scale_blocks(g.uniform(-6.0, 6.0, (rows, 15 * blocks)).astype(np.float32))


def e2m1_step(x: np.ndarray) -> np.ndarray:
    """E2M1 grid spacing at |x| (NUMERICS.md §7 step 9)."""
    a = np.abs(x)
    return np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0)).astype(np.float32)


def assert_sr_unbiased(sr_samples: np.ndarray, rne: np.ndarray, x: np.ndarray) -> None:
    """Checks that the mean of SR_DRAWS stochastic dequantizations of sr_probe_input() is close
    to x, and much closer than round-to-nearest.

    Work in units of the grid step h = step(|x|) per element (x̂ is the grid value itself, see
    unit_scale_blocks). Each SR draw of an element is one of the two grid neighbours of x; its
    mean over the 8-bit random byte is x - δ with 0 <= δ <= h/256 (u = k/256 is quantized).
    With N = SR_DRAWS independent draws (distinct Philox counters), Var(mean) <= h²/(4N), so
    E|mean - x|/h <= 1/256 + 1/(2√N) = 0.0352 for N = 256. Over M elements (independent, each
    normalized error in [0, 1]), Hoeffding gives P(MAE/h > E + t) <= exp(-2 M t²): t = 0.05
    with M = 4096 is exp(-20.5), so the bound is MAE/h <= 0.0852. The signed mean error over
    all elements averages M·N independent draws, each a centred term of range 1 (in units of
    h) plus the bias in [-1/256, 0]; Hoeffding gives P(|avg - bias| >= t) <= 2 exp(-2 M N t²),
    and t = 0.05/√N = 0.0031 makes that 2 exp(-20.5). Round-to-nearest has an error uniform
    in [0, h/2] for continuous x, i.e. MAE/h ≈ 0.25, well above the SR bound (the test asks
    for 2x).
    """
    h = e2m1_step(x)
    err = (sr_samples.astype(np.float64).mean(axis=0) - x) / h
    rne_err = (rne.astype(np.float64) - x) / h
    mae, rne_mae = float(np.abs(err).mean()), float(np.abs(rne_err).mean())
    assert mae <= 1 / 256 + 1 / (2 * np.sqrt(SR_DRAWS)) + 0.05, f"SR mean error {mae} h above the bound"
    assert abs(float(err.mean())) <= 1 / 256 + 0.05 / np.sqrt(SR_DRAWS), f"SR bias {err.mean()} h"
    assert rne_mae > 2 * mae, f"SR mean ({mae} h) not clearly closer than round-to-nearest ({rne_mae} h)"

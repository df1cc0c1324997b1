"""twinengine.testing: the reference is independent, edge values go through every format in both
frameworks with reference bytes, and assert_quantized_equal fails with a readable report."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import to_torch
from quantize_block_cases import RNG_STATE
from quantize_cases import DELAYED_SCALE, case_id

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep
import twinengine.testing as tt

QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3"),
    te.Float8CurrentScalingQuantizer("e5m2", force_pow_2_scales=True),
    te.Float8DelayedScalingQuantizer("e4m3"),
    te.MXFP8Quantizer("e4m3"),
    te.MXFP8Quantizer("e5m2", with_2d_quantization=True),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=2, force_pow_2_scales=False),
    te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
    te.NVFP4Quantizer(with_2d_quantization=True),
]


def _fmt(q):
    return getattr(q, "fp8_dtype", "e2m1")


def _extras(q):
    return {"scale": DELAYED_SCALE if q.scaling_mode == "fp8_delayed" else None,
            "rng": RNG_STATE if getattr(q, "stochastic_rounding", False) else None}


def test_reference_imports_nothing_of_twinengine():
    source = pathlib.Path(tt.reference.__file__).read_text()
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            modules.add("." if node.level else node.module.split(".")[0])
    assert modules == {"__future__", "math", "ml_dtypes", "numpy"}
    code = ("import sys, twinengine.testing; "
            "print(sorted(m for m in ('torch', 'jax', 'twinengine._C') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("family", tt.FAMILIES)
@pytest.mark.parametrize("q", QUANTIZERS, ids=case_id)
def test_edge_values_give_reference_bytes_in_both_frameworks(q, family):
    x = tt.edge_values("bfloat16", _fmt(q))[family]
    extras = _extras(q)
    expected = tt.reference_quantize(x, q, **extras)
    torch_extras = {k: None if v is None else torch.from_numpy(v.astype(np.int64) if k == "rng" else v)
                    for k, v in extras.items()}
    tt.assert_quantized_equal(tep.quantize(to_torch(x), q, **torch_extras), expected, f"torch {family}")
    jax_extras = {k: None if v is None else jnp.asarray(v) for k, v in extras.items()}
    tt.assert_quantized_equal(tej.quantize(jnp.asarray(x), q, **jax_extras), expected, f"jax {family}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1"])
def test_edge_values_ties_are_quantized_unscaled(dtype, fmt):
    """The tie families really sit on rounding boundaries: every block's scale is exactly 1."""
    values = tt.edge_values(dtype, fmt)
    assert all(v.shape == (128, 128) and v.dtype == tt.to_numpy(v).dtype for v in values.values())
    assert sorted(values) == sorted(tt.FAMILIES)
    for family in ("ties", "format_subnormals"):
        x = values[family]
        if fmt == "e2m1":
            qt = tt.reference_quantize(x, te.NVFP4Quantizer(columnwise=False))
            assert float(qt.amax[0]) == 2688.0
            codes = qt.rowwise_scale_inv[:128, :8]
            assert (codes.reshape(-1)[1:] == 0x38).all()  # E4M3 1.0, all but the global-anchor block
            continue
        qt = tt.reference_quantize(x, te.Float8CurrentScalingQuantizer(fmt))
        assert float(qt.rowwise_scale_inv[0]) == 1.0
        qt = tt.reference_quantize(x, te.MXFP8Quantizer(fmt))
        assert (qt.rowwise_scale_inv[:128, :4] == 127).all() and (qt.columnwise_scale_inv[:4, :128] == 127).all()
        exact = tt.reference.decode_fp8_ref(tt.reference.cast_fp8_ref(x.astype(np.float32), fmt), fmt)
        assert not np.array_equal(exact, x.astype(np.float32))  # ties do not survive unrounded


def _quantized(q=te.MXFP8Quantizer("e4m3"), shape=(64, 64)):
    x = np.linspace(-3, 3, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return tep.quantize(torch.from_numpy(x), q), tt.reference_quantize(x, q)


def test_assert_quantized_equal_reports_first_data_difference():
    got, expected = _quantized()
    tt.assert_quantized_equal(got, expected)
    got.rowwise_data.view(torch.uint8)[5, 40] ^= 1
    with pytest.raises(AssertionError) as info:
        tt.assert_quantized_equal(got, expected, "my kernel")
    text = str(info.value)
    assert text.startswith("my kernel: rowwise_data: 1 of 4096 elements differ; first at (5, 40)")
    assert "E4M3" in text and "1x32 block cols 32..63 of row 5" in text
    assert "rowwise_scale_inv[5, 1]: actual E8M0 " in text
    scale = 2.0 ** (int(expected.rowwise_scale_inv[5, 1]) - 127)
    code = int(expected.rowwise_data.view(np.uint8)[5, 40])
    value = float(tt.reference.decode_fp8_ref(np.array([code], np.uint8), "e4m3")[0]) * scale
    assert f"  dequantized: actual {value:.9g}" not in text and f", expected {value:.9g}" in text


def test_assert_quantized_equal_reports_nvfp4_pairs_and_scales():
    q = te.NVFP4Quantizer(columnwise=False)
    got, expected = _quantized(q, (32, 64))
    got.rowwise_data[3, 10] ^= 0x10
    with pytest.raises(AssertionError, match=r"(?s)rowwise_data: .* first at \(3, 10\).*E2M1 pair .*"
                                             r"1x16 block elements 16..31 of row 3"):
        tt.assert_quantized_equal(got, expected)
    got, expected = _quantized(q, (32, 64))
    got.rowwise_scale_inv[2, 1] = 0x40
    with pytest.raises(AssertionError, match=r"(?s)rowwise_scale_inv: 1 of .* first at \(2, 1\).*actual   0x40 = E4M3 2"):
        tt.assert_quantized_equal(got, expected)


def test_assert_quantized_equal_requires_zero_scale_padding():
    got, expected = _quantized()
    got.rowwise_scale_inv[100, 3] = 7  # rows 64.. and columns 2.. are padding of a (64, 64) input
    with pytest.raises(AssertionError, match=r"actual.rowwise_scale_inv: padding must be zero, but 1 padding entries "
                                             r"are not; first at \(100, 3\)"):
        tt.assert_quantized_equal(got, expected)


def test_assert_quantized_equal_compares_specs_amax_and_fields():
    got, expected = _quantized(te.Float8CurrentScalingQuantizer())
    got.amax[0] = 2.5
    with pytest.raises(AssertionError, match=r"amax: 1 of 1 elements differ; first at \(0,\)\n  actual 2.5"):
        tt.assert_quantized_equal(got, expected)
    other, _ = _quantized(te.Float8CurrentScalingQuantizer("e5m2"))
    with pytest.raises(AssertionError, match="quantizers differ"):
        tt.assert_quantized_equal(other, expected)
    got, expected = _quantized(te.Float8CurrentScalingQuantizer())
    got.columnwise_data = None
    with pytest.raises(AssertionError, match="fields differ"):
        tt.assert_quantized_equal(got, expected)
    with pytest.raises(AssertionError, match="not a twinengine QuantizedTensor"):
        tt.assert_quantized_equal(np.zeros(3), expected)


def test_reference_dequantize_matches_both_frontends():
    q = te.Float8BlockQuantizer("e4m3", block_scaling_dim=2)
    x = tt.edge_values("float32", "e4m3")["zero_blocks"]
    qt = tt.reference_quantize(x, q)
    for columnwise in (False, True):
        expected = tt.reference_dequantize(qt, "float32", columnwise=columnwise)
        got_torch = tep.dequantize(tep.quantize(torch.from_numpy(x), q), columnwise=columnwise).numpy()
        got_jax = np.asarray(jax.jit(tej.dequantize, static_argnames="columnwise")(
            tej.quantize(jnp.asarray(x), q), columnwise=columnwise))
        assert got_torch.tobytes() == expected.tobytes() == got_jax.tobytes()


def test_edge_values_rejects_unknown_arguments():
    with pytest.raises(ValueError, match="fmt must be 'e4m3', 'e5m2' or 'e2m1'"):
        tt.edge_values("float32", "fp8")
    with pytest.raises(ValueError, match="dtype must be float32, bfloat16 or float16"):
        tt.edge_values("float64", "e4m3")

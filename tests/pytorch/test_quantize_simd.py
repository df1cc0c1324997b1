"""Every bf16 and fp16 bit pattern, and a million random fp32 bit patterns, through the
vectorized quantize loops (FP8 per-tensor, MXFP8, FP8 block, NVFP4 round-to-nearest) (csrc/cpu/quantize.cc, one clone per x86 level, picked at run time)
against the NumPy reference, byte for byte: saturation, NaN, ±inf, subnormals, ties."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import assert_quantized_equal, fields_as_numpy, to_torch
from quantize_block_cases import reference_quantize as reference_quantize_block
from quantize_cases import reference_quantize

import twinengine as te
import twinengine.pytorch as tep


def _all_16bit(dtype) -> np.ndarray:
    """All 65536 bit patterns of a 16-bit float type as a (256, 256) array, shuffled so every
    32-element MXFP8 block mixes magnitudes (a block of one binade alone hides scale bugs)."""
    bits = np.random.default_rng(0).permutation(np.arange(65536, dtype=np.uint32)).astype(np.uint16)
    return bits.view(dtype).reshape(256, 256)


def _random_fp32(seed: int) -> np.ndarray:
    bits = np.random.default_rng(seed).integers(0, 2**32, size=1024 * 1024, dtype=np.uint64).astype(np.uint32)
    return bits.view(np.float32).reshape(1024, 1024).copy()


QUANTIZERS = [te.Float8CurrentScalingQuantizer("e4m3"), te.Float8CurrentScalingQuantizer("e5m2"),
              te.Float8CurrentScalingQuantizer("e4m3", columnwise=False), te.MXFP8Quantizer("e4m3"),
              te.MXFP8Quantizer("e5m2"), te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
              te.Float8BlockQuantizer("e5m2", block_scaling_dim=2, force_pow_2_scales=False),
              te.NVFP4Quantizer(), te.NVFP4Quantizer(with_2d_quantization=True)]


@pytest.mark.parametrize("q", QUANTIZERS, ids=repr)
@pytest.mark.parametrize("kind", ["bfloat16", "float16", "float32"])
def test_vectorized_casts_match_reference_on_every_pattern(q, kind):
    if kind == "float32":
        x = _random_fp32(1)
        finite = np.isfinite(x)
        # With a ±inf in the tensor the per-tensor scale is 1; rescale the finite values so
        # the scaled casts cover the FP8 range, subnormals and saturation as well.
        with np.errstate(invalid="ignore"):  # NaN patterns stay NaN
            x = np.where(finite, x * np.float32(2.0**-100), x).astype(np.float32)
    else:
        x = _all_16bit(ml_dtypes.bfloat16 if kind == "bfloat16" else np.float16)
    qt = tep.quantize(to_torch(x), q)
    expected = (reference_quantize_block(x, q) if q.scaling_mode in ("nvfp4", "fp8_block")
                else reference_quantize(x, q))
    assert_quantized_equal(fields_as_numpy(qt), expected, f"{q!r} {kind}")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_vectorized_per_tensor_cast_with_a_finite_scale(fmt):
    """No inf in the tensor: a real scale (448/amax or 57344/amax) multiplies every value."""
    x = _random_fp32(2)
    x = np.where(np.isfinite(x), x, np.float32(0.0))
    x = (x * np.float32(2.0**-90)).astype(np.float32)  # amax below 2^38: scale 448/amax is finite
    x[0, :64] = np.float32(1e-38) * np.arange(64, dtype=np.float32)  # subnormal results
    q = te.Float8CurrentScalingQuantizer(fmt)
    qt = tep.quantize(to_torch(x), q)
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q), f"{fmt} finite scale")


@pytest.mark.parametrize("kind, cols", [("float32", 2048 + 384), ("bfloat16", 4096 + 256)])
@pytest.mark.parametrize("q", [te.Float8BlockQuantizer("e4m3", block_scaling_dim=1), te.MXFP8Quantizer("e4m3"),
                               te.NVFP4Quantizer()], ids=repr)
def test_wide_rows_span_several_column_chunks(q, kind, cols):
    """Rows wider than one column chunk of the one-pass rowwise + columnwise loops (1 MB of
    input per 128-row block for FP8 block scaling): every chunk, the last one partial, meets the
    reference at 1 and 2 threads."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((256, cols)) * np.exp(rng.standard_normal((256, cols)) * 3)).astype(np.float32)
    if kind == "bfloat16":
        x = x.astype(ml_dtypes.bfloat16)
    expected = reference_quantize_block(x, q) if q.scaling_mode in ("nvfp4", "fp8_block") else reference_quantize(x, q)
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert_quantized_equal(fields_as_numpy(tep.quantize(to_torch(x), q)), expected, f"{q!r} {threads} threads")
    finally:
        torch.set_num_threads(saved)

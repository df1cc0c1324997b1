"""PyTorch FP8 block scaling (NUMERICS.md §6): bytes vs the NumPy reference, dequantize, errors,
torch.compile and opcheck."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import INPUT_FAMILIES, assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch, make_input, to_torch
from quantize_block_cases import (
    DIVISIBILITY_MESSAGES,
    FP8_BLOCK_QUANTIZERS,
    NON_MULTIPLE_SHAPES,
    block_cases,
    check_dequantize_copies,
    case_id,
    reference_quantize,
)

import twinengine as te
import twinengine.pytorch as tep

CASES = [c for c in block_cases() if c[0].scaling_mode == "fp8_block"]
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dequantize(qt: te.QuantizedTensor, dtype: str, columnwise: bool) -> torch.Tensor:
    return tep.dequantize(qt, TORCH_DTYPES[dtype], columnwise=columnwise)


@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("q,shape,dtype", CASES, ids=case_id)
def test_quantize_fp8_block_matches_reference(q, shape, dtype, family):
    x = make_input(family, shape, dtype)
    qt = tep.quantize(to_torch(x), q)
    assert qt.quantizer == q and qt.shape == shape and qt.dtype == dtype
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q), f"{case_id(q)} {family} {dtype}")


@pytest.mark.parametrize("q", FP8_BLOCK_QUANTIZERS[:2], ids=case_id)
def test_quantize_fp8_block_large_input_matches_reference(q):
    # 512K elements: the CPU kernels split the work over threads (csrc/internal/cpu.h parallel_for).
    x = make_input("mixed_scales", (512, 1024), "bfloat16", seed=9)
    qt = tep.quantize(to_torch(x), q)
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q), f"large {case_id(q)}")
    check_dequantize_copies(_dequantize, from_torch, qt, reference_quantize(x, q), "float32")


@pytest.mark.parametrize("dtype,inf_value", [("float32", 3.4028235e38), ("bfloat16", 3.3895314e38),
                                             ("float16", 65504.0)])
@pytest.mark.parametrize("pow2", [False, True])
def test_quantize_fp8_block_inf_scale_becomes_input_dtype_max(dtype, inf_value, pow2):
    # All-zero blocks with amax_epsilon = 1e-40: s = 448 / 1e-40 = +inf, replaced by the input
    # dtype's largest finite value (NUMERICS.md §6), then truncated to a power of two if pow2.
    x = make_input("zeros", (128, 256), dtype)
    q = te.Float8BlockQuantizer("e4m3", force_pow_2_scales=pow2, amax_epsilon=1e-40)
    qt = tep.quantize(to_torch(x), q)
    s = np.float32(inf_value)
    if pow2:
        s = (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    assert qt.rowwise_scale_inv[0, 0].item() == np.float32(1) / s
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q), f"zeros {dtype} pow2={pow2}")


@pytest.mark.parametrize("out_dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("q", FP8_BLOCK_QUANTIZERS, ids=case_id)
def test_dequantize_fp8_block_matches_reference(q, out_dtype):
    x = make_input("mixed_scales", (2, 128, 256), "float32", seed=1)
    qt = tep.quantize(to_torch(x), q)
    expected_fields = reference_quantize(x, q)
    check_dequantize_copies(_dequantize, from_torch, qt, expected_fields, out_dtype)


@pytest.mark.parametrize("shape", NON_MULTIPLE_SHAPES["fp8_block"], ids=str)
def test_quantize_fp8_block_rejects_non_multiple_shapes(shape):
    with pytest.raises(ValueError, match=f"twinengine.quantize: {DIVISIBILITY_MESSAGES['fp8_block']}"):
        tep.quantize(torch.zeros(shape), te.Float8BlockQuantizer("e4m3", block_scaling_dim=1))


def test_quantize_fp8_block_rejects_rng():
    with pytest.raises(ValueError, match="rng= is only used by quantizers with stochastic rounding"):
        tep.quantize(torch.zeros(128, 128), te.Float8BlockQuantizer(), rng=torch.zeros(2, dtype=torch.int64))


# One compiled function for every FP8-block quantizer: quantize, then dequantize both copies.
def _roundtrip(x, q):
    qt = tep.quantize(x, q)
    return qt, tep.dequantize(qt, torch.float32), tep.dequantize(qt, torch.bfloat16, columnwise=True)


_COMPILED_ROUNDTRIP = torch.compile(_roundtrip, fullgraph=True, backend="inductor")


@pytest.mark.parametrize("q", FP8_BLOCK_QUANTIZERS[:2], ids=case_id)
def test_quantize_fp8_block_compiled_matches_eager(q):
    x = to_torch(make_input("nan_inf", (2, 128, 128), "bfloat16"))
    eager, compiled = _roundtrip(x, q), _COMPILED_ROUNDTRIP(x, q)
    assert_quantized_equal(fields_as_numpy(compiled[0]), fields_as_numpy(eager[0]), "compiled vs eager")
    for got, want in zip(compiled[1:], eager[1:]):
        assert_bytes_equal(from_torch(got), from_torch(want), "dequantized")


# test_schema is left out: torch's SchemaCheckMode multiplies the float8 outputs, which CPU
# float8 tensors do not support.
FP8_OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_quantize_fp8_block_opcheck():
    q = te.Float8BlockQuantizer("e4m3", block_scaling_dim=2)
    x = torch.randn(128, 256)
    torch.library.opcheck(torch.ops.twinengine.quantize.default, (x, q, None, None), test_utils=FP8_OPCHECK_UTILS)
    qt = tep.quantize(x, q)
    torch.library.opcheck(torch.ops.twinengine.dequantize.default,
                          (qt.columnwise_data, qt.columnwise_scale_inv, None, q, [128, 256], "float32", True),
                          test_utils=FP8_OPCHECK_UTILS)

"""Core shape inference and validation of FP8 block scaling and NVFP4 (NUMERICS.md §6, §7)."""

from __future__ import annotations

import pytest

import twinengine as te
from twinengine.ops.quantize import DEQUANTIZE, QUANTIZE, RNG_DTYPES, ArrayMeta
from twinengine.quantized_tensor import QuantizedTensor

RNG = ArrayMeta((2,), "uint32")


def _outputs(call):
    return {spec.name: (spec.shape, spec.dtype) for spec in call.outputs}


def test_fp8_block_1d_layouts():
    call = QUANTIZE.plan(ArrayMeta((3, 128, 384), "bfloat16"), te.Float8BlockQuantizer("e5m2", block_scaling_dim=1))
    assert call.op == "quantize_fp8_block" and call.inputs == ("x",) and call.attr_dict()["two_d"] == 0
    assert _outputs(call) == {
        "rowwise_data": ((3, 128, 384), "float8_e5m2"),
        "rowwise_scale_inv": ((3, 384), "float32"),      # (K/128, roundup(R, 4)), R-minor
        "columnwise_data": ((384, 384), "float8_e5m2"),  # (K, R)
        "columnwise_scale_inv": ((3, 384), "float32"),   # (R/128, roundup(K, 4))
    }


def test_fp8_block_2d_layouts_pad_the_inner_dim_to_4():
    call = QUANTIZE.plan(ArrayMeta((256, 640), "float32"), te.Float8BlockQuantizer(block_scaling_dim=2))
    assert call.attr_dict()["two_d"] == 1
    assert _outputs(call) == {
        "rowwise_data": ((256, 640), "float8_e4m3fn"),
        "rowwise_scale_inv": ((2, 8), "float32"),        # (R/128, roundup(K/128, 4))
        "columnwise_data": ((640, 256), "float8_e4m3fn"),
        "columnwise_scale_inv": ((5, 4), "float32"),     # (K/128, roundup(R/128, 4))
    }


def test_nvfp4_layouts_and_per_copy_amax():
    call = QUANTIZE.plan(ArrayMeta((2, 16, 48), "bfloat16"), te.NVFP4Quantizer(with_rht=True))
    assert call.op == "quantize_nvfp4" and call.inputs == ("x",)
    assert _outputs(call) == {
        "rowwise_data": ((2, 16, 24), "uint8"),          # E2M1 pairs, last dim halved
        "rowwise_scale_inv": ((128, 4), "uint8"),        # (roundup(R, 128), roundup(K/16, 4))
        "columnwise_data": ((48, 16), "uint8"),          # (K, R/2)
        "columnwise_scale_inv": ((128, 4), "uint8"),     # (roundup(K, 128), roundup(R/16, 4))
        "amax": ((1,), "float32"),
        "columnwise_amax": ((1,), "float32"),
    }
    assert [spec.name for spec in call.outputs][-2:] == ["amax", "columnwise_amax"]


def test_nvfp4_stochastic_rounding_takes_the_rng_input():
    q = te.NVFP4Quantizer(columnwise=False, stochastic_rounding=True)
    call = QUANTIZE.plan(ArrayMeta((16, 16), "float32"), q, None, RNG)
    assert call.inputs == ("x", "rng") and call.attr_dict()["stochastic_rounding"] == 1
    assert set(_outputs(call)) == {"rowwise_data", "rowwise_scale_inv", "amax"}


@pytest.mark.parametrize("dtype", RNG_DTYPES)
def test_rng_dtypes_are_accepted(dtype):
    QUANTIZE.plan(ArrayMeta((16, 16), "float32"), te.NVFP4Quantizer(stochastic_rounding=True), None,
                  ArrayMeta((2,), dtype))


@pytest.mark.parametrize("x,q,rng,error,match", [
    ((128, 96), te.Float8BlockQuantizer(), None, ValueError, "FP8 block scaling needs R and K divisible by 128"),
    ((64, 128), te.Float8BlockQuantizer(block_scaling_dim=2), None, ValueError, r"\(R, K\) = \(64, 128\)"),
    ((16, 8), te.NVFP4Quantizer(), None, ValueError, "NVFP4 needs R and K divisible by 16"),
    ((16, 16), te.NVFP4Quantizer(stochastic_rounding=True), None, ValueError, "needs rng="),
    ((16, 16), te.NVFP4Quantizer(), RNG, ValueError, "rng= is only used by quantizers with stochastic rounding"),
    ((128, 128), te.Float8BlockQuantizer(), RNG, ValueError, "rng= is only used"),
    ((16, 16), te.NVFP4Quantizer(stochastic_rounding=True), ArrayMeta((2,), "float32"), TypeError, "rng must have dtype"),
    ((16, 16), te.NVFP4Quantizer(stochastic_rounding=True), ArrayMeta((1, 2), "int64"), ValueError, r"shape \(2,\)"),
])
def test_quantize_block_errors(x, q, rng, error, match):
    with pytest.raises(error, match=f"twinengine.quantize: .*{match}"):
        QUANTIZE.plan(ArrayMeta(x, "float32"), q, None, rng)


def test_nvfp4_rht_needs_bf16_only_with_columnwise_usage():
    with pytest.raises(TypeError, match="with_rht=True with columnwise usage needs bfloat16 x"):
        QUANTIZE.plan(ArrayMeta((16, 16), "float16"), te.NVFP4Quantizer(with_rht=True))
    QUANTIZE.plan(ArrayMeta((16, 16), "float16"), te.NVFP4Quantizer(with_rht=True, columnwise=False))


def test_dequantize_nvfp4_reads_the_copy_amax():
    q = te.NVFP4Quantizer()
    qt = QuantizedTensor(rowwise_data=object(), rowwise_scale_inv=object(), amax=object(), columnwise_data=object(),
                         columnwise_scale_inv=object(), columnwise_amax=object(), quantizer=q, shape=(16, 32))
    assert DEQUANTIZE.plan(qt, "float32").inputs == ("rowwise_data", "rowwise_scale_inv", "amax")
    call = DEQUANTIZE.plan(qt, "bfloat16", True)
    assert call.op == "dequantize_nvfp4"
    assert call.inputs == ("columnwise_data", "columnwise_scale_inv", "columnwise_amax")
    assert _outputs(call) == {"out": ((16, 32), "bfloat16")}


def test_dequantize_fp8_block_passes_the_block_dim():
    q = te.Float8BlockQuantizer(block_scaling_dim=2)
    qt = QuantizedTensor(columnwise_data=object(), columnwise_scale_inv=object(), quantizer=q, shape=(128, 128))
    call = DEQUANTIZE.plan(qt, "float32", True)
    assert call.op == "dequantize_fp8_block" and call.inputs == ("columnwise_data", "columnwise_scale_inv")
    assert call.attr_dict() == {"columnwise": 1, "two_d": 1}

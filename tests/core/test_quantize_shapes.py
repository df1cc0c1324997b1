"""Core shape inference and validation of the quantize family (shared by both frontends)."""

from __future__ import annotations

import pytest

import twinengine as te
from twinengine.ops.quantize import DEQUANTIZE, QUANTIZE, UPDATE_DELAYED_SCALING, ArrayMeta


def _outputs(call):
    return {spec.name: (spec.shape, spec.dtype) for spec in call.outputs}


def test_mxfp8_scale_shapes_are_padded():
    call = QUANTIZE.plan(ArrayMeta((2, 48, 96), "bfloat16"), te.MXFP8Quantizer("e5m2"))
    assert call.op == "quantize_mxfp8" and call.inputs == ("x",)
    assert _outputs(call) == {
        "rowwise_data": ((2, 48, 96), "float8_e5m2"),
        "rowwise_scale_inv": ((128, 4), "uint8"),   # (roundup(96, 128), roundup(3, 4))
        "columnwise_data": ((2, 48, 96), "float8_e5m2"),
        "columnwise_scale_inv": ((4, 128), "uint8"),  # (roundup(3, 4), roundup(96, 128))
    }


def test_per_tensor_columnwise_is_transposed():
    call = QUANTIZE.plan(ArrayMeta((3, 5, 7), "float32"), te.Float8CurrentScalingQuantizer("e4m3", rowwise=False))
    assert _outputs(call) == {"columnwise_data": ((7, 15), "float8_e4m3fn"),
                              "columnwise_scale_inv": ((1,), "float32"), "amax": ((1,), "float32")}
    assert call.attr_dict()["rowwise"] == 0 and call.attr_dict()["columnwise"] == 1


def test_delayed_scaling_takes_the_scale_input():
    call = QUANTIZE.plan(ArrayMeta((4, 4), "float16"), te.Float8DelayedScalingQuantizer(), ArrayMeta((1,), "float32"))
    assert call.op == "quantize_fp8_delayed" and call.inputs == ("x", "scale")


def test_update_shapes_follow_the_state():
    call = UPDATE_DELAYED_SCALING.plan(ArrayMeta((16, 3), "float32"), ArrayMeta((3,), "float32"), "e5m2", 1, "max")
    assert _outputs(call) == {"amax_history": ((16, 3), "float32"), "scale": ((3,), "float32")}
    with pytest.raises(ValueError, match=r"scale must have shape \(3,\)"):
        UPDATE_DELAYED_SCALING.plan(ArrayMeta((16, 3), "float32"), ArrayMeta((1,), "float32"), "e5m2")


def test_dequantize_rejects_a_non_quantized_tensor():
    with pytest.raises(TypeError, match="expected a twinengine QuantizedTensor"):
        DEQUANTIZE.plan(object(), "float32")


@pytest.mark.parametrize("shape,match", [((), "rank >= 1"), ((0, 32), "must not be empty"),
                                          ((40, 32), "divisible by 32")])
def test_quantize_shape_errors(shape, match):
    with pytest.raises(ValueError, match=match):
        QUANTIZE.plan(ArrayMeta(shape, "float32"), te.MXFP8Quantizer())


def test_canonical_dtype_names():
    import ml_dtypes
    import numpy as np

    from twinengine.dtypes import canonical_dtype

    assert [canonical_dtype(d) for d in ("float32", np.float16, np.dtype("float32"), ml_dtypes.bfloat16,
                                         ml_dtypes.float8_e4m3fn, np.float64)] == [
        "float32", "float16", "float32", "bfloat16", "float8_e4m3fn", "float64"]

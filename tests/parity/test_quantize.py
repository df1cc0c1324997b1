"""The same NumPy input through both frontends: identical bytes and identical error text."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_quantized_equal, fields_as_numpy, make_input, to_torch
from quantize_cases import DELAYED_SCALE, case_id, cases, scale_for

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep

DTYPES = ["float32", "bfloat16", "float16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["mixed_scales", "nan_inf", "subnormal"])
@pytest.mark.parametrize("q,shape", cases(), ids=case_id)
def test_quantize_bytes_identical_across_frameworks(q, shape, family, dtype):
    x = make_input(family, shape, dtype, seed=7)
    scale = scale_for(q)
    qt_torch = tep.quantize(to_torch(x), q, scale=None if scale is None else torch.from_numpy(scale))
    qt_jax = jax.jit(tej.quantize, static_argnums=1)(jnp.asarray(x), q, scale=None if scale is None else jnp.asarray(scale))
    assert_quantized_equal(fields_as_numpy(qt_torch), fields_as_numpy(qt_jax), f"torch vs jax {case_id(q)}")


def _error(fn):
    with pytest.raises((TypeError, ValueError)) as info:
        fn()
    return info.type, str(info.value)


BAD_INPUTS = {
    "mxfp8_rows": (np.zeros((48, 64), np.float32), te.MXFP8Quantizer(), None),
    "mxfp8_cols": (np.zeros((2, 32, 40), np.float32), te.MXFP8Quantizer(), None),
    "rank0": (np.zeros((), np.float32), te.Float8CurrentScalingQuantizer(), None),
    "empty": (np.zeros((0, 32), np.float32), te.MXFP8Quantizer(), None),
    "float64": (np.zeros((32, 32), np.float64), te.MXFP8Quantizer(), None),
    "int32": (np.zeros((32, 32), np.int32), te.Float8CurrentScalingQuantizer(), None),
    "missing_scale": (np.zeros((4, 4), np.float32), te.Float8DelayedScalingQuantizer(), None),
    "unexpected_scale": (np.zeros((4, 4), np.float32), te.Float8CurrentScalingQuantizer(), DELAYED_SCALE),
    "scale_shape": (np.zeros((4, 4), np.float32), te.Float8DelayedScalingQuantizer(), np.ones(2, np.float32)),
    "not_a_quantizer": (np.zeros((4, 4), np.float32), "mxfp8", None),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_quantize_bad_input_same_error_in_both_frameworks(name):
    x, q, scale = BAD_INPUTS[name]
    torch_scale = None if scale is None else torch.from_numpy(scale)
    jax_scale = None if scale is None else jnp.asarray(scale)
    torch_error = _error(lambda: tep.quantize(torch.from_numpy(x), q, scale=torch_scale))
    with jax.enable_x64(x.dtype == np.float64):  # without x64, JAX would silently narrow float64
        jax_error = _error(lambda: tej.quantize(jnp.asarray(x), q, scale=jax_scale))
    assert torch_error == jax_error
    assert torch_error[1].startswith("twinengine.quantize: ")


def test_dequantize_missing_usage_same_error_in_both_frameworks():
    q = te.MXFP8Quantizer(columnwise=False)
    x = make_input("normal_1", (32, 32), "float32")
    torch_error = _error(lambda: tep.dequantize(tep.quantize(to_torch(x), q), torch.float32, columnwise=True))
    jax_error = _error(lambda: tej.dequantize(tej.quantize(jnp.asarray(x), q), jnp.float32, columnwise=True))
    assert torch_error == jax_error
    assert "no columnwise copy" in torch_error[1]

"""twinengine.jax.make_empty + quantize_into: core layouts, reference bytes, the donated
buffers reused for the result, the same error text as torch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_quantized_equal, fields_as_numpy, make_input
from quantize_block_cases import RNG_STATE
from quantize_block_cases import reference_quantize as block_reference
from quantize_cases import DELAYED_SCALE, case_id
from quantize_cases import reference_quantize as per_tensor_reference

import twinengine as te
import twinengine.jax as tej
from twinengine.quantized_tensor import ARRAY_FIELDS

QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3"),
    te.Float8DelayedScalingQuantizer("e5m2", columnwise=False),
    te.MXFP8Quantizer("e4m3"),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
]
SHAPE = (128, 256)


def _extras(q):
    return {"scale": jnp.asarray(DELAYED_SCALE) if q.scaling_mode == "fp8_delayed" else None,
            "rng": jnp.asarray(RNG_STATE) if getattr(q, "stochastic_rounding", False) else None}


def _reference(x, q):
    if q.scaling_mode in ("fp8_block", "nvfp4"):
        return block_reference(x, q, RNG_STATE if getattr(q, "stochastic_rounding", False) else None)
    return per_tensor_reference(x, q)


def _arrays(qt):
    return {name: getattr(qt, name) for name in ARRAY_FIELDS if getattr(qt, name) is not None}


@pytest.mark.parametrize("q", QUANTIZERS, ids=case_id)
def test_make_empty_has_the_layout_quantize_gives(q):
    out = tej.make_empty(q, SHAPE, jnp.bfloat16, jax.devices("cpu")[0])
    got = tej.quantize(jnp.ones(SHAPE, jnp.bfloat16), q, **_extras(q))
    assert all(a.devices() == {jax.devices("cpu")[0]} for a in _arrays(out).values())
    assert {k: (v.shape, v.dtype) for k, v in _arrays(out).items()} == \
        {k: (v.shape, v.dtype) for k, v in _arrays(got).items()}
    assert all(not np.asarray(v).view(np.uint8).any() for v in _arrays(out).values())
    assert (out.quantizer, out.shape, out.dtype) == (got.quantizer, got.shape, got.dtype)


@pytest.mark.parametrize("q", QUANTIZERS, ids=case_id)
def test_quantize_into_reuses_the_donated_buffers(q):
    out = tej.make_empty(q, SHAPE, jnp.bfloat16)
    for seed in (0, 1):
        pointers = {name: a.unsafe_buffer_pointer() for name, a in _arrays(out).items()}
        x = make_input("mixed_scales", SHAPE, "bfloat16", seed=seed)
        new = tej.quantize_into(out, jnp.asarray(x), **_extras(q))
        assert all(a.is_deleted() for a in _arrays(out).values())
        assert {name: a.unsafe_buffer_pointer() for name, a in _arrays(new).items()} == pointers
        assert_quantized_equal(fields_as_numpy(new), _reference(x, q), f"{case_id(q)} seed {seed}")
        out = new


def test_quantize_into_same_errors_as_torch():
    import torch

    import twinengine.pytorch as tep

    q = te.Float8CurrentScalingQuantizer()
    for x_shape, x_dtype in (((64, 32), "float32"), ((32, 64), "bfloat16")):
        with pytest.raises(ValueError) as jax_error:
            tej.quantize_into(tej.make_empty(q, (32, 64)), jnp.zeros(x_shape, x_dtype))
        with pytest.raises(ValueError) as torch_error:
            tep.quantize_(tep.make_empty(q, (32, 64)), torch.zeros(x_shape, dtype=getattr(torch, x_dtype)))
        assert str(jax_error.value) == str(torch_error.value)
        assert str(jax_error.value).startswith("twinengine.quantize_: out was made for an input of shape (32, 64)")

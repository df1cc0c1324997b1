"""The default NVFP4BlockScaling() runs fp32 and fp16 models: RHT off for non-bf16 operands
(bytes exactly those of disable_rht=True), RHT on for bf16; torch Linear == JAX dense."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, from_torch

import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine import recipe as R
from twinengine.linear import linear_quantizers

DTYPES = {"float32": (torch.float32, jnp.float32), "float16": (torch.float16, jnp.float16),
          "bfloat16": (torch.bfloat16, jnp.bfloat16)}
RNG = np.random.default_rng(4)
X = RNG.standard_normal((64, 64)).astype(np.float32)
W = (RNG.standard_normal((32, 64)) * 0.1).astype(np.float32)


def _torch(recipe, dtype):
    layer = tep.Linear(64, 32, bias=False, params_dtype=dtype, rng_seed=3)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(W))
    x = torch.from_numpy(X).to(dtype).requires_grad_()
    with tep.autocast(recipe):
        y = layer(x)
    y.float().sum().backward()
    return [y, x.grad, layer.weight.grad]


def _jax(recipe, dtype):
    def loss(x, k):
        y = tej.dense(x, k, recipe=recipe, rng=jnp.array([3, 0], jnp.int32))
        return y.astype(jnp.float32).sum(), y

    (dx, dk), y = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(jnp.asarray(X, dtype),
                                                                          jnp.asarray(W.T, dtype))
    return [y, dx, dk.T]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_default_nvfp4_runs_every_dtype_with_defined_bytes(dtype):
    torch_dtype, jax_dtype = DTYPES[dtype]
    default = _torch(R.NVFP4BlockScaling(), torch_dtype)
    no_rht = _torch(R.NVFP4BlockScaling(disable_rht=True), torch_dtype)
    jitted = _jax(R.NVFP4BlockScaling(), jax_dtype)
    for name, d, n, j in zip(("y", "dx", "dw"), default, no_rht, jitted):
        assert_bytes_equal(np.asarray(j).view(np.uint8), from_torch(d).view(np.uint8), f"{dtype} {name}: jax vs torch")
        if dtype != "bfloat16":
            assert_bytes_equal(from_torch(d), from_torch(n), f"{dtype} {name}: default == disable_rht")
    if dtype == "bfloat16":  # the RHT is on for bf16: the gradient dw (columnwise copies) differs
        assert not np.array_equal(from_torch(default[2]), from_torch(no_rht[2]))


def test_rht_choice_is_per_dtype():
    r = R.NVFP4BlockScaling()
    assert linear_quantizers(r, "bfloat16").input.with_rht and linear_quantizers(r, "bfloat16").grad_output.with_rht
    for dtype in ("float32", "float16"):
        qs = linear_quantizers(r, dtype)
        assert not qs.input.with_rht and not qs.grad_output.with_rht and qs.grad_output.stochastic_rounding

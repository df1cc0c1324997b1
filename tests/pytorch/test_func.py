"""torch.func over twinengine: grad / functional_call over Linear for every recipe (the same
gradients and buffer updates as eager autograd), vmap over quantize / dequantize (each element
on its own, as jax.vmap)."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, from_torch
from torch.func import functional_call, grad

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine import recipe as R

RECIPES = {
    "high_precision": (None, torch.float32),
    "mxfp8": (R.MXFP8BlockScaling(), torch.float32),
    "fp8_current": (R.Float8CurrentScaling(), torch.float32),
    "delayed": (R.DelayedScaling(amax_history_len=4), torch.float32),
    "fp8_block": (R.Float8BlockScaling(), torch.float32),
    "nvfp4": (R.NVFP4BlockScaling(), torch.bfloat16),
    "nvfp4_no_rht": (R.NVFP4BlockScaling(disable_rht=True), torch.float32),
    "custom": (R.CustomRecipe(lambda role: te.Float8CurrentScalingQuantizer(
        "e5m2" if role == "grad_output" else "e4m3")), torch.float32),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_func_grad_over_functional_call_matches_eager(name):
    recipe, dtype = RECIPES[name]
    torch.manual_seed(0)
    layer = tep.Linear(128, 128, params_dtype=dtype, amax_history_len=4)
    reference = copy.deepcopy(layer)
    xs = [torch.randn(2, 64, 128, dtype=dtype) * (1 + step) for step in range(2)]

    def loss(params, buffers, x):
        with tep.autocast(recipe, enabled=recipe is not None):
            return functional_call(layer, {**params, **buffers}, (x,)).float().sum()

    params = {k: v.detach() for k, v in layer.named_parameters()}
    buffers = dict(layer.named_buffers())  # passed as inputs: the in-place state updates land here
    for x in xs:
        grads = grad(loss)(params, buffers, x)
        reference.zero_grad()
        with tep.autocast(recipe, enabled=recipe is not None):
            reference(x).float().sum().backward()
        for k in params:
            assert_bytes_equal(from_torch(grads[k]), from_torch(getattr(reference, k).grad), f"{name} d{k}")
        for k, b in reference.named_buffers():
            assert_bytes_equal(from_torch(buffers[k]), from_torch(b), f"{name} buffer {k}")
    if name == "delayed":
        assert float(buffers["bwd_scale"][0]) != 1.0
    if name == "nvfp4":
        assert buffers["rng_state"].tolist() == [0, 2]


def test_func_grad_in_eval_mode_mutates_nothing_without_stateful_recipe():
    layer = tep.Linear(64, 64)
    x = torch.randn(32, 64)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    buffers = {k: v.clone() for k, v in layer.named_buffers()}

    def loss(p):  # buffers captured, not inputs: fine as long as nothing mutates them
        with tep.autocast(R.MXFP8BlockScaling()):
            return functional_call(layer, {**p, **buffers}, (x,)).sum()

    g = grad(loss)(params)
    assert g["weight"].shape == (64, 64)
    for k, b in layer.named_buffers():
        assert torch.equal(buffers[k], b)


QUANTIZERS = [te.MXFP8Quantizer("e4m3"), te.Float8CurrentScalingQuantizer("e4m3"), te.NVFP4Quantizer(),
              te.Float8BlockQuantizer("e4m3", block_scaling_dim=1)]


@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: q.scaling_mode)
def test_vmap_quantize_dequantize_is_per_element_and_matches_jax(q):
    rows = 128 if q.scaling_mode == "fp8_block" else 32
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((3, rows, 128)).astype(np.float32))

    def roundtrip(v):
        qt = tep.quantize(v, q)
        return tep.dequantize(qt, torch.float32), qt.rowwise_data, qt.rowwise_scale_inv

    batched = torch.func.vmap(roundtrip)(x)
    loop = [torch.stack(column) for column in zip(*[roundtrip(v) for v in x])]
    jax_batched = jax.vmap(lambda v: (lambda qt: (tej.dequantize(qt, jnp.float32), qt.rowwise_data,
                                                  qt.rowwise_scale_inv))(tej.quantize(v, q)))(jnp.asarray(x.numpy()))
    for i, (b, l, j) in enumerate(zip(batched, loop, jax_batched)):
        assert_bytes_equal(from_torch(b), from_torch(l), f"output {i}: vmap vs loop")
        assert_bytes_equal(from_torch(b).view(np.uint8), np.asarray(j).view(np.uint8), f"output {i}: torch vs jax")

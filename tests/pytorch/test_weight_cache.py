"""FP8 weight caching: tep.Linear(..., is_first_microbatch=True/False) quantizes its weight once
per optimizer step and reuses that copy (bytes identical to re-quantizing), with fewer quantize
calls; gradients still reach the high-precision weight."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch

import twinengine as te
import twinengine.pytorch as tep
from twinengine.linear import linear_quantizers


class _CountQuantize:
    """Counts quantize kernel launches: every quantize call the Linear makes goes through the
    `quantize` function of these two modules (the eager fast path launches prepared kernels
    without _C.call, so the count is taken at the function; the module's weight cache and the
    backward's dy quantize through twinengine.pytorch.distributed, which reduces amaxes over a
    group when there is one)."""

    _MODULES = ("twinengine.pytorch._ops.linear", "twinengine.pytorch.distributed")

    def __init__(self):
        self.calls = 0
        self._saved = {}

    def __enter__(self):
        import importlib

        for name in self._MODULES:
            module = importlib.import_module(name)
            original = module.quantize
            self._saved[name] = (module, original)

            def counted(*args, _original=original, **kwargs):
                self.calls += 1
                return _original(*args, **kwargs)

            module.quantize = counted
        return self

    def __exit__(self, *exc):
        for module, original in self._saved.values():
            module.quantize = original


RECIPES = {
    "current": te.recipe.Float8CurrentScaling(),
    "mxfp8": te.recipe.MXFP8BlockScaling(),
    "block": te.recipe.Float8BlockScaling(),
    "delayed": te.recipe.DelayedScaling(amax_history_len=4),
}


def _layer(seed=0):
    torch.manual_seed(seed)
    return tep.Linear(128, 128, amax_history_len=4, params_dtype=torch.bfloat16)


def _step(layer, recipe, flags, seed=1):
    """Micro-batches with the given is_first_microbatch flags; returns (outputs, dx's, quantize calls)."""
    g = torch.Generator().manual_seed(seed)
    outs, grads = [], []
    with _CountQuantize() as counter, tep.autocast(recipe):
        for flag in flags:
            x = torch.randn(128, 128, generator=g).to(torch.bfloat16).requires_grad_(True)
            y = layer(x, is_first_microbatch=flag)
            (y.float() * torch.randn(128, 128, generator=g)).sum().backward()
            outs.append(from_torch(y.detach()))
            grads.append(from_torch(x.grad))
    return outs, grads, counter.calls


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_weight_is_quantized_once_per_step_and_reused(name):
    recipe = RECIPES[name]
    cached, plain = _layer(), _layer()
    weight_scale = cached.fwd_scale[1:2].clone()
    outs, grads, calls = _step(cached, recipe, [True, False, False])
    _, _, plain_calls = _step(plain, recipe, [None, None, None])
    assert (calls, plain_calls) == (3 * 2 + 1, 3 * 3)  # x and dy per micro-batch; the weight once vs each time
    q = linear_quantizers(recipe, "bfloat16").weight
    requantized = tep.quantize(cached.weight.detach(), q, scale=weight_scale if name == "delayed" else None)
    assert_quantized_equal(fields_as_numpy(cached.fp8_weight_cache), fields_as_numpy(requantized), "cache")
    if name != "delayed":  # delayed scaling moves the weight scale after every forward: TE keeps the first one
        plain_outs, plain_grads, _ = _step(_layer(), recipe, [None, None, None])
        for i, (a, b, c, d) in enumerate(zip(outs, plain_outs, grads, plain_grads)):
            assert_bytes_equal(a, b, f"y of micro-batch {i}")
            assert_bytes_equal(c, d, f"dx of micro-batch {i}")
        assert_bytes_equal(from_torch(cached.weight.grad), from_torch(plain.weight.grad), "accumulated dw")
    assert cached.weight.grad is not None and cached.weight.grad.abs().sum() > 0


def test_first_microbatch_requantizes_after_an_optimizer_step():
    layer = _layer()
    recipe = RECIPES["mxfp8"]
    _step(layer, recipe, [True, False])
    before = fields_as_numpy(layer.fp8_weight_cache)
    torch.optim.SGD(layer.parameters(), lr=10.0).step()
    _, _, calls = _step(layer, recipe, [False])
    assert calls == 2 and all((fields_as_numpy(layer.fp8_weight_cache)[k] == v).all() for k, v in before.items())
    _, _, calls = _step(layer, recipe, [True])
    assert calls == 3
    q = linear_quantizers(recipe, "bfloat16").weight
    assert_quantized_equal(fields_as_numpy(layer.fp8_weight_cache), fields_as_numpy(tep.quantize(layer.weight.detach(), q)),
                           "cache after the step")


def test_cache_follows_the_recipe_and_skips_nvfp4():
    layer = _layer()
    _step(layer, RECIPES["current"], [True])
    _, _, calls = _step(layer, RECIPES["mxfp8"], [False])  # made by another quantizer: remade once
    assert calls == 3 and layer.fp8_weight_cache.quantizer == linear_quantizers(RECIPES["mxfp8"]).weight
    nvfp4 = _layer()
    _, _, calls = _step(nvfp4, te.recipe.NVFP4BlockScaling(), [True, False])
    assert calls == 2 * 3 and "fp8_weight_cache" not in nvfp4.__dict__


def test_weight_cache_compiled_matches_eager():
    recipe = RECIPES["mxfp8"]
    eager, compiled_layer = _layer(), _layer()

    def run(layer, x, first):
        with tep.autocast(recipe):
            return layer(x, is_first_microbatch=first)

    compiled = torch.compile(run, fullgraph=True)
    x = torch.randn(128, 128, dtype=torch.bfloat16)
    for first in (True, False):
        assert_bytes_equal(from_torch(compiled(compiled_layer, x, first)), from_torch(run(eager, x, first)),
                           f"is_first_microbatch={first}")
    assert_quantized_equal(fields_as_numpy(compiled_layer.fp8_weight_cache), fields_as_numpy(eager.fp8_weight_cache),
                           "compiled cache")

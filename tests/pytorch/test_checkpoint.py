"""torch.utils.checkpoint over twinengine.pytorch.Linear: outputs, gradients and every buffer
(amax histories, scales, rng_state) byte-identical to the run without checkpointing — every
recipe, reentrant and non-reentrant, autocast inside and outside the checkpointed function,
eager and compiled. The state advances once per forward and the rng is drawn once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, from_torch
from torch.utils.checkpoint import checkpoint

import twinengine as te
import twinengine.pytorch as tep
from twinengine import recipe as R

RECIPES = {
    "high_precision": (None, torch.float32),
    "mxfp8": (R.MXFP8BlockScaling(), torch.float32),
    "fp8_current": (R.Float8CurrentScaling(), torch.float32),
    "delayed": (R.DelayedScaling(amax_history_len=3), torch.float32),
    "fp8_block": (R.Float8BlockScaling(), torch.float32),
    "nvfp4": (R.NVFP4BlockScaling(), torch.bfloat16),
    "custom": (R.CustomRecipe(lambda role: te.Float8CurrentScalingQuantizer(
        "e5m2" if role == "grad_output" else "e4m3")), torch.float32),
}
STEPS = 2


class Model(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.a = tep.Linear(128, 128, params_dtype=dtype, amax_history_len=3, rng_seed=5)
        self.b = tep.Linear(128, 128, params_dtype=dtype, amax_history_len=3, rng_seed=9)

    def block(self, x):
        return self.b(torch.relu(self.a(x)))


def _body(model, x, recipe, mode, autocast_inside):
    def inner(v):
        if autocast_inside:
            with tep.autocast(recipe, enabled=recipe is not None):
                return model.block(v)
        return model.block(v)

    if mode == "plain":
        return inner(x)
    return checkpoint(inner, x, use_reentrant=mode == "reentrant")


def _step(model, x, recipe, mode, autocast_inside):
    if autocast_inside:
        y = _body(model, x, recipe, mode, True)
    else:
        with tep.autocast(recipe, enabled=recipe is not None):
            y = _body(model, x, recipe, mode, False)
    return y


def _run(name, mode, autocast_inside, step_fn=_step):
    recipe, dtype = RECIPES[name]
    model = Model(dtype)
    out = []
    for i in range(STEPS):
        model.zero_grad()
        x = torch.from_numpy(np.random.default_rng(i).standard_normal((2, 64, 128)).astype(np.float32) * (1 + i))
        x = x.to(dtype).requires_grad_()
        y = step_fn(model, x, recipe, mode, autocast_inside)
        (y.float() * torch.linspace(-1, 2, 128)).sum().backward()
        out.append([y.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
                   + [b.clone() for b in model.buffers()])
    return out


def _assert_same(actual, expected, what):
    for step, (a_step, e_step) in enumerate(zip(actual, expected)):
        for i, (a, e) in enumerate(zip(a_step, e_step)):
            assert_bytes_equal(from_torch(a), from_torch(e), f"{what}: step {step} tensor {i}")


@pytest.mark.parametrize("autocast_inside", [True, False], ids=["autocast_inside", "autocast_outside"])
@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_checkpoint_eager_same_bytes_as_plain(name, mode, autocast_inside):
    plain = _run(name, "plain", autocast_inside)
    _assert_same(_run(name, mode, autocast_inside), plain, f"{name} {mode}")
    if name == "nvfp4":  # one draw per forward: two steps advance each layer's offset to 2
        assert plain[-1][-1].tolist() == [9, 2]


_FULLGRAPH_STEP = torch.compile(_step, fullgraph=True, backend="aot_eager")
_COMPILED_STEP = torch.compile(_step, backend="aot_eager")


@pytest.mark.parametrize("name", ["high_precision", "mxfp8", "fp8_block"])
def test_checkpoint_compiled_fullgraph_stateless_recipes(name):
    torch._dynamo.reset()
    plain = _run(name, "plain", False)
    _assert_same(_run(name, "non_reentrant", False, _FULLGRAPH_STEP), plain, f"{name} compiled fullgraph")


@pytest.mark.parametrize("autocast_inside", [True, False], ids=["autocast_inside", "autocast_outside"])
@pytest.mark.parametrize("name", ["delayed", "nvfp4", "mxfp8"])
def test_checkpoint_compiled_same_bytes_as_plain(name, autocast_inside):
    # Stateful recipes, or a region entered inside the checkpointed function, are side effects
    # Dynamo cannot replay in a compiled recompute: it graph-breaks there and the region runs as
    # eager checkpointing (exact replay); fullgraph=True raises instead (next test).
    torch._dynamo.reset()
    plain = _run(name, "plain", autocast_inside)
    _assert_same(_run(name, "non_reentrant", autocast_inside, _COMPILED_STEP), plain, f"{name} compiled")


@pytest.mark.parametrize("name,autocast_inside", [("delayed", False), ("nvfp4", False), ("mxfp8", True)])
def test_checkpoint_compiled_fullgraph_stateful_raises_not_wrong(name, autocast_inside):
    for _ in range(2):  # also once the marker already holds its value
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported, match="HOP: Unsafe side effect"):
            _run(name, "non_reentrant", autocast_inside, _FULLGRAPH_STEP)


def test_recompute_without_a_recorded_forward_says_why():
    layer = tep.Linear(32, 32)
    x = torch.randn(32, 32, requires_grad=True)
    y = torch.relu(x)

    class Recompute(torch.autograd.Function):  # a forward inside a backward that no checkpoint recorded
        @staticmethod
        def forward(ctx, v):
            return v.clone()

        @staticmethod
        def backward(ctx, g):
            with torch.enable_grad():
                layer(torch.ones(32, 32))
            return g

    with pytest.raises(RuntimeError, match="twinengine.pytorch.Linear: a forward ran inside a backward pass"):
        Recompute.apply(y).sum().backward()


def test_an_earlier_no_grad_forward_of_the_same_input_does_not_shadow_the_checkpointed_call():
    # evaluate on the batch (no grad: recorded, never recomputed), then train on it checkpointed
    recipe = R.DelayedScaling(amax_history_len=3)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32))

    def run(checkpointed):
        model = Model(torch.float32)
        with torch.no_grad(), tep.autocast(recipe):
            model.block(x * 4)  # moves the scales
        xi = x.clone().requires_grad_()
        with tep.autocast(recipe):
            with torch.no_grad():
                model.block(xi)  # the same input, not checkpointed: its record must not be replayed
            y = checkpoint(model.block, xi, use_reentrant=False) if checkpointed else model.block(xi)
        y.sum().backward()
        return [xi.grad] + [p.grad for p in model.parameters()] + list(model.buffers())

    for a, b in zip(run(True), run(False)):
        assert_bytes_equal(from_torch(a), from_torch(b), "checkpointed vs plain")

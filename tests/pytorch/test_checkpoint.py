"""torch.utils.checkpoint over twinengine.pytorch modules (Linear, LayerNormMLP, Sequential,
DotProductAttention dropout): outputs, gradients and every buffer (amax histories, scales,
rng_state) byte-identical to the run without checkpointing — every recipe, reentrant and
non-reentrant, autocast inside and outside the checkpointed function, eager and compiled. The
state advances once per forward and the rng is drawn once.

Compiled with fullgraph=True, stateful recipes need Dynamo's
``skip_fwd_side_effects_in_bwd_under_checkpoint`` flag (the state writes are side effects it
then applies once); without it Dynamo raises (fullgraph) or graph-breaks to eager
checkpointing (exact)."""

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


class MLPModel(torch.nn.Module):
    """A fusible-ops module (LayerNormMLP) and a Linear: the Sequential record/replay path."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.mlp = tep.LayerNormMLP(128, 256, activation="swiglu", normalization="RMSNorm", params_dtype=dtype,
                                    amax_history_len=3)
        self.b = tep.Linear(128, 128, params_dtype=dtype, amax_history_len=3, rng_seed=9)

    def block(self, x):
        return self.b(self.mlp(x))


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


def _run(name, mode, autocast_inside, step_fn=_step, model_cls=Model):
    recipe, dtype = RECIPES[name]
    model = model_cls(dtype)
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


@pytest.mark.parametrize("name,autocast_inside,owner", [("delayed", False, "Linear"), ("nvfp4", False, "Linear"),
                                                        ("mxfp8", True, "autocast")])
def test_checkpoint_compiled_fullgraph_stateful_raises_our_error_not_wrong(name, autocast_inside, owner):
    # Without Dynamo's side-effect flag the state writes (or the region entered inside) cannot
    # be applied once: the compiled code raises our RuntimeError naming the flag instead.
    for _ in range(2):  # also with the graph cached
        torch._dynamo.reset()
        with pytest.raises(RuntimeError, match=rf"twinengine.pytorch.{owner}: .*skip_fwd_side_effects_in_bwd_under_checkpoint = True"):
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


# ---- fusible-ops modules (Sequential record/replay) ---------------------------------------

@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
@pytest.mark.parametrize("name", ["delayed", "nvfp4", "mxfp8", "fp8_current"])
def test_checkpoint_layernorm_mlp_eager_same_bytes_as_plain(name, mode):
    for autocast_inside in (True, False):
        plain = _run(name, "plain", autocast_inside, model_cls=MLPModel)
        _assert_same(_run(name, mode, autocast_inside, model_cls=MLPModel), plain, f"LayerNormMLP {name} {mode}")


# ---- compiled, fullgraph, with Dynamo's side-effect flag: stateful recipes ----------------

@pytest.mark.parametrize("model_cls", [Model, MLPModel], ids=["linear", "layernorm_mlp"])
@pytest.mark.parametrize("name,autocast_inside", [("delayed", False), ("nvfp4", False), ("delayed", True),
                                                  ("mxfp8", True)])
def test_checkpoint_compiled_fullgraph_stateful_with_side_effect_flag(name, autocast_inside, model_cls):
    # The state writes inside the compiled region are attribute rebinds (_state.py) that Dynamo
    # applies once; the recompute is the traced graph, which read the state as inputs.
    torch._dynamo.reset()
    plain = _run(name, "plain", autocast_inside, model_cls=model_cls)
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        compiled = _run(name, "non_reentrant", autocast_inside, _FULLGRAPH_STEP, model_cls=model_cls)
    _assert_same(compiled, plain, f"{model_cls.__name__} {name} compiled fullgraph + flag")


def test_checkpoint_compiled_fullgraph_inductor_delayed_with_side_effect_flag():
    torch._dynamo.reset()
    step = torch.compile(_step, fullgraph=True)
    plain = _run("delayed", "plain", False)
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        _assert_same(_run("delayed", "non_reentrant", False, step), plain, "delayed inductor fullgraph + flag")


# ---- DotProductAttention dropout ------------------------------------------------------------

def _attention_run(mode, compiled=False):
    torch.manual_seed(3)
    mod = tep.DotProductAttention(2, 16, attention_dropout=0.25, seed=11)
    q, k, v = (torch.randn(2, 12, 2, 16, requires_grad=True) for _ in range(3))

    def body(a, b, c):
        return mod(a, b, c) * 1.5

    def step(a, b, c):
        return body(a, b, c) if mode == "plain" else checkpoint(body, a, b, c, use_reentrant=mode == "reentrant")

    fn = torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step
    out = []
    for _ in range(STEPS):
        for t in (q, k, v):
            t.grad = None
        y = fn(q, k, v)
        (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
        out.append([y.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone(), mod.rng_state.clone()])
    return out


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpoint_attention_dropout_eager_same_bytes_as_plain(mode):
    plain = _attention_run("plain")
    assert plain[-1][-1].tolist() == [11, STEPS]
    _assert_same(_attention_run(mode), plain, f"attention dropout {mode}")


def test_checkpoint_attention_dropout_compiled_fullgraph_without_flag_raises_our_error():
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="twinengine.pytorch.DotProductAttention: this module writes its state"):
        _attention_run("non_reentrant", compiled=True)


def test_checkpoint_attention_dropout_compiled_with_side_effect_flag():
    torch._dynamo.reset()
    plain = _attention_run("plain")
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        _assert_same(_attention_run("non_reentrant", compiled=True), plain, "attention dropout compiled + flag")


# ---- GroupedLinear ----------------------------------------------------------------------------

class GroupedModel(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.a = tep.GroupedLinear(3, 128, 128, params_dtype=dtype, amax_history_len=3)
        self.b = tep.Linear(128, 128, params_dtype=dtype, amax_history_len=3, rng_seed=9)
        self.register_buffer("m_splits", torch.tensor([64, 0, 64]), persistent=False)

    def block(self, x):
        return self.b(torch.relu(self.a(x.reshape(-1, 128), self.m_splits))).reshape(x.shape)


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
@pytest.mark.parametrize("name", ["delayed", "mxfp8", "fp8_current", "nvfp4", "high_precision"])
def test_checkpoint_grouped_linear_eager_same_bytes_as_plain(name, mode):
    for autocast_inside in (True, False):
        plain = _run(name, "plain", autocast_inside, model_cls=GroupedModel)
        _assert_same(_run(name, mode, autocast_inside, model_cls=GroupedModel), plain, f"GroupedLinear {name} {mode}")


def test_checkpoint_grouped_linear_compiled_fullgraph_delayed_with_side_effect_flag():
    torch._dynamo.reset()
    plain = _run("delayed", "plain", False, model_cls=GroupedModel)
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        compiled = _run("delayed", "non_reentrant", False, _FULLGRAPH_STEP, model_cls=GroupedModel)
    _assert_same(compiled, plain, "GroupedLinear delayed compiled fullgraph + flag")

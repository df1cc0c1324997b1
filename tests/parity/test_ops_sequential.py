"""torch == JAX bytes for the fusible ops and the blocks built on them: the same op list and
parameters give identical outputs, input / parameter gradients and delayed-scaling state."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine.jax import ops as jops
from twinengine.pytorch import ops as tops
from helpers import assert_bytes_equal, from_torch, to_torch
from ops_cases import EXTRA_INPUTS, HIDDEN, RECIPES, ROWS, dtype_for, op_lists


def _np(x):
    return from_torch(x) if isinstance(x, torch.Tensor) else np.asarray(x)


def _inputs(case, dtype):
    rng = np.random.default_rng(3)
    shape = (2, ROWS // 2, HIDDEN)
    cast = lambda a: a.astype(jnp.dtype(dtype))  # noqa: E731
    x = cast(rng.standard_normal(shape, np.float32))
    extras = [cast(rng.standard_normal(shape, np.float32)) for _ in range(EXTRA_INPUTS[case])]
    dy = cast(rng.standard_normal(shape, np.float32))
    return x, extras, dy


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("case", ["rmsnorm_mlp", "layernorm_quantize", "residual", "linear_tails"])
def test_sequential_torch_matches_jax(recipe_name, case):
    recipe, dtype = RECIPES[recipe_name], dtype_for(recipe_name)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    torch.manual_seed(0)
    tseq = tops.Sequential(*op_lists(tops)[case]).to(torch_dtype)
    with torch.no_grad():
        for p in tseq.parameters():
            p.uniform_(-0.5, 0.5)
    x, extras, dy = _inputs(case, dtype)
    rng_before = [op.rng_state.clone() for op in tseq.basic_ops if isinstance(op, tops.BasicLinear)]
    xt = to_torch(x).requires_grad_(True)
    et = [to_torch(e).requires_grad_(True) for e in extras]
    with tep.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext():
        out = tseq(xt, *et)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward(outs, [to_torch(dy)] + [torch.ones_like(o) for o in outs[1:]])

    jseq = jops.Sequential(*op_lists(jops)[case])
    params = tuple(tuple(jnp.asarray(_np(p)) for p in op.op_params()) for op in tseq.basic_ops)
    delayed = isinstance(recipe, te.recipe.DelayedScaling)
    state = jseq.init_state(recipe) if delayed else None
    rngs = None
    if recipe is not None and te.linear.linear_quantizers(recipe).needs_rng:
        it = iter(rng_before)
        rngs = tuple(jnp.asarray(_np(next(it))) if isinstance(op, jops.BasicLinear) else None for op in jseq.basic_ops)

    def loss(x, params, extras, state):
        out = jseq(x, params, *extras, state=state, rngs=rngs, recipe=recipe)
        if delayed:
            out, new_state = out
        else:
            new_state = None
        outs = out if isinstance(out, tuple) else (out,)
        total = jnp.sum(outs[0].astype(jnp.float32) * jnp.asarray(dy).astype(jnp.float32))
        return total + sum(jnp.sum(o.astype(jnp.float32)) for o in outs[1:]), (outs, new_state)

    (_, (jouts, fwd_state)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(
        jnp.asarray(x), params, tuple(jnp.asarray(e) for e in extras), state)
    gx, gparams, gextras, gstate = grads
    for i, (t, j) in enumerate(zip(outs, jouts)):
        assert_bytes_equal(_np(t.detach()), _np(j), f"output {i}")
    assert_bytes_equal(_np(xt.grad), _np(gx), "dx")
    for i, (t, j) in enumerate(zip(et, gextras)):
        assert_bytes_equal(_np(t.grad), _np(j), f"d extra {i}")
    tgrads = [p.grad for op in tseq.basic_ops for p in op.op_params()]
    jgrads = [g for op_grads in gparams for g in op_grads]
    for i, (t, j) in enumerate(zip(tgrads, jgrads)):
        assert_bytes_equal(_np(t), _np(j), f"dparam {i}")
    if delayed:
        linears = [op for op in tseq.basic_ops if isinstance(op, tops.BasicLinear)]
        jstates = [fwd_state[i] for i, op in enumerate(jseq.basic_ops) if isinstance(op, jops.BasicLinear)]
        jnext = [gstate[i] for i, op in enumerate(jseq.basic_ops) if isinstance(op, jops.BasicLinear)]
        for op, fs, ns in zip(linears, jstates, jnext):
            assert_bytes_equal(_np(op.fwd_amax_history), _np(fs["fwd_amax_history"]), "fwd history")
            assert_bytes_equal(_np(op.fwd_scale), _np(fs["fwd_scale"]), "fwd scale")
            assert_bytes_equal(_np(op.bwd_amax_history), _np(ns["bwd_amax_history"]), "bwd history")
            assert_bytes_equal(_np(op.bwd_scale), _np(ns["bwd_scale"]), "bwd scale")


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_layernorm_mlp_module_torch_matches_jax_blocks(recipe_name):
    recipe, dtype = RECIPES[recipe_name], dtype_for(recipe_name)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    torch.manual_seed(0)
    module = tep.LayerNormMLP(HIDDEN, 128, activation="geglu", params_dtype=torch_dtype, amax_history_len=4)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.5, 0.5)
    rngs = {"fc1": jnp.asarray(_np(module.basic_ops[1].rng_state)),
            "fc2": jnp.asarray(_np(module.basic_ops[4].rng_state))}
    x, _, dy = _inputs("rmsnorm_mlp", dtype)
    xt = to_torch(x).requires_grad_(True)
    with tep.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext():
        y = module(xt)
    y.backward(to_torch(dy))
    params = tej.params_from_torch(module.state_dict())
    delayed = isinstance(recipe, te.recipe.DelayedScaling)
    state = {"fc1": tej.delayed_scaling_state(4), "fc2": tej.delayed_scaling_state(4)} if delayed else None

    def loss(x, params):
        out = tej.layernorm_mlp(x, params, activation="geglu", state=state, rngs=rngs, recipe=recipe)
        out = out[0] if delayed else out
        return jnp.sum(out.astype(jnp.float32) * jnp.asarray(dy).astype(jnp.float32)), out

    (_, yj), (gx, gp) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(jnp.asarray(x), params)
    assert_bytes_equal(_np(y.detach()), _np(yj), "y")
    assert_bytes_equal(_np(xt.grad), _np(gx), "dx")
    for name, p in module.named_parameters():
        assert_bytes_equal(_np(p.grad), _np(gp[name]), f"d{name}")
    back = tej.params_to_torch(params)
    for name, p in module.named_parameters():
        assert_bytes_equal(_np(back[name]), _np(p.detach()), f"round trip {name}")


def _error(fn):
    try:
        fn()
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    raise AssertionError("no error raised")


def test_bad_input_errors_have_the_same_type_and_text_in_both_frontends():
    x_t, x_j = torch.randn(4, 8), jnp.ones((4, 8))
    odd_t, odd_j = torch.randn(4, 7), jnp.ones((4, 7))
    cases = {
        "empty sequential": (lambda: tops.Sequential(), lambda: jops.Sequential()),
        "dropout p": (lambda: tops.Dropout(1.5), lambda: jops.Dropout(1.5)),
        "negative eps": (lambda: tops.RMSNorm(8, eps=-1.0), lambda: jops.RMSNorm(8, eps=-1.0)),
        "features": (lambda: tops.BasicLinear(0, 4), lambda: jops.BasicLinear(0, 4)),
        "normalized shape": (lambda: tops.Sequential(tops.RMSNorm(16))(x_t),
                             lambda: jops.Sequential(jops.RMSNorm(16))(x_j, ((jnp.ones(16),),))),
        "odd gated": (lambda: tops.Sequential(tops.SwiGLU())(odd_t), lambda: jops.Sequential(jops.SwiGLU())(odd_j, ((),))),
        "both apis": (lambda: type("Both", (tops.BasicOperation,), {"op_forward": 0, "op_forward_compute": 0,
                                                                     "op_backward": 0}),
                      lambda: type("Both", (jops.BasicOperation,), {"op_forward": 0, "op_forward_compute": 0,
                                                                     "op_backward": 0})),
        "quantized into gelu": (
            lambda: tops.Sequential(tops.GELU())(tep.quantize(torch.ones(32, 32), te.MXFP8Quantizer())),
            lambda: jops.Sequential(jops.GELU())(tej.quantize(jnp.ones((32, 32)), te.MXFP8Quantizer()), ((),))),
        "normalization": (lambda: tep.LayerNormMLP(8, 8, normalization="BatchNorm"),
                          lambda: tej.layernorm_mlp(x_j, {"layer_norm_weight": jnp.ones(8), "fc1_weight": jnp.ones((8, 8)),
                                                          "fc2_weight": jnp.ones((8, 8))}, normalization="BatchNorm")),
        "activation": (lambda: tep.LayerNormMLP(8, 8, activation="tanh"),
                       lambda: tej.layernorm_mlp(x_j, {"layer_norm_weight": jnp.ones(8), "layer_norm_bias": jnp.ones(8),
                                                       "fc1_weight": jnp.ones((8, 8)), "fc2_weight": jnp.ones((8, 8))},
                                                 activation="tanh")),
    }
    for name, (torch_case, jax_case) in cases.items():
        assert _error(torch_case) == _error(jax_case), name


def test_zero_rows_and_vmap_of_block_functions():
    params = {"layer_norm_weight": jnp.ones(16), "layer_norm_bias": jnp.zeros(16), "fc1_weight": jnp.ones((32, 16)),
              "fc1_bias": jnp.zeros(32), "fc2_weight": jnp.ones((16, 16)), "fc2_bias": jnp.zeros(16)}
    out = tej.layernorm_mlp(jnp.zeros((0, 16)), params, activation="swiglu")
    assert out.shape == (0, 16)
    g = jax.grad(lambda p: jnp.sum(tej.layernorm_mlp(jnp.zeros((0, 16)), p, activation="swiglu")))(params)
    assert all(float(jnp.abs(v).max()) == 0.0 for v in g.values())
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 4, 16), np.float32))
    batched = jax.vmap(lambda v: tej.layernorm_mlp(v, params, activation="swiglu"))(x)
    for i in range(3):
        assert_bytes_equal(np.asarray(batched[i]), np.asarray(tej.layernorm_mlp(x[i], params, activation="swiglu")),
                           f"vmap {i}")


@pytest.mark.parametrize("recipe_name", ["high_precision", "fp8_delayed", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_layernorm_linear_torch_matches_jax_layernorm_dense(recipe_name, normalization):
    recipe, dtype = RECIPES[recipe_name], dtype_for(recipe_name)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    torch.manual_seed(0)
    module = tep.LayerNormLinear(HIDDEN, HIDDEN, normalization=normalization, return_layernorm_output=True,
                                 bias=recipe_name != "mxfp8", params_dtype=torch_dtype, amax_history_len=4)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.5, 0.5)
    linear = next(op for op in module.basic_ops if isinstance(op, tops.BasicLinear))
    rngs = {"linear": jnp.asarray(_np(linear.rng_state))}
    x, _, dy = _inputs("rmsnorm_mlp", dtype)
    xt = to_torch(x).requires_grad_(True)
    with tep.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext():
        y, ln_out = module(xt)
    torch.autograd.backward([y, ln_out], [to_torch(dy), torch.ones_like(ln_out)])
    params = tej.params_from_torch(module.state_dict())
    delayed = isinstance(recipe, te.recipe.DelayedScaling)
    state = {"linear": tej.delayed_scaling_state(4)} if delayed else None

    def loss(x, params):
        out = tej.layernorm_dense(x, params, normalization=normalization, return_layernorm_output=True, state=state,
                                  rngs=rngs, recipe=recipe)
        (yj, lnj) = out[0] if delayed else out
        total = jnp.sum(yj.astype(jnp.float32) * jnp.asarray(dy).astype(jnp.float32))
        return total + jnp.sum(lnj.astype(jnp.float32)), (yj, lnj)

    (_, (yj, lnj)), (gx, gp) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(jnp.asarray(x), params)
    assert_bytes_equal(_np(y.detach()), _np(yj), "y")
    assert_bytes_equal(_np(ln_out.detach()), _np(lnj), "ln_out")
    assert_bytes_equal(_np(xt.grad), _np(gx), "dx")
    for name, p in module.named_parameters():
        assert_bytes_equal(_np(p.grad), _np(gp[name]), f"d{name}")


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_linear_module_ops_linear_and_dense_give_the_same_bytes(recipe_name):
    """NUMERICS §11: tep.Linear, ops.Linear (BasicLinear + Bias) and tej.dense round the GEMM output to
    x's dtype, then add the bias, and reduce the bias gradient with Σc — identical bytes (bf16 here)."""
    recipe = RECIPES[recipe_name]
    torch.manual_seed(0)
    layer = tep.Linear(HIDDEN, HIDDEN, params_dtype=torch.bfloat16, amax_history_len=4)
    op_linear = tops.Linear(HIDDEN, HIDDEN, dtype=torch.bfloat16, amax_history_len=4)
    with torch.no_grad():
        layer.bias.uniform_(-1, 1)
        op_linear.basic_ops[0].weight.copy_(layer.weight)
        op_linear.basic_ops[1].bias.copy_(layer.bias)
    x, _, dy = _inputs("rmsnorm_mlp", "bfloat16")
    results = []
    for module in (layer, op_linear):
        xt = to_torch(x).requires_grad_(True)
        with tep.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext():
            y = module(xt)
        y.backward(to_torch(dy))
        results.append([y.detach(), xt.grad] + [p.grad for p in module.parameters()])
    for i, (a, b) in enumerate(zip(*results)):
        assert_bytes_equal(_np(a), _np(b), f"tep.Linear vs ops.Linear item {i}")
    delayed = isinstance(recipe, te.recipe.DelayedScaling)
    rng = jnp.asarray([0, 0], jnp.int32)

    def loss(x, kernel, bias):
        out = tej.dense(x, kernel, bias, recipe=recipe, state=tej.delayed_scaling_state(4) if delayed else None,
                        rng=rng if recipe is not None and te.linear.linear_quantizers(recipe).needs_rng else None)
        out = out[0] if delayed else out
        return jnp.sum(out.astype(jnp.float32) * jnp.asarray(dy).astype(jnp.float32)), out

    (_, yj), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
        jnp.asarray(x), jnp.asarray(_np(layer.weight.detach())).T, jnp.asarray(_np(layer.bias.detach())))
    assert_bytes_equal(_np(results[0][0]), _np(yj), "dense y")
    assert_bytes_equal(_np(results[0][1]), _np(grads[0]), "dense dx")
    assert_bytes_equal(_np(results[0][3]), _np(grads[2]), "dense dbias")


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_zero_rows_work_under_every_recipe(recipe_name):
    """Zero-row inputs give empty outputs and zero gradients, quantized or not, in both frontends;
    DelayedScaling state is left as it was (an all-zero amax marks the slot unused, NUMERICS §3)."""
    recipe, dtype = RECIPES[recipe_name], dtype_for(recipe_name)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    torch.manual_seed(0)
    module = tep.LayerNormMLP(HIDDEN, 128, activation="swiglu", params_dtype=torch_dtype, amax_history_len=4)
    buffers = [b.clone() for b in module.buffers() if b.dtype == torch.float32]
    x = torch.zeros(0, HIDDEN, dtype=torch_dtype, requires_grad=True)
    with tep.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext():
        y = module(x)
    assert y.shape == (0, HIDDEN)
    y.sum().backward()
    assert x.grad.shape == (0, HIDDEN)
    assert all(int(torch.count_nonzero(p.grad)) == 0 for p in module.parameters())
    assert all(torch.equal(a, b) for a, b in zip(buffers, [b for b in module.buffers() if b.dtype == torch.float32]))
    params = tej.params_from_torch(module.state_dict())
    delayed = isinstance(recipe, te.recipe.DelayedScaling)
    state = {"fc1": tej.delayed_scaling_state(4), "fc2": tej.delayed_scaling_state(4)} if delayed else None
    rngs = {"fc1": jnp.asarray([0, 0], jnp.int32), "fc2": jnp.asarray([1, 0], jnp.int32)}

    def loss(params, state):
        out = tej.layernorm_mlp(jnp.zeros((0, HIDDEN), dtype), params, activation="swiglu", state=state, rngs=rngs,
                                recipe=recipe)
        out = out[0] if delayed else out
        return jnp.sum(out.astype(jnp.float32))

    grads, next_state = jax.grad(loss, argnums=(0, 1))(params, state)
    assert all(float(jnp.abs(g.astype(jnp.float32)).max()) == 0.0 for g in grads.values())
    if delayed:
        for name in ("fc1", "fc2"):
            for key, value in state[name].items():
                assert_bytes_equal(_np(next_state[name][key]), _np(value), f"{name} {key}")


@pytest.mark.parametrize("frontend", ["torch", "jax"])
def test_quantize_op_hands_the_linear_its_own_quantized_input(frontend):
    """Quantize() before a BasicLinear under a recipe quantizes exactly as the Linear would: the
    Linear receives a QuantizedTensor (fused with a norm or standalone) and the bytes match a plain
    norm -> Linear."""
    ops = tops if frontend == "torch" else jops
    received = []

    class Spy(ops.BasicLinear):
        def op_forward_compute(self, x, params, **kwargs):
            received.append(type(x).__name__)
            return super().op_forward_compute(x, params, **kwargs)

    recipe = RECIPES["mxfp8"]
    x, _, _ = _inputs("rmsnorm_mlp", "float32")
    for lead in ([ops.LayerNorm(HIDDEN), ops.Quantize()], [ops.Quantize()]):
        received.clear()
        seq = ops.Sequential(*lead, Spy(HIDDEN, HIDDEN))
        if frontend == "torch":
            with tep.autocast(recipe=recipe):
                seq(to_torch(x))
        else:
            params = seq.init(jax.random.PRNGKey(0), jnp.float32)
            seq(jnp.asarray(x), params, recipe=recipe)
        assert received == ["QuantizedTensor"], (lead, received)


def test_quantized_input_to_a_torch_sequential_and_nested_modules():
    quantized = tep.quantize(torch.randn(64, 64), te.MXFP8Quantizer())
    linear = tops.BasicLinear(64, 64)
    with tep.autocast(recipe=RECIPES["mxfp8"]):
        y = tops.Sequential(linear)(quantized)
    y.sum().backward()
    assert linear.weight.grad is not None and linear.weight.grad.shape == (64, 64)
    for bad in (lambda: tops.Sequential(tep.LayerNormMLP(16, 16)), lambda: jops.Sequential(object())):
        with pytest.raises(TypeError, match="twinengine.Sequential: ops must be twinengine basic operations"):
            bad()


def test_jax_legacy_user_op_context_attributes_reach_the_backward():
    class Triple(jops.BasicOperation):
        def op_forward(self, ctx, x, params, **kwargs):
            ctx.factor = 3.0
            return x * 3.0

        def op_backward(self, ctx, dy):
            return dy * ctx.factor, ()

    g = jax.grad(lambda x: jnp.sum(jops.Sequential(Triple())(x, ((),))))(jnp.ones((2, 4)))
    assert float(g[0, 0]) == 3.0

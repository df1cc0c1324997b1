"""twinengine.jax.ops: Sequential of basic ops under jit / grad / vmap, fused == unfused bytes,
user ops, block functions and Flax modules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import twinengine as te
import twinengine.jax as tej
from twinengine.jax import ops
from ops_cases import EXTRA_INPUTS, HIDDEN, RECIPES, ROWS, dtype_for, op_lists


def _params(seq, dtype, seed=0):
    params = seq.init(jax.random.PRNGKey(seed), dtype)
    key = jax.random.PRNGKey(seed + 1)
    out = []
    for op_params in params:
        new = []
        for p in op_params:
            key, sub = jax.random.split(key)
            new.append(jax.random.uniform(sub, p.shape, jnp.float32, -0.5, 0.5).astype(p.dtype))
        out.append(tuple(new))
    return tuple(out)


def _rngs(seq, recipe):
    if recipe is None or not te.linear.linear_quantizers(recipe).needs_rng:
        return None
    return tuple(jnp.asarray([i, 0], jnp.uint32) if isinstance(op, ops.BasicLinear) else None
                 for i, op in enumerate(seq.basic_ops))


def _grads(seq, recipe, params, x, extras, dy):
    state = seq.init_state(recipe) if isinstance(recipe, te.recipe.DelayedScaling) else None
    rngs = _rngs(seq, recipe)

    def loss(x, params, extras, state):
        out = seq(x, params, *extras, state=state, rngs=rngs, recipe=recipe)
        if state is not None:
            out, _ = out
        y = out[0] if isinstance(out, tuple) else out
        rest = out[1:] if isinstance(out, tuple) else ()
        return jnp.sum(y.astype(jnp.float32) * dy) + sum(jnp.sum(r.astype(jnp.float32)) for r in rest), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(x, params, extras, state)


def _inputs(case, dtype):
    rng = np.random.default_rng(1)
    shape = (2, ROWS // 2, HIDDEN)
    x = jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype)
    extras = tuple(jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype) for _ in range(EXTRA_INPUTS[case]))
    dy = jnp.asarray(rng.standard_normal(shape, np.float32))
    return x, extras, dy


def _leaves_equal(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for u, v in zip(la, lb):
        u, v = np.asarray(u), np.asarray(v)
        assert u.shape == v.shape and u.dtype == v.dtype
        assert u.tobytes() == v.tobytes()


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("case", ["rmsnorm_mlp", "layernorm_quantize", "residual", "linear_tails"])
def test_sequential_fused_matches_unfused_bytes(recipe_name, case):
    recipe, dtype = RECIPES[recipe_name], jnp.dtype(dtype_for(recipe_name))
    x, extras, dy = _inputs(case, dtype)
    fused = ops.Sequential(*op_lists(ops)[case])
    unfused = ops.Sequential(*op_lists(ops)[case], fuse=False)
    params = _params(fused, dtype)
    _leaves_equal(_grads(fused, recipe, params, x, extras, dy), _grads(unfused, recipe, params, x, extras, dy))


def test_sequential_eager_matches_jit_and_vmap():
    seq = ops.Sequential(*op_lists(ops)["rmsnorm_mlp"])
    params = _params(seq, jnp.float32)
    x, _, _ = _inputs("rmsnorm_mlp", jnp.float32)
    recipe = RECIPES["mxfp8"]
    eager = seq(x, params, recipe=recipe)
    jitted = jax.jit(lambda x, p: seq(x, p, recipe=recipe))(x, params)
    _leaves_equal(eager, jitted)
    batched = jax.vmap(lambda x: seq(x, params, recipe=recipe))(x)
    _leaves_equal(batched, jnp.stack([seq(x[i], params, recipe=recipe) for i in range(x.shape[0])]))


def test_sequential_under_autocast_inside_jit():
    seq = ops.Sequential(*op_lists(ops)["rmsnorm_mlp"])
    params = _params(seq, jnp.float32)
    x, _, _ = _inputs("rmsnorm_mlp", jnp.float32)
    recipe = RECIPES["fp8_current"]

    @jax.jit
    def f(x, params):
        with tej.autocast(recipe):
            return seq(x, params)

    _leaves_equal(f(x, params), seq(x, params, recipe=recipe))
    assert "writes the quantized input" in seq.plan(recipe)[0]


class Scale2(ops.BasicOperation):
    def op_forward_compute(self, x, params, **kwargs):
        return x * 2, None

    def op_backward(self, ctx, dy):
        return dy * 2, ()


class Square(ops.BasicOperation):
    def op_forward(self, ctx, x, params, **kwargs):
        ctx.save_for_backward(x)
        return x * x

    def op_backward(self, ctx, dy):
        (x,) = ctx.saved_tensors
        return 2 * x * dy, ()


def test_user_ops_inside_jitted_sequential():
    seq = ops.Sequential(ops.RMSNorm(HIDDEN), Scale2(), Square(), ops.Linear(HIDDEN, HIDDEN))
    params = _params(seq, jnp.float32)
    x, _, _ = _inputs("rmsnorm_mlp", jnp.float32)
    recipe = RECIPES["mxfp8"]
    loss = lambda x, p: jnp.sum(seq(x, p, recipe=recipe))  # noqa: E731
    _leaves_equal(jax.grad(loss, argnums=(0, 1))(x, params), jax.jit(jax.grad(loss, argnums=(0, 1)))(x, params))
    inner = ops.Sequential(ops.RMSNorm(HIDDEN), ops.ConstantScale(2.0))(x, params[:1] + ((),))
    _leaves_equal(ops.Sequential(ops.RMSNorm(HIDDEN), Scale2(), Square())(x, params[:3]), inner * inner)
    with pytest.raises(TypeError, match="twinengine.ops: Both defines both"):
        type("Both", (ops.BasicOperation,), {"op_forward": lambda *a: None, "op_forward_compute": lambda *a: None,
                                             "op_backward": lambda *a: None})


def test_bad_input_errors_match_torch_texts():
    with pytest.raises(ValueError, match="twinengine.Sequential: needs at least one basic operation"):
        ops.Sequential()
    with pytest.raises(ValueError, match=r"twinengine.Dropout: p must be a float in \[0, 1\)"):
        ops.Dropout(1.0)
    with pytest.raises(ValueError, match="twinengine.Dropout: training with p > 0 needs rng="):
        ops.Sequential(ops.Dropout(0.1))(jnp.ones((4, 4)), ((),))
    with pytest.raises(ValueError, match="must be even"):
        ops.Sequential(ops.SwiGLU())(jnp.ones((4, 7)), ((),))
    quantized = tej.quantize(jnp.ones((32, 32)), te.MXFP8Quantizer())
    with pytest.raises(TypeError, match="twinengine.GELU: received a QuantizedTensor"):
        ops.Sequential(ops.GELU())(quantized, ((),))


def test_dropout_needs_rng_and_is_identity_in_eval():
    seq = ops.Sequential(ops.Dropout(0.5))
    x = jnp.ones((8, 64))
    y = seq(x, ((),), rngs=(jnp.asarray([7, 0], jnp.uint32),))
    kept = np.asarray(y) != 0
    assert np.all(np.asarray(y)[kept] == 2.0) and 0 < kept.mean() < 1
    _leaves_equal(seq(x, ((),), training=False), x)


def test_block_functions_and_flax_modules():
    flax_mods = pytest.importorskip("twinengine.jax.flax")
    x, _, _ = _inputs("rmsnorm_mlp", jnp.float32)
    mlp = flax_mods.LayerNormMLP(intermediate_dim=64, activation="swiglu", normalization="RMSNorm")
    variables = mlp.init(jax.random.PRNGKey(0), x)
    params = variables["params"]
    assert sorted(params) == ["fc1_bias", "fc1_weight", "fc2_bias", "fc2_weight", "layer_norm_weight"]
    assert params["fc1_weight"].shape == (128, HIDDEN)
    y = mlp.apply(variables, x)
    _leaves_equal(y, tej.layernorm_mlp(x, params, normalization="RMSNorm", activation="swiglu"))
    ln = flax_mods.LayerNormDenseGeneral(features=32, return_layernorm_output=True)
    v = ln.init(jax.random.PRNGKey(1), x)
    out, ln_out = ln.apply(v, x)
    _leaves_equal(ln_out, flax_mods.LayerNorm().apply({"params": {"weight": v["params"]["layer_norm_weight"],
                                                                    "bias": v["params"]["layer_norm_bias"]}}, x))


def test_flax_delayed_scaling_state_updates_through_mutable_apply():
    flax_mods = pytest.importorskip("twinengine.jax.flax")
    x, _, _ = _inputs("rmsnorm_mlp", jnp.float32)
    recipe = te.recipe.DelayedScaling(amax_history_len=4)
    mlp = flax_mods.LayerNormMLP(intermediate_dim=64, recipe=recipe)
    variables = mlp.init(jax.random.PRNGKey(0), x)
    state0 = variables["fp8_meta"]
    y, updated = mlp.apply(variables, x, mutable=["fp8_meta"])
    new = updated["fp8_meta"]
    history0, history1 = np.asarray(state0["fc1"]["fwd_amax_history"]), np.asarray(new["fc1"]["fwd_amax_history"])
    assert history0[-1, 0] > 0 and history0[-2, 0] == 0  # init ran one forward
    assert history1[-2, 0] == history0[-1, 0] and history1[-1, 0] > 0  # the apply rolled the history once more


def test_sequential_under_checkpoint_and_scan():
    seq = ops.Sequential(*op_lists(ops)["rmsnorm_mlp"])
    params = _params(seq, jnp.float32)
    x, _, _ = _inputs("rmsnorm_mlp", jnp.float32)
    recipe = RECIPES["mxfp8"]
    loss = lambda p, x: jnp.sum(seq(x, p, recipe=recipe))  # noqa: E731
    plain = jax.grad(loss)(params, x)
    _leaves_equal(jax.jit(jax.grad(jax.checkpoint(loss)))(params, x), plain)

    def scanned(p, x):
        def body(h, _):
            return seq(h, p, recipe=recipe), None
        return jnp.sum(jax.lax.scan(body, x, None, length=2)[0])

    def unrolled(p, x):
        return jnp.sum(seq(seq(x, p, recipe=recipe), p, recipe=recipe))

    _leaves_equal(jax.jit(jax.grad(scanned))(params, x), jax.grad(unrolled)(params, x))

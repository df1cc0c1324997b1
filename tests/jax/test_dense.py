"""twinengine.jax.dense / autocast: jit, grad, vmap, DelayedScaling state, recipe staleness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import twinengine.jax as tj
from twinengine import recipe as R

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 32, 64)).astype(np.float32)
KERNEL = (RNG.standard_normal((64, 32)) * 0.1).astype(np.float32)
BIAS = RNG.standard_normal(32).astype(np.float32)
GW = np.linspace(-2, 1, 32).astype(np.float32)


def _loss(x, kernel, bias, recipe):
    with tj.autocast(recipe, enabled=recipe is not None):
        y = tj.dense(x, kernel, bias)
    return (y * GW).sum()


@pytest.mark.parametrize("recipe", [None, R.MXFP8BlockScaling(), R.Float8CurrentScaling()],
                         ids=["high_precision", "mxfp8", "fp8_current"])
def test_dense_jit_grad_matches_eager(recipe):
    grad = jax.grad(_loss, argnums=(0, 1, 2))
    eager = grad(X, KERNEL, BIAS, recipe)
    jitted = jax.jit(grad, static_argnums=3)(X, KERNEL, BIAS, recipe)
    for e, j in zip(eager, jitted):
        assert np.array_equal(np.asarray(e), np.asarray(j))


def test_dense_high_precision_matches_float64():
    y = np.asarray(tj.dense(X, KERNEL, BIAS)).astype(np.float64)
    ref = X.astype(np.float64) @ KERNEL.astype(np.float64) + BIAS
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_dense_vmap_matches_loop():
    f = jax.vmap(lambda x: tj.dense(x, KERNEL, BIAS, recipe=R.MXFP8BlockScaling()))
    out = f(X)
    for i in range(X.shape[0]):
        assert np.array_equal(np.asarray(out[i]), np.asarray(tj.dense(X[i], KERNEL, BIAS, recipe=R.MXFP8BlockScaling())))


def test_dense_delayed_scaling_state_from_forward_and_backward():
    recipe = R.DelayedScaling(amax_history_len=4, margin=1)

    def loss(x, kernel, state):
        with tj.autocast(recipe):
            y, fwd_state = tj.dense(x, kernel, state=state)
        return (y * GW).sum(), fwd_state

    step = jax.jit(jax.grad(loss, argnums=2, has_aux=True))
    state = tj.delayed_scaling_state(4)
    next_state, fwd_state = step(X, KERNEL, state)
    amax_x, amax_w, amax_dy = np.abs(X).max(), np.abs(KERNEL).max(), np.abs(GW).max()
    assert np.array_equal(next_state["fwd_amax_history"][-1], [amax_x, amax_w])
    assert np.array_equal(next_state["bwd_amax_history"][-1], [amax_dy])
    assert np.array_equal(next_state["fwd_scale"], np.float32(224.0) / np.array([amax_x, amax_w], np.float32))
    assert np.array_equal(next_state["bwd_scale"], [np.float32(28672.0) / amax_dy])
    for name in ("fwd_amax_history", "fwd_scale"):
        assert np.array_equal(fwd_state[name], next_state[name])
    assert np.array_equal(fwd_state["bwd_scale"], state["bwd_scale"])


def test_autocast_around_jit_never_keeps_a_stale_recipe():
    # The region is part of JAX's cache key: the same jitted function re-traces per recipe.
    f = jax.jit(lambda x: tj.dense(x, KERNEL, BIAS))
    outs = []
    for recipe in (R.MXFP8BlockScaling(), R.Float8CurrentScaling(), R.MXFP8BlockScaling(), None):
        with tj.autocast(recipe, enabled=recipe is not None):
            outs.append(np.asarray(f(X)))
        assert np.array_equal(outs[-1], np.asarray(tj.dense(X, KERNEL, BIAS, recipe=recipe)))
    assert not np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[1], outs[3])
    assert np.array_equal(np.asarray(f(X)), outs[3])  # outside any region: high precision again


def test_autocast_inside_jit_follows_the_recipe_argument():
    # The recipe enters the trace as a static argument: a new recipe is a new trace.
    def forward(x, recipe):
        with tj.autocast(recipe, enabled=recipe is not None):
            return tj.dense(x, KERNEL, BIAS)

    f = jax.jit(forward, static_argnums=1)
    outs = []
    for recipe in (R.MXFP8BlockScaling(), R.Float8CurrentScaling(), None):
        outs.append(np.asarray(f(X, recipe)))
        assert np.array_equal(outs[-1], np.asarray(tj.dense(X, KERNEL, BIAS, recipe=recipe)))
    assert not np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[1], outs[2])


def test_dense_delayed_scaling_without_state_raises():
    with pytest.raises(ValueError, match="twinengine.linear: DelayedScaling needs the layer.s delayed-scaling state"):
        tj.dense(X, KERNEL, recipe=R.DelayedScaling())


def test_autocast_rejects_missing_recipe():
    with pytest.raises(TypeError, match="twinengine.autocast: enabled=True needs recipe="):
        tj.autocast()

"""twinengine.jax.flax.Dense: same bytes as dense, state in a collection, an optax training step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn
import optax
import pytest
from helpers import assert_bytes_equal

import twinengine.jax as tej
from twinengine import recipe
from twinengine.jax.flax import FP8_META, Dense

RECIPES = {
    "mxfp8": recipe.MXFP8BlockScaling(),
    "delayed": recipe.DelayedScaling(amax_history_len=4),
    "nvfp4": recipe.NVFP4BlockScaling(),
}


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((32, 64)).astype(np.float32), jnp.bfloat16)
    return x, jnp.asarray(rng.standard_normal((32, 32)).astype(np.float32), jnp.bfloat16)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_flax_dense_matches_dense(name):
    r = RECIPES[name]
    x, _ = _inputs()
    model = Dense(32, recipe=r)
    rng = jnp.array([7, 3], jnp.uint32)
    variables = model.init(jax.random.key(0), x, rng)
    y = jax.jit(lambda v, x: model.apply(v, x, rng))(variables, x)
    kernel, bias = variables["params"]["kernel"], variables["params"]["bias"]
    if name == "delayed":
        expected, _ = tej.dense(x, kernel.astype(x.dtype), bias.astype(x.dtype), recipe=r,
                                state=variables[FP8_META]["delayed_scaling"], rng=rng)
    else:
        expected = tej.dense(x, kernel.astype(x.dtype), bias.astype(x.dtype), recipe=r, rng=rng)
    assert_bytes_equal(np.asarray(y), np.asarray(expected), f"flax Dense {name}")


def test_flax_dense_uses_the_autocast_recipe():
    x, _ = _inputs()
    model = Dense(32)
    variables = model.init(jax.random.key(0), x)

    @jax.jit
    def under_autocast(v, x):
        with tej.autocast(RECIPES["mxfp8"]):
            return model.apply(v, x)

    explicit = Dense(32, recipe=RECIPES["mxfp8"]).apply(variables, x)
    assert_bytes_equal(np.asarray(under_autocast(variables, x)), np.asarray(explicit), "autocast recipe")
    assert not np.array_equal(np.asarray(model.apply(variables, x)), np.asarray(explicit))  # no recipe: high precision


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_flax_dense_trains_with_optax(name):
    r = RECIPES[name]

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return Dense(32, recipe=r)(nn.relu(Dense(64, recipe=r)(x)))

    x, target = _inputs(1)
    model = Model()
    variables = model.init({"params": jax.random.key(0), "stochastic_rounding": jax.random.key(1)}, x)
    params, fp8_meta = variables["params"], variables.get(FP8_META, {})
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, fp8_meta, opt_state, key):
        def loss_fn(params, fp8_meta):
            y = model.apply({"params": params, FP8_META: fp8_meta}, x, rngs={"stochastic_rounding": key})
            return jnp.mean((y.astype(jnp.float32) - target.astype(jnp.float32)) ** 2)

        loss, (grads, next_fp8_meta) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, fp8_meta)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), next_fp8_meta, opt_state, loss

    losses = []
    for i in range(30):
        params, fp8_meta, opt_state, loss = step(params, fp8_meta, opt_state, jax.random.key(100 + i))
        losses.append(float(loss))
    assert np.isfinite(losses).all() and losses[-1] < 0.7 * losses[0], losses
    if name == "delayed":
        state = fp8_meta["Dense_0"]["delayed_scaling"]
        assert float(state["fwd_amax_history"].max()) > 0 and float(state["bwd_amax_history"].max()) > 0
        assert not np.array_equal(np.asarray(state["fwd_scale"]), np.ones(2, np.float32))

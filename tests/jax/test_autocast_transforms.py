"""twinengine.jax.autocast entered inside a jitted function reaches dense under every JAX / Flax
transformation (checkpoint, remat, scan, nn.scan, cond, fori_loop, while_loop, nested jit),
with the bytes of an explicit recipe= call, and never reuses a program traced under another
recipe."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_bytes_equal
from jax import lax

import twinengine.jax as tej
from twinengine import recipe as R
from twinengine.jax.flax import Dense

RNG = np.random.default_rng(3)
X = jnp.asarray(RNG.standard_normal((64, 64)).astype(np.float32))
KERNEL = jnp.asarray((RNG.standard_normal((64, 64)) * 0.1).astype(np.float32))
MX, FP8 = R.MXFP8BlockScaling(), R.Float8CurrentScaling()


def _dense(x):
    return tej.dense(x, KERNEL)


@jax.jit
def _nested_jit_dense(x):
    return _dense(x)


TRANSFORMS = {
    "checkpoint": lambda x: jax.checkpoint(_dense)(x),
    "checkpoint_policy": lambda x: jax.checkpoint(_dense, policy=jax.checkpoint_policies.nothing_saveable)(x),
    "scan": lambda x: lax.scan(lambda c, _: (_dense(c), None), x, None, length=2)[0],
    "cond": lambda x: lax.cond(x[0, 0] > -1e9, _dense, lambda v: v, x),
    "switch": lambda x: lax.switch(1, [lambda v: v, _dense], x),
    "fori_loop": lambda x: lax.fori_loop(0, 2, lambda i, c: _dense(c), x),
    "while_loop": lambda x: lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, _dense(c[1])), (0, x))[1],
    "nested_jit": _nested_jit_dense,
    "vmap": lambda x: jax.vmap(_dense)(x.reshape(2, 32, 64)).reshape(64, 64),
}
REPEAT = {"scan": 2, "fori_loop": 2, "while_loop": 2}


def _expected(recipe, name):
    if name == "vmap":  # each batch element is quantized on its own
        return np.concatenate([np.asarray(tej.dense(h, KERNEL, recipe=recipe)) for h in (X[:32], X[32:])])
    y = X
    for _ in range(REPEAT.get(name, 1)):
        y = tej.dense(y, KERNEL, recipe=recipe)
    return np.asarray(y)


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_autocast_inside_jit_flows_into_transformation(name):
    transform = TRANSFORMS[name]

    @jax.jit
    def f(x):
        with tej.autocast(MX):
            a = transform(x)
        with tej.autocast(FP8):
            b = transform(x)
        return a, b, transform(x)  # the last call: outside any region, high precision

    a, b, c = f(X)
    assert_bytes_equal(np.asarray(a), _expected(MX, name), f"{name} under MXFP8")
    assert_bytes_equal(np.asarray(b), _expected(FP8, name), f"{name} under FP8 current scaling")
    assert_bytes_equal(np.asarray(c), _expected(None, name), f"{name} without a region")
    assert not np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name", ["checkpoint", "scan", "nested_jit"])
def test_gradients_through_transformation_match_explicit_recipe(name):
    transform = TRANSFORMS[name]

    def loss(x):
        with tej.autocast(MX):
            return transform(x).sum()

    def explicit(x):
        y = x
        for _ in range(REPEAT.get(name, 1)):
            y = tej.dense(y, KERNEL, recipe=MX)
        return y.sum()

    assert_bytes_equal(np.asarray(jax.jit(jax.grad(loss))(X)), np.asarray(jax.jit(jax.grad(explicit))(X)), name)


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        return Dense(64)(x), None


class _Stack(nn.Module):
    kind: str

    @nn.compact
    def __call__(self, x):
        if self.kind == "remat":
            return nn.remat(Dense)(64)(x)
        scanned = nn.scan(_Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
        return scanned()(x, None)[0]


@pytest.mark.parametrize("kind", ["remat", "scan"])
def test_flax_lifted_transformations_see_the_region(kind):
    model = _Stack(kind)
    variables = model.init(jax.random.key(0), X)

    @jax.jit
    def f(variables, x):
        with tej.autocast(MX):
            quantized = model.apply(variables, x)
        return quantized, model.apply(variables, x)

    quantized, plain = f(variables, X)
    kernels = jax.tree.leaves(variables["params"])  # (bias, kernel) per Dense, stacked by nn.scan

    def by_hand(recipe):
        params = variables["params"]
        if kind == "remat":
            p = params["CheckpointDense_0"]
            return tej.dense(X, p["kernel"], p["bias"], recipe=recipe)
        (block,) = params.values()
        p = block["Dense_0"]
        y = X
        for i in range(2):
            y = tej.dense(y, p["kernel"][i], p["bias"][i], recipe=recipe)
        return y

    assert kernels
    assert_bytes_equal(np.asarray(quantized), np.asarray(by_hand(MX)), f"nn.{kind} under MXFP8")
    assert_bytes_equal(np.asarray(plain), np.asarray(by_hand(None)), f"nn.{kind} without a region")


def test_region_around_a_jitted_call_retraces_per_recipe():
    traces = []

    @jax.jit
    def f(x):
        traces.append(1)
        return lax.scan(lambda c, _: (_dense(c), None), x, None, length=2)[0]

    outs = {}
    for recipe in (MX, FP8, MX, None):
        with tej.autocast(recipe, enabled=recipe is not None):
            outs.setdefault(recipe, []).append(np.asarray(f(X)))
        assert_bytes_equal(outs[recipe][-1], _expected(recipe, "scan"), f"around jit: {recipe}")
    assert len(traces) == 3  # MXFP8, FP8 current, high precision; the second MXFP8 call hits the cache

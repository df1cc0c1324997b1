"""Tensor-parallel dense / layernorm_mlp inside jax.shard_map (twinengine.jax.parallel):
column-parallel outputs and gradients are the unsharded bytes; row-parallel within the fp32
summation-order tolerance (NUMERICS.md §12); HLO has no all-gather; bad arguments refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import twinengine.jax as tej
from twinengine.jax import parallel
from twinengine.jax.sharding import amax_reduction
from twinengine.recipe import Float8CurrentScaling, MXFP8BlockScaling

from jax_distributed._mesh import HAVE_8, mesh, needs_8, run_in_subprocess

RECIPES = {"hp": None, "current": Float8CurrentScaling(), "mxfp8": MXFP8BlockScaling()}
# (mesh, x spec) — dp shards the batch (rows), tp the features
MESHES = {"tp8": P(None, None), "dp2tp4": P("dp", None)}


def _arrays(seed=0, m=64, k=256, n=256):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
    w = jnp.asarray((rng.standard_normal((k, n)) / 16).astype(np.float32))
    b = jnp.asarray(rng.standard_normal((n,)).astype(np.float32))
    return x, w, b


def _bytes(a):
    return np.asarray(a).view(np.uint32)


def _column_fn(m, xspec, recipe):
    dp = "dp" if "dp" in m.axis_names else None

    def local(x, w, b):
        with amax_reduction(m.axis_names):
            return parallel.dense(x, w, b, parallel_mode="column", tp_axis="tp", recipe=recipe)

    def loss(x, w, b):
        y = jax.shard_map(local, mesh=m, in_specs=(xspec, P(None, "tp"), P("tp")), out_specs=P(dp, "tp"), check_vma=False)(x, w, b)
        return jnp.sum(y * y), y

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def _row_fn(m, recipe):
    dp = "dp" if "dp" in m.axis_names else None

    def local(x, w, b):
        with amax_reduction(m.axis_names):
            return parallel.dense(x, w, b, parallel_mode="row", tp_axis="tp", recipe=recipe)

    def loss(x, w, b):
        y = jax.shard_map(local, mesh=m, in_specs=(P(dp, "tp"), P("tp", None), P()), out_specs=P(dp, None), check_vma=False)(x, w, b)
        return jnp.sum(y * y), y

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def _reference(x, w, b, recipe):
    def loss(x, w, b):
        y = tej.dense(x, w, b, recipe=recipe) if recipe is not None else tej.dense(x, w, b)
        return jnp.sum(y * y), y
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(x, w, b)


@needs_8
@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("rname", list(RECIPES))
def test_column_parallel_exact(mesh_name, rname):
    recipe = RECIPES[rname]
    x, w, b = _arrays()
    (_, y), grads = _column_fn(mesh(mesh_name), MESHES[mesh_name], recipe)(x, w, b)
    (_, y_ref), grads_ref = _reference(x, w, b, recipe)
    np.testing.assert_array_equal(_bytes(y), _bytes(y_ref))
    # dx sums over the tp shards of N (a psum): summation order differs. dw, db are shard-local
    # (exact) on tp8; with dp they are also summed over the dp shards of the batch.
    np.testing.assert_allclose(np.asarray(grads[0]), np.asarray(grads_ref[0]), rtol=1e-5, atol=1e-5)
    for g, g_ref in zip(grads[1:], grads_ref[1:]):
        if mesh_name == "tp8":
            np.testing.assert_array_equal(_bytes(g), _bytes(g_ref))
        else:
            np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-5, atol=1e-4)


@needs_8
@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("rname", list(RECIPES))
def test_row_parallel_within_summation_tolerance(mesh_name, rname):
    recipe = RECIPES[rname]
    x, w, b = _arrays(1)
    (_, y), grads = _row_fn(mesh(mesh_name), recipe)(x, w, b)
    (_, y_ref), grads_ref = _reference(x, w, b, recipe)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)
    for g, g_ref in zip(grads, grads_ref):
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-4, atol=1e-4)


@needs_8
def test_column_parallel_hlo_has_no_all_gather():
    m = mesh("dp2tp4")
    x, w, b = _arrays()
    args = [jax.device_put(a, NamedSharding(m, s)) for a, s in zip((x, w, b), (P("dp", None), P(None, "tp"),
                                                                               P("tp")))]

    def local(x, w, b):
        with amax_reduction(m.axis_names):
            return parallel.dense(x, w, b, parallel_mode="column", tp_axis="tp", recipe=Float8CurrentScaling())

    fn = jax.jit(jax.shard_map(local, mesh=m, in_specs=(P("dp", None), P(None, "tp"), P("tp")),
                               out_specs=P("dp", "tp")))
    hlo = fn.lower(*args).compile().as_text()
    assert "all-gather" not in hlo
    assert "all-reduce" in hlo


@needs_8
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_layernorm_mlp_tensor_parallel(activation):
    m = mesh("tp8")
    rng = np.random.default_rng(3)
    h, f = 128, 512
    f1 = 2 * f if activation == "swiglu" else f
    params = {"layer_norm_weight": jnp.asarray(rng.standard_normal(h).astype(np.float32)),
              "layer_norm_bias": jnp.asarray(rng.standard_normal(h).astype(np.float32)),
              "fc1_weight": jnp.asarray((rng.standard_normal((f1, h)) / 8).astype(np.float32)),
              "fc1_bias": jnp.asarray(rng.standard_normal(f1).astype(np.float32)),
              "fc2_weight": jnp.asarray((rng.standard_normal((h, f)) / 8).astype(np.float32)),
              "fc2_bias": jnp.asarray(rng.standard_normal(h).astype(np.float32))}
    specs = {"layer_norm_weight": P(), "layer_norm_bias": P(), "fc1_weight": P("tp", None), "fc1_bias": P("tp"),
             "fc2_weight": P(None, "tp"), "fc2_bias": P()}
    x = jnp.asarray(rng.standard_normal((64, h)).astype(np.float32))
    for recipe in (None, Float8CurrentScaling()):
        fn = jax.jit(jax.shard_map(lambda x, p: parallel.layernorm_mlp(x, p, tp_axis="tp", activation=activation,
                                                                       recipe=recipe),
                                   mesh=m, in_specs=(P(), specs), out_specs=P()))
        sharded = dict(params)
        if activation == "swiglu":
            for k in ("fc1_weight", "fc1_bias"):
                sharded[k] = parallel.gated_fc1_for_tp(params[k], 8)
        y = fn(x, sharded)
        y_ref = tej.layernorm_mlp(x, params, activation=activation, recipe=recipe)
        np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)


@needs_8
def test_bad_arguments():
    x, w, b = _arrays()
    with pytest.raises(ValueError, match="parallel_mode must be 'column' or 'row', got 'diag'"):
        parallel.dense(x, w, b, parallel_mode="diag", tp_axis="tp")
    with pytest.raises(ValueError, match="tp_axis"):
        parallel.dense(x, w, b, parallel_mode="row", tp_axis=None)
    with pytest.raises(ValueError, match="FC1 rows 6 are not 2 x a multiple of tp=4"):
        parallel.gated_fc1_for_tp(jnp.zeros((6, 4)), 4)


@pytest.mark.skipif(HAVE_8, reason="runs the file in a subprocess only when JAX here has < 8 devices")
def test_subprocess():
    run_in_subprocess(__file__)

"""MoE permutation shard-local along tokens inside jax.shard_map (each shard permutes its own
tokens: the bytes of the unsharded op on that shard's tokens), with gradients; Flax modules'
logical axis names map to mesh shardings."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import twinengine.jax as tej
from twinengine.jax.flax import Dense
from twinengine.jax.flax_blocks import LayerNormMLP

from jax_distributed._mesh import HAVE_8, mesh, needs_8, run_in_subprocess

T, H, E, TOPK = 64, 32, 4, 2


def _routing(seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((T, H)).astype(np.float32))
    idx = jnp.asarray(np.stack([rng.permutation(E)[:TOPK] for _ in range(T)]).astype(np.int32))
    probs = jnp.asarray(rng.random((T, TOPK)).astype(np.float32))
    return x, idx, probs


def _round_trip(x, idx, probs):
    out, row_id_map = tej.moe_permute(x, idx, map_type="index")
    back = tej.moe_unpermute(out, row_id_map, probs, map_type="index")
    return out, back


@needs_8
@pytest.mark.parametrize("mesh_name", ["dp8", "dp2tp4"])
def test_permute_shard_local_along_tokens(mesh_name):
    m = mesh(mesh_name)
    shards = m.shape["dp"]
    x, idx, probs = _routing()
    spec = P("dp", None)
    fn = jax.jit(jax.shard_map(_round_trip, mesh=m, in_specs=(spec, spec, spec), out_specs=(spec, spec)))
    out, back = fn(x, idx, probs)
    n = T // shards
    want = [_round_trip(x[i * n:(i + 1) * n], idx[i * n:(i + 1) * n], probs[i * n:(i + 1) * n]) for i in range(shards)]
    np.testing.assert_array_equal(np.asarray(out).view(np.uint32),
                                  np.concatenate([np.asarray(w[0]) for w in want]).view(np.uint32))
    np.testing.assert_array_equal(np.asarray(back).view(np.uint32),
                                  np.concatenate([np.asarray(w[1]) for w in want]).view(np.uint32))

    def loss(x, probs):
        return jnp.sum(jax.shard_map(_round_trip, mesh=m, in_specs=(spec, spec, spec), out_specs=(spec, spec),
                                         check_vma=False)(
            x, idx, probs)[1] ** 2)

    gx, gp = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, probs)
    for i in range(shards):
        sl = slice(i * n, (i + 1) * n)
        wx, wp = jax.grad(lambda a, p: jnp.sum(_round_trip(a, idx[sl], p)[1] ** 2), argnums=(0, 1))(x[sl], probs[sl])
        np.testing.assert_array_equal(np.asarray(gx[sl]).view(np.uint32), np.asarray(wx).view(np.uint32))
        np.testing.assert_array_equal(np.asarray(gp[sl]).view(np.uint32), np.asarray(wp).view(np.uint32))


@needs_8
def test_flax_logical_axes_map_to_mesh():
    m = mesh("dp2tp4")
    rules = (("embed", None), ("mlp", "tp"))
    x = jnp.ones((8, 64), jnp.float32)
    dense_vars = Dense(128, logical_axes=True).init(jax.random.PRNGKey(0), x)
    mlp_vars = LayerNormMLP(intermediate_dim=128, logical_axes=True).init(jax.random.PRNGKey(0), x)
    dense_specs = nn.get_partition_spec(dense_vars)["params"]
    mlp_specs = nn.get_partition_spec(mlp_vars)["params"]
    assert dense_specs["kernel"] == P("embed", "mlp") and dense_specs["bias"] == P("mlp")
    assert mlp_specs["fc1_weight"] == P("mlp", "embed") and mlp_specs["fc2_weight"] == P("embed", "mlp")
    assert mlp_specs["layer_norm_weight"] == P("embed")
    shardings = nn.logical_to_mesh_sharding(mlp_specs, m, rules)
    assert shardings["fc1_weight"] == NamedSharding(m, P("tp", None))
    assert shardings["fc2_weight"] == NamedSharding(m, P(None, "tp"))
    # unboxed, the params are the unannotated module's (same init)
    plain = LayerNormMLP(intermediate_dim=128).init(jax.random.PRNGKey(0), x)
    for k, v in nn.unbox(mlp_vars)["params"].items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(plain["params"][k]))


@pytest.mark.skipif(HAVE_8, reason="runs the file in a subprocess only when JAX here has < 8 devices")
def test_subprocess():
    run_in_subprocess(__file__)

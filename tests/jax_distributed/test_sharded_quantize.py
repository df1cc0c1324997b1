"""Quantize / dequantize on local shards inside jax.shard_map give the unsharded bytes
(NUMERICS.md §12): meshes (dp=8), (tp=8), (dp=2, tp=4); per-tensor amaxes pmax-ed; bad specs
refused with clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import twinengine.jax as tej
from twinengine.jax.sharding import amax_reduction, check_sharding
from twinengine.quantizers import (Float8BlockQuantizer, Float8CurrentScalingQuantizer,
                                   Float8DelayedScalingQuantizer, MXFP8Quantizer, NVFP4Quantizer)

from jax_distributed._mesh import HAVE_8, mesh, needs_8, run_in_subprocess

SPECS = {"dp8": P("dp", None), "tp8": P(None, "tp"), "dp2tp4": P("dp", "tp")}

QUANTIZERS = {
    "current": (Float8CurrentScalingQuantizer("e4m3"), (64, 128)),
    "current_pow2_e5m2": (Float8CurrentScalingQuantizer("e5m2", force_pow_2_scales=True, amax_epsilon=1e-3),
                          (64, 128)),
    "delayed": (Float8DelayedScalingQuantizer("e4m3"), (64, 128)),
    "mxfp8": (MXFP8Quantizer("e4m3"), (256, 256)),
    "fp8_block_1d": (Float8BlockQuantizer("e4m3", block_scaling_dim=1), (1024, 1024)),
    "fp8_block_2d": (Float8BlockQuantizer("e4m3", block_scaling_dim=2), (1024, 1024)),
}


def _input(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(3.0)
    x[shape[0] - 1, shape[1] - 1] = 40.0  # the global amax lives on the last shard only
    return jnp.asarray(x)


def _sharded_fn(m, spec, quantizer, scale):
    def local(x):
        with amax_reduction(m.axis_names):
            qt = tej.quantize(x, quantizer, scale=scale)
        outs = [qt.rowwise_data, tej.dequantize(qt), tej.dequantize(qt, columnwise=True)]
        amax = qt.amax if qt.amax is not None else jnp.zeros((1,), jnp.float32)
        return (*outs, amax)
    return jax.jit(jax.shard_map(local, mesh=m, in_specs=spec, out_specs=(spec, spec, spec, P())))


@needs_8
@pytest.mark.parametrize("mesh_name", list(SPECS))
@pytest.mark.parametrize("qname", list(QUANTIZERS))
def test_sharded_equals_unsharded(mesh_name, qname):
    quantizer, shape = QUANTIZERS[qname]
    m, spec = mesh(mesh_name), SPECS[mesh_name]
    check_sharding(shape, spec, m, quantizer)
    x = _input(shape)
    scale = jnp.asarray([7.5], jnp.float32) if qname == "delayed" else None
    ref = tej.quantize(x, quantizer, scale=scale)
    got = _sharded_fn(m, spec, quantizer, scale)(x)
    want = [ref.rowwise_data, tej.dequantize(ref), tej.dequantize(ref, columnwise=True)]
    for g, w in zip(got[:3], want):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))
    if ref.amax is not None:
        np.testing.assert_array_equal(np.asarray(got[3]).view(np.uint32), np.asarray(ref.amax).view(np.uint32))
        assert float(got[3][0]) == 40.0


@needs_8
def test_without_reduction_per_tensor_bytes_differ():
    """The reduction is what makes the bytes equal: local amaxes give other scales (guards the test above)."""
    quantizer, shape = QUANTIZERS["current"]
    m, spec = mesh("dp8"), SPECS["dp8"]
    x = _input(shape)
    local = jax.jit(jax.shard_map(lambda v: tej.dequantize(tej.quantize(v, quantizer)), mesh=m, in_specs=spec,
                                  out_specs=spec))(x)
    assert not np.array_equal(np.asarray(local), np.asarray(tej.dequantize(tej.quantize(x, quantizer))))


@needs_8
def test_no_all_gather_in_hlo():
    quantizer, shape = QUANTIZERS["current"]
    m, spec = mesh("dp2tp4"), SPECS["dp2tp4"]
    x = jax.device_put(_input(shape), jax.sharding.NamedSharding(m, spec))
    hlo = _sharded_fn(m, spec, quantizer, None).lower(x).compile().as_text()
    assert "all-gather" not in hlo
    assert "all-reduce" in hlo  # the amax pmax


@needs_8
def test_nvfp4_under_reduction():
    """NVFP4's global amaxes are pmax-ed (the unsharded bytes); with stochastic rounding (bits
    from the global element index) it is refused."""
    m, spec = mesh("tp8"), SPECS["tp8"]
    x = _input((64, 256)).astype(jnp.bfloat16)

    def local(v):
        with amax_reduction(m.axis_names):
            qt = tej.quantize(v, NVFP4Quantizer())
        return tej.dequantize(qt), tej.dequantize(qt, columnwise=True), qt.amax
    got = jax.jit(jax.shard_map(local, mesh=m, in_specs=spec, out_specs=(spec, spec, P()), check_vma=False))(x)
    ref = tej.quantize(x, NVFP4Quantizer())
    for g, w in zip(got, (tej.dequantize(ref), tej.dequantize(ref, columnwise=True), ref.amax)):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint32), np.asarray(w).view(np.uint32))
    sr = jax.shard_map(lambda v: tej.quantize(v, NVFP4Quantizer(stochastic_rounding=True),
                                              rng=jnp.asarray([1, 2], jnp.uint32)).rowwise_data,
                       mesh=m, in_specs=spec, out_specs=spec)
    with amax_reduction(m.axis_names), pytest.raises(ValueError, match="stochastic rounding under an amax_reduction"):
        jax.jit(sr)(x)


@needs_8
def test_bad_specs():
    with pytest.raises(ValueError, match="shard boundary falls inside a MXFP8Quantizer block"):
        check_sharding((256, 128), P(None, "tp"), mesh("tp8"), MXFP8Quantizer())
    with pytest.raises(ValueError, match="shard boundary falls inside a Float8BlockQuantizer block"):
        check_sharding((512, 1024), P("dp", None), mesh("dp8"), Float8BlockQuantizer())
    with pytest.raises(ValueError, match=r"dimension 0 of size 9 is not divisible by the mesh axes \('dp',\) of size 2"):
        check_sharding((9, 256), P("dp", "tp"), mesh("dp2tp4"), None)
    check_sharding((512, 1024), P("dp", None), mesh("dp8"), Float8BlockQuantizer(columnwise=False))


@pytest.mark.skipif(HAVE_8, reason="runs the file in a subprocess only when JAX here has < 8 devices")
def test_subprocess():
    run_in_subprocess(__file__)

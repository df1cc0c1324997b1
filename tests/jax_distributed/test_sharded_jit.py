"""twinengine ops under a plain sharded jax.jit (NamedSharding inputs, no shard_map): their
custom_partitioning rules run them per shard with the unsharded bytes (NUMERICS.md §12) on
meshes (dp=8), (tp=8), (dp=2, tp=4); the compiled HLO gathers no high-precision input where
the op runs shard-local; bad shardings raise clear errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import twinengine.jax as tej
from twinengine.recipe import Float8CurrentScaling, MXFP8BlockScaling
from twinengine.quantizers import (Float8BlockQuantizer, Float8CurrentScalingQuantizer,
                                   Float8DelayedScalingQuantizer, MXFP8Quantizer, NVFP4Quantizer)

from jax_distributed._mesh import HAVE_8, mesh, needs_8, run_in_subprocess

ROW_SPECS = {"dp8": P("dp", None), "tp8": P(None, "tp"), "dp2tp4": P("dp", "tp")}

QUANTIZERS = {
    "current": (Float8CurrentScalingQuantizer("e4m3"), (64, 128)),
    "current_pow2_e5m2": (Float8CurrentScalingQuantizer("e5m2", force_pow_2_scales=True, amax_epsilon=1e-3),
                          (64, 128)),
    "delayed": (Float8DelayedScalingQuantizer("e4m3"), (64, 128)),
    "mxfp8": (MXFP8Quantizer("e4m3"), (1024, 1024)),
    "fp8_block_1d": (Float8BlockQuantizer("e4m3", block_scaling_dim=1), (1024, 1024)),
    "fp8_block_2d": (Float8BlockQuantizer("e4m3", block_scaling_dim=2, columnwise=False), (1024, 4096)),
    "nvfp4": (NVFP4Quantizer(), (1024, 1024)),
    "nvfp4_rht_2d": (NVFP4Quantizer(with_rht=True, with_2d_quantization=True), (1024, 1024)),
}


def _put(m, spec, x):
    return jax.device_put(x, NamedSharding(m, spec))


def _input(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(3.0)
    x[(shape[0] - 1,) + (slice(None),) * (len(shape) - 1)] *= np.float32(4.0)  # amax on the last row shard
    return jnp.asarray(x).astype(dtype)


def _bytes(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"uint{8 * a.dtype.itemsize}")


def assert_bytes_equal(got, want):
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_array_equal(_bytes(g), _bytes(w))


def _quantize_fn(quantizer, scale):
    def f(x):
        qt = tej.quantize(x, quantizer, scale=scale)
        outs = {"qt": qt, "rowwise": tej.dequantize(qt, x.dtype)}
        if quantizer.columnwise:
            outs["columnwise"] = tej.dequantize(qt, jnp.float32, columnwise=True)
        return outs
    return f


@needs_8
@pytest.mark.parametrize("mesh_name", list(ROW_SPECS))
@pytest.mark.parametrize("qname", list(QUANTIZERS))
def test_quantize_sharded_jit_equals_unsharded(mesh_name, qname):
    quantizer, shape = QUANTIZERS[qname]
    m, spec = mesh(mesh_name), ROW_SPECS[mesh_name]
    dtype = jnp.bfloat16 if qname.startswith("nvfp4") else jnp.float32
    x = _input(shape, dtype)
    scale = jnp.asarray([7.5], jnp.float32) if qname == "delayed" else None
    f = _quantize_fn(quantizer, scale)
    want = jax.jit(f)(x)
    got = jax.jit(f)(_put(m, spec, x))
    assert_bytes_equal(got, want)
    if not (qname.startswith("nvfp4") and spec[-1] is not None):  # packed FP4 K/2: not propagated along K
        assert got["qt"].rowwise_data.sharding.is_equivalent_to(NamedSharding(m, spec), len(shape))


@pytest.mark.skipif(HAVE_8, reason="runs the file in a subprocess only when JAX here has < 8 devices")
def test_subprocess():
    run_in_subprocess(__file__)


def _hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def _gathers(hlo: str) -> list[str]:
    """The all-gathers of high-precision values in compiled HLO (XLA's CPU backend moves bf16 as f32)."""
    return [line for line in hlo.splitlines()
            if "all-gather" in line and any(f"= {t}[" in line or f"({t}[" in line for t in ("f32", "bf16", "f16"))]


@needs_8
def test_quantize_hlo_gathers_no_high_precision_input():
    quantizer, shape = QUANTIZERS["current"]
    m = mesh("dp2tp4")
    x = _put(m, ROW_SPECS["dp2tp4"], _input(shape))
    hlo = _hlo(lambda v: tej.quantize(v, quantizer).rowwise_data, x)
    assert not _gathers(hlo), _gathers(hlo)
    assert "all-reduce" in hlo  # the amax pmax
    # NVFP4 pmaxes its global amaxes; the guard: with stochastic rounding it runs replicated
    # (each element's bits depend on its global index), so its bf16 input is gathered
    xb = _put(m, ROW_SPECS["dp2tp4"], _input((1024, 1024), jnp.bfloat16))
    assert not _gathers(_hlo(lambda v: tej.quantize(v, NVFP4Quantizer()).rowwise_data, xb))
    sr = NVFP4Quantizer(stochastic_rounding=True)
    assert _gathers(_hlo(lambda v: tej.quantize(v, sr, rng=jnp.asarray([1, 2], jnp.uint32)).rowwise_data, xb))


@needs_8
def test_quantize_shard_boundary_inside_block_is_refused():
    m = mesh("dp8")
    x = _put(m, P("dp", None), _input((256, 128)))  # 32 rows a shard: inside MXFP8's 128-row scale tile
    with pytest.raises(Exception, match="quantize: a shard boundary of x falls inside a MXFP8Quantizer block"):
        jax.jit(lambda v: tej.quantize(v, MXFP8Quantizer()).rowwise_data)(x)
    y = _put(m, P("dp", None, None), _input((8, 16, 256)))  # 16 flattened rows a shard: inside a 128 block
    with pytest.raises(Exception, match="quantize: a shard boundary of x falls inside a Float8BlockQuantizer block"):
        jax.jit(lambda v: tej.quantize(v, Float8BlockQuantizer()).rowwise_data)(y)


# ---- dense: column- and row-parallel under jit ------------------------------------------

RECIPES = {"hp": None, "current": Float8CurrentScaling(), "mxfp8": MXFP8BlockScaling()}
DENSE = {  # name -> (mesh, x spec, kernel spec, bias spec); tp shards the kernel's N or K
    "column_tp8": ("tp8", P(None, None), P(None, "tp"), P("tp")),
    "column_dp2tp4": ("dp2tp4", P("dp", None), P(None, "tp"), P("tp")),
    "batch_dp8": ("dp8", P("dp", None), P(None, None), P(None)),
    "row_dp2tp4": ("dp2tp4", P("dp", "tp"), P("tp", None), P(None)),
}


def _dense_arrays(recipe_name, seed=0):
    """MXFP8 shards hold whole 128 x 128 scale tiles: 1024 rows / columns over 8 shards."""
    m, k, n = (1024, 512, 1024) if recipe_name == "mxfp8" else (256, 512, 512)
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
    w = jnp.asarray((rng.standard_normal((k, n)) / 16).astype(np.float32))
    b = jnp.asarray(rng.standard_normal((n,)).astype(np.float32))
    ct = jnp.asarray(rng.standard_normal((m, n)).astype(np.float32))
    return x, w, b, ct


@functools.lru_cache(maxsize=None)
def _dense_fn(recipe_name):
    """(y, grads) of sum(y · ct): a fixed output gradient, so a row-parallel y's last-bit
    differences do not move the quantized gradients' scales."""
    recipe = RECIPES[recipe_name]

    def loss(x, w, b, ct):
        y = tej.dense(x, w, b, recipe=recipe)
        return jnp.sum(y * ct), y
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


@needs_8
@pytest.mark.parametrize("layout", list(DENSE))
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_dense_sharded_jit(layout, recipe_name):
    """Column / batch sharding: y is the unsharded bytes; row (K) sharding and every gradient
    whose contraction is sharded: within fp32 summation-order tolerance (NUMERICS.md §12)."""
    mesh_name, xs, ws, bs = DENSE[layout]
    m = mesh(mesh_name)
    x, w, b, ct = _dense_arrays(recipe_name)
    fn = _dense_fn(recipe_name)
    (_, y_ref), g_ref = fn(x, w, b, ct)
    (_, y), g = fn(_put(m, xs, x), _put(m, ws, w), _put(m, bs, b), ct)
    if layout.startswith("row"):
        np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)
    else:
        assert_bytes_equal(y, y_ref)
    for got, want in zip(g, g_ref):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


@needs_8
@pytest.mark.parametrize("recipe_name", ["current", "mxfp8"])
def test_dense_hlo_gathers_no_high_precision_input(recipe_name):
    m = mesh("dp2tp4")
    x, w, b, _ = _dense_arrays(recipe_name)
    args = (_put(m, P("dp", None), x), _put(m, P(None, "tp"), w), _put(m, P("tp"), b))
    hlo = _hlo(lambda x, w, b: tej.dense(x, w, b, recipe=RECIPES[recipe_name]), *args)
    assert not _gathers(hlo), _gathers(hlo)


# ---- norms, activations, dropout --------------------------------------------------------

from twinengine.jax._ops.activation import activation_bwd_dbias, activation_fwd  # noqa: E402
from twinengine.jax._ops.bias import add, bias_add, scale  # noqa: E402
from twinengine.jax._ops.dropout import dropout_bwd, dropout_fwd  # noqa: E402
from twinengine.jax._ops.norm import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd  # noqa: E402

FEATURE_SPECS = {"dp8": P("dp", None), "tp8": P(None, "tp"), "dp2tp4": P("dp", "tp")}  # tp8: hidden gathered


def _features(shape=(64, 256), seed=1):
    rng = np.random.default_rng(seed)
    x = _input(shape, seed=seed)
    w = jnp.asarray(rng.standard_normal(shape[-1]).astype(np.float32))
    b = jnp.asarray(rng.standard_normal(shape[-1]).astype(np.float32))
    dy = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
    return x, w, b, dy


def _norms(x, w, b, dy):
    q = Float8CurrentScalingQuantizer("e4m3")
    y, mu, rstd, qt = layernorm_fwd(x, w, b, 1e-5, False, quantizer=q)
    dx, dw, db = layernorm_bwd(dy, x, mu, rstd, w, False)
    ry, rrstd, _ = rmsnorm_fwd(x, w, 1e-5, True)
    rdx, rdw = rmsnorm_bwd(dy, x, rrstd, w, True)
    exact = {"y": y, "mu": mu, "rstd": rstd, "qt": qt, "dx": dx, "ry": ry, "rdx": rdx}
    return exact, {"dw": dw, "db": db, "rdw": rdw}


def _activations(x, w, b, dy):
    q = Float8CurrentScalingQuantizer("e4m3")
    y, qt = activation_fwd(x, "gelu", quantizer=q)
    gy, _ = activation_fwd(x, "swiglu")
    dx, dbias, dqt = activation_bwd_dbias(dy, x, "gelu", quantizer=q)
    dropped, mask = dropout_fwd(x, 0.25, jnp.asarray([7, 3], jnp.uint32))
    ddx = dropout_bwd(dy, mask, 0.25)
    exact = {"y": y, "qt": qt, "gy": gy, "dx": dx, "dqt": dqt, "dropped": dropped, "mask": mask, "ddx": ddx,
             "add": add(x, dy), "scale": scale(x, 0.3), "bias_add": bias_add(x, b)}
    return exact, {"dbias": dbias}


@needs_8
@pytest.mark.parametrize("mesh_name", list(FEATURE_SPECS))
@pytest.mark.parametrize("family", [_norms, _activations], ids=["norm", "activation"])
def test_features_sharded_jit_equals_unsharded(mesh_name, family):
    """Per-row / elementwise outputs are the unsharded bytes; per-feature sums over sharded rows
    within fp32 summation-order tolerance."""
    m, spec = mesh(mesh_name), FEATURE_SPECS[mesh_name]
    x, w, b, dy = _features()
    fn = jax.jit(family)
    exact_ref, summed_ref = fn(x, w, b, dy)
    exact, summed = fn(_put(m, spec, x), w, b, _put(m, spec, dy))
    assert_bytes_equal(exact, exact_ref)
    for key in summed_ref:
        np.testing.assert_allclose(np.asarray(summed[key]), np.asarray(summed_ref[key]), rtol=1e-5, atol=1e-5)


@needs_8
def test_features_hlo_gather_no_rows():
    m = mesh("dp8")
    x, w, b, dy = _features()
    args = (_put(m, P("dp", None), x), w, b, _put(m, P("dp", None), dy))
    q = Float8CurrentScalingQuantizer("e4m3")
    for fn in (lambda x, w, b, dy: _norms(x, w, b, dy)[0],
               lambda x, w, b, dy: (activation_fwd(x, "gelu", quantizer=q), activation_bwd_dbias(dy, x, "gelu"))):
        hlo = _hlo(fn, *args)
        assert not _gathers(hlo), _gathers(hlo)
    # the guard: dropout's forward runs replicated (its bits depend on the global element index)
    assert _gathers(_hlo(lambda x, w, b, dy: dropout_fwd(x, 0.25, jnp.asarray([7, 3], jnp.uint32)), *args))


# ---- layernorm_mlp ----------------------------------------------------------------------

@needs_8
@pytest.mark.parametrize("recipe_name", ["hp", "current"])
def test_layernorm_mlp_sharded_jit(recipe_name):
    """FC1 column-parallel, FC2 row-parallel by the weights' shardings alone: within the fp32
    summation-order tolerance of the unsharded block (FC2's K is sharded), gradients too."""
    m = mesh("dp2tp4")
    rng = np.random.default_rng(3)
    h, f = 128, 512
    params = {"layer_norm_weight": jnp.asarray(rng.standard_normal(h).astype(np.float32)),
              "layer_norm_bias": jnp.asarray(rng.standard_normal(h).astype(np.float32)),
              "fc1_weight": jnp.asarray((rng.standard_normal((f, h)) / 8).astype(np.float32)),
              "fc1_bias": jnp.asarray(rng.standard_normal(f).astype(np.float32)),
              "fc2_weight": jnp.asarray((rng.standard_normal((h, f)) / 16).astype(np.float32)),
              "fc2_bias": jnp.asarray(rng.standard_normal(h).astype(np.float32))}
    specs = {"layer_norm_weight": P(), "layer_norm_bias": P(), "fc1_weight": P("tp", None), "fc1_bias": P("tp"),
             "fc2_weight": P(None, "tp"), "fc2_bias": P()}
    x = jnp.asarray(rng.standard_normal((64, h)).astype(np.float32))
    ct = jnp.asarray(rng.standard_normal((64, h)).astype(np.float32))
    recipe = RECIPES[recipe_name]

    def loss(x, p):
        y = tej.layernorm_mlp(x, p, activation="gelu", recipe=recipe)
        return jnp.sum(y * ct), y

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    (_, y_ref), g_ref = fn(x, params)
    sharded = {k: _put(m, specs[k], v) for k, v in params.items()}
    (_, y), g = fn(_put(m, P("dp", None), x), sharded)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)
    for got, want in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
    hlo = _hlo(lambda x, p: loss(x, p)[1], _put(m, P("dp", None), x), sharded)
    assert not [line for line in _gathers(hlo) if "512" in line], _gathers(hlo)  # no FC1/FC2 weight gathered


# ---- shard_map(check_vma=True) ----------------------------------------------------------

@needs_8
@pytest.mark.parametrize("recipe_name", ["hp", "current"])
def test_shard_map_check_vma_grad(recipe_name):
    """Kernel results are typed varying like their inputs and a replicated weight's gradient is
    psum-ed, so jax.grad through shard_map(check_vma=True) works: data-parallel gradients equal
    the unsharded ones within fp32 summation-order tolerance."""
    from twinengine.jax.sharding import amax_reduction  # noqa: PLC0415
    m = mesh("dp8")
    x, w, b, ct = _dense_arrays(recipe_name)
    recipe = RECIPES[recipe_name]

    def local(x, w, b, ct):
        with amax_reduction("dp"):
            y = tej.dense(x, w, b, recipe=recipe)
        return jax.lax.psum(jnp.sum(y * ct), "dp")

    def loss(x, w, b, ct):
        return jax.shard_map(local, mesh=m, in_specs=(P("dp"), P(), P(), P("dp")), out_specs=P(), check_vma=True)(
            x, w, b, ct)

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, b, ct)
    want = jax.jit(jax.grad(lambda x, w, b, ct: jnp.sum(tej.dense(x, w, b, recipe=recipe) * ct), argnums=(0, 1, 2)))(
        x, w, b, ct)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-4)


# ---- attention and rotary embedding -----------------------------------------------------

@needs_8
@pytest.mark.parametrize("heads", [(4, 4), (8, 4)], ids=["mha", "gqa"])
def test_attention_and_rope_sharded_jit(heads):
    """bshd attention sharded on batch (dp) and heads (tp): output and gradients are the
    unsharded bytes (each (batch, head) pair is its own softmax); with GQA the heads are
    gathered (still the same bytes). Rope shards batch, sequence and heads."""
    m = mesh("dp2tp4")
    h, hkv = heads
    rng = np.random.default_rng(5)
    q = jnp.asarray(rng.standard_normal((4, 16, h, 32)).astype(np.float32))
    k = jnp.asarray(rng.standard_normal((4, 16, hkv, 32)).astype(np.float32))
    v = jnp.asarray(rng.standard_normal((4, 16, hkv, 32)).astype(np.float32))
    ct = jnp.asarray(rng.standard_normal((4, 16, h, 32)).astype(np.float32))
    freqs = tej.RotaryPositionEmbedding(32)(16)

    def loss(q, k, v):
        q = tej.apply_rotary_pos_emb(q, freqs, tensor_format="bshd")
        out = tej.dot_product_attention(q, k, v, attn_mask_type="causal")
        return jnp.sum(out * ct), out

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    (_, out_ref), g_ref = fn(q, k, v)
    spec = P("dp", None, "tp", None)
    args = [_put(m, spec, a) for a in (q, k, v)]
    (_, out), g = fn(*args)
    assert_bytes_equal((out, g), (out_ref, g_ref))
    if h == hkv:
        hlo = _hlo(lambda q, k, v: loss(q, k, v)[1], *args)
        assert not _gathers(hlo), _gathers(hlo)


# ---- end to end: Flax logical axes, DelayedScaling state ----------------------------------

@needs_8
def test_flax_layernorm_mlp_logical_axes_jit():
    """A Flax LayerNormMLP whose params are placed by their logical axis names (mlp -> tp) and
    a data-parallel batch: one plain jit of apply, the unsharded output within the row-parallel
    FC2 tolerance, and no gather of the FC1 / FC2 weights."""
    import flax.linen as nn  # noqa: PLC0415
    from twinengine.jax.flax_blocks import LayerNormMLP  # noqa: PLC0415
    m = mesh("dp2tp4")
    rules = (("embed", None), ("mlp", "tp"))
    x = jnp.asarray(np.random.default_rng(7).standard_normal((64, 128)).astype(np.float32))
    module = LayerNormMLP(intermediate_dim=512, logical_axes=True)
    variables = module.init(jax.random.PRNGKey(0), x)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(variables), m, rules)
    params = jax.device_put(nn.unbox(variables), shardings)
    apply = jax.jit(lambda v, x: module.apply(v, x))
    want = apply(nn.unbox(variables), x)
    got = apply(params, _put(m, P("dp", None), x))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    hlo = apply.lower(params, _put(m, P("dp", None), x)).compile().as_text()
    assert not [line for line in _gathers(hlo) if "512" in line], _gathers(hlo)


@needs_8
def test_dense_delayed_scaling_state_sharded_jit():
    """DelayedScaling under a data- and tensor-parallel jit: column-parallel y is the unsharded
    bytes and the next state (amax histories, scales) is the unsharded one, on every device."""
    from twinengine.recipe import DelayedScaling  # noqa: PLC0415
    m = mesh("dp2tp4")
    x, w, b, _ = _dense_arrays("current")
    state = tej.delayed_scaling_state(16)
    fn = jax.jit(lambda x, w, b, s: tej.dense(x, w, b, recipe=DelayedScaling(amax_history_len=16), state=s))
    y_ref, state_ref = fn(x, w, b, state)
    y, new_state = fn(_put(m, P("dp", None), x), _put(m, P(None, "tp"), w), _put(m, P("tp"), b), state)
    assert_bytes_equal((y, new_state), (y_ref, state_ref))
    assert float(jnp.max(new_state["fwd_amax_history"][:, 0])) == float(jnp.max(jnp.abs(x)))  # the global amax


@needs_8
def test_export_multi_device_without_rules():
    """jax.export of a sharded program: custom partitioning's callbacks cannot be serialized, so
    ops traced under partitioning.without_rules() take none; the exported program gives the
    same bytes."""
    from twinengine.jax.partitioning import without_rules  # noqa: PLC0415
    m = mesh("dp8")
    sharding = NamedSharding(m, P("dp", None))
    quantizer = Float8CurrentScalingQuantizer()
    f = jax.jit(lambda x: tej.dequantize(tej.quantize(x, quantizer)), in_shardings=sharding)
    x = _input((64, 128))
    with without_rules():
        exported = jax.export.export(f, disabled_checks=tej.export_disabled_checks())(
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding))
    restored = jax.export.deserialize(exported.serialize())
    assert_bytes_equal(restored.call(_put(m, P("dp", None), x)), f(x))


def test_vmap_of_jit_batches_the_plain_op():
    """An op traced unbatched inside jit and batched afterwards (vmap(jit(f))) runs its plain
    function per batch element: each element's bytes are the unbatched call's."""
    quantizer = Float8CurrentScalingQuantizer()
    f = jax.jit(lambda x: (tej.dequantize(tej.quantize(x, quantizer)), tej.dense(x, jnp.ones((128, 8)) / 8)))
    xs = jnp.stack([_input((16, 128), seed=s) for s in range(3)])
    got = jax.vmap(f)(xs)
    for i in range(3):
        assert_bytes_equal(jax.tree_util.tree_map(lambda a: a[i], got), f(xs[i]))
    grad = jax.jit(jax.grad(lambda x: jnp.sum(tej.dense(x, jnp.ones((128, 8))) ** 2)))
    grads = jax.vmap(grad)(xs)
    for i in range(3):
        assert_bytes_equal(grads[i], grad(xs[i]))


_GSPMD_SCRIPT = """
import jax
jax.config.update("jax_use_shardy_partitioner", False)
import jax.numpy as jnp, numpy as np
import twinengine.jax as tej
from twinengine.quantizers import Float8CurrentScalingQuantizer
from twinengine.recipe import Float8CurrentScaling
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
m = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))
x = jnp.asarray(np.random.default_rng(0).standard_normal((256, 512)), jnp.float32)
w = jnp.asarray(np.random.default_rng(1).standard_normal((512, 512)) / 16, jnp.float32)
q = jax.jit(lambda x: tej.quantize(x, Float8CurrentScalingQuantizer()))
a, b = q(jax.device_put(x, NamedSharding(m, P("dp", "tp")))), q(x)
assert all((np.asarray(u).view(np.uint8) == np.asarray(v).view(np.uint8)).all()
           for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
f = jax.jit(lambda x, w: tej.dense(x, w, recipe=Float8CurrentScaling()))
y = f(jax.device_put(x, NamedSharding(m, P("dp", None))), jax.device_put(w, NamedSharding(m, P(None, "tp"))))
np.testing.assert_allclose(np.asarray(y), np.asarray(f(x, w)), rtol=1e-5, atol=1e-5)
print("gspmd ok")
"""


def test_gspmd_partitioner():
    """Under the (deprecated) GSPMD partitioner the ops partition too (its propagation may pick
    other shardings than Shardy's, e.g. a sharded K: bytes then within the row-parallel
    tolerance). In a subprocess: a callback failure there aborts the process."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    proc = subprocess.run([sys.executable, "-c", _GSPMD_SCRIPT], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "gspmd ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]

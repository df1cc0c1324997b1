"""Coming from TransformerEngine: TE recipe objects accepted wherever a twinengine recipe is, and
TE Linear / LayerNormLinear / LayerNormMLP checkpoints loaded (delayed-scaling extra state
included), then carried to Flax params and back.

The recipe tests use the pure-Python ``transformer-engine`` wheel (scripts/setup.sh installs it
with --no-deps; importable on CPU with NVTE_PROJECT_BUILDING=1) and skip only where it is absent.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, from_torch, to_torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine.jax.flax import Dense
from twinengine.jax.flax import LayerNormMLP as FlaxLayerNormMLP
from twinengine.te_migration import convert_te_recipe

os.environ.setdefault("NVTE_PROJECT_BUILDING", "1")  # TE's pure-Python package imports on CPU with it
with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # "no TE PyTorch / JAX extension found"
    try:
        import transformer_engine.common.recipe as te_recipe
    except ImportError:  # pragma: no cover - only where the wheel is not installed
        te_recipe = None

needs_te = pytest.mark.skipif(te_recipe is None, reason="transformer-engine (pure-Python wheel) is not installed")


# ---- recipes --------------------------------------------------------------------------------

def _conversions():
    R, F = te_recipe, te.recipe.Format
    return [
        (R.DelayedScaling(), te.recipe.DelayedScaling()),
        (R.DelayedScaling(margin=2, fp8_format=R.Format.E4M3, amax_history_len=16, amax_compute_algo="most_recent",
                          reduce_amax=False),
         te.recipe.DelayedScaling(margin=2, fp8_format=F.E4M3, amax_history_len=16, amax_compute_algo="most_recent")),
        (R.Float8CurrentScaling(), te.recipe.Float8CurrentScaling()),
        (R.Float8CurrentScaling(fp8_format=R.Format.E4M3), te.recipe.Float8CurrentScaling(fp8_format=F.E4M3)),
        (R.DelayedScaling(fp8_dpa=True), te.recipe.DelayedScaling(fp8_dpa=True)),
        (R.Float8CurrentScaling(fp8_mha=True), te.recipe.Float8CurrentScaling(fp8_mha=True)),
        (R.MXFP8BlockScaling(), te.recipe.MXFP8BlockScaling()),
        (R.MXFP8BlockScaling(fp8_format=R.Format.HYBRID, enable_2d_quantization=True),
         te.recipe.MXFP8BlockScaling(fp8_format=F.HYBRID, enable_2d_quantization=True)),
        (R.Float8BlockScaling(), te.recipe.Float8BlockScaling()),
        (R.Float8BlockScaling(x_block_scaling_dim=1, w_block_scaling_dim=1, grad_block_scaling_dim=2),
         te.recipe.Float8BlockScaling(x_block_scaling_dim=1, w_block_scaling_dim=1, grad_block_scaling_dim=2)),
        (R.NVFP4BlockScaling(), te.recipe.NVFP4BlockScaling()),
        (R.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True),
         te.recipe.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True,
                                     disable_2d_quantization=True)),
    ]


@needs_te
def test_te_recipes_convert_field_by_field():
    for te_r, expected in _conversions():
        got = convert_te_recipe(te_r)
        assert got == expected, te_r
        for role in ("input", "weight", "grad_output"):
            assert got.quantizer(role) == expected.quantizer(role)


@needs_te
def test_te_block_scaling_per_role_qparams_must_agree():
    r = te_recipe.Float8BlockScaling()
    r.fp8_quant_fwd_weight = te_recipe.QParams(power_2_scale=True, amax_epsilon=0.5)
    with pytest.raises(ValueError, match="one power-of-2 flag and one epsilon for all roles"):
        convert_te_recipe(r)
    r = te_recipe.Float8CurrentScaling()
    for role in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
        setattr(r, role, te_recipe.QParams(power_2_scale=True, amax_epsilon=1e-3))
    with pytest.raises(ValueError, match="use_power_2_scales=False .* contradicts fp8_quant_\\*.power_2_scale=True"):
        convert_te_recipe(r)
    r.use_power_2_scales = True
    assert convert_te_recipe(r) == te.recipe.Float8CurrentScaling(use_power_2_scales=True, amax_epsilon=1e-3)


@needs_te
@pytest.mark.parametrize("make,match", [
    (lambda R: R.MXFP8BlockScaling(fp8_dpa=True), r"MXFP8BlockScaling.fp8_dpa=True is not supported by twinengine: "
                                                  "twinengine's FP8 attention"),
    (lambda R: R.DelayedScaling(amax_compute_algo=lambda h: h.max()), "DelayedScaling.amax_compute_algo=.* only 'max' and"),
    (lambda R: R.DelayedScaling(scaling_factor_compute_algo=lambda *a: 1.0), "DelayedScaling.scaling_factor_compute_algo="),
    (lambda R: R.MXFP8BlockScaling(margin=1), "MXFP8BlockScaling.margin=1 .* a margin has no meaning"),
    (lambda R: R.NVFP4BlockScaling(nvfp4_4over6="all"), "NVFP4BlockScaling.nvfp4_4over6='all' .* 4over6 block scaling"),
    (lambda R: R.NVFP4BlockScaling(row_scaled_activation=True), "NVFP4BlockScaling.row_scaled_activation=True"),
    (lambda R: R.Float8CurrentScaling(backward_override="high_precision"), "Float8CurrentScaling.backward_override='high_precision'"),
])
def test_te_recipe_fields_we_do_not_support_are_named(make, match):
    with pytest.raises(ValueError, match="twinengine.recipe: transformer_engine " + match):
        convert_te_recipe(make(te_recipe))


@needs_te
def test_te_recipe_unknown_class_and_field():
    with pytest.raises(TypeError, match="CustomRecipe has no twinengine counterpart.*twinengine.recipe.CustomRecipe"):
        convert_te_recipe(te_recipe.CustomRecipe(qfactory=lambda role: None))
    newer = dataclasses.make_dataclass("DelayedScaling", [("new_knob", int, dataclasses.field(default=3))],
                                       bases=(te_recipe.DelayedScaling,))
    newer.__module__ = te_recipe.__name__  # a field a newer TE might add
    with pytest.raises(ValueError, match="DelayedScaling.new_knob=3 .* a field this twinengine version does not know"):
        convert_te_recipe(newer())
    with pytest.raises(TypeError, match="twinengine.autocast: enabled=True needs recipe= a twinengine.recipe.Recipe "
                                        r"\(or a transformer_engine.common.recipe object\), got str"):
        tep.autocast(recipe="mxfp8")


def _linear_pair(seed=0):
    torch.manual_seed(seed)
    module = tep.Linear(64, 32, amax_history_len=16, params_dtype=torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    return module, x


@needs_te
@pytest.mark.parametrize("pair", [(lambda R: R.MXFP8BlockScaling(), te.recipe.MXFP8BlockScaling()),
                                  (lambda R: R.DelayedScaling(amax_history_len=16), te.recipe.DelayedScaling(amax_history_len=16)),
                                  (lambda R: R.NVFP4BlockScaling(), te.recipe.NVFP4BlockScaling())],
                         ids=["mxfp8", "delayed", "nvfp4"])
def test_te_recipe_accepted_wherever_a_recipe_is(pair):
    make, ours = pair
    results = []
    for recipe in (make(te_recipe), ours):
        module, x = _linear_pair()
        x.requires_grad_(True)
        with tep.autocast(recipe=recipe):
            y = module(x)
        y.sum().backward()
        results.append((from_torch(y.detach()), from_torch(x.grad), from_torch(module.fwd_amax_history)))
    for got, expected, name in zip(results[0], results[1], ("y", "dx", "history")):
        assert_bytes_equal(got, expected, f"tep.autocast {name}")

    xj = jnp.asarray(np.random.default_rng(0).standard_normal((32, 64)), jnp.bfloat16)
    kernel = jnp.asarray(np.random.default_rng(1).standard_normal((64, 32)) / 8, jnp.bfloat16)
    outs = []
    for recipe in (make(te_recipe), ours):
        kwargs = {"state": tej.delayed_scaling_state(16)} if isinstance(ours, te.recipe.DelayedScaling) else {}
        if isinstance(ours, te.recipe.NVFP4BlockScaling):
            kwargs["rng"] = jnp.asarray([1, 2], jnp.uint32)
        explicit = tej.dense(xj, kernel, recipe=recipe, **kwargs)
        with tej.autocast(recipe):
            regional = tej.dense(xj, kernel, **kwargs)
        flax_params = {"params": {"kernel": kernel, "bias": jnp.zeros(32, jnp.bfloat16)}}
        flax_out = Dense(32, recipe=recipe, param_dtype=jnp.bfloat16).apply(
            flax_params, xj, rng=kwargs.get("rng"), mutable=["fp8_meta"])[0]
        outs.append(jax.tree_util.tree_leaves((explicit, regional, flax_out)))
    for got, expected in zip(*outs):
        assert_bytes_equal(np.asarray(got), np.asarray(expected), "jax dense / autocast / flax Dense")


# ---- checkpoints ----------------------------------------------------------------------------

def _te_extra_state(recipe, num_gemms: int, history_len: int, seed: int = 0) -> torch.Tensor:
    """The ``_extra_state`` a TE module saves (TE 2.x ``get_extra_state``: a pickled dict of the
    recipe, the delayed-scaling tensors and fp8_meta flags, as a uint8 tensor)."""
    g = torch.Generator().manual_seed(seed)
    state = {"recipe": recipe,
             "scale_fwd": torch.rand(3 * num_gemms, generator=g) + 0.5,
             "amax_history_fwd": torch.rand(history_len, 3 * num_gemms, generator=g),
             "scale_bwd": torch.rand(2 * num_gemms, generator=g) + 0.5,
             "amax_history_bwd": torch.rand(history_len, 2 * num_gemms, generator=g),
             "extra_fp8_variables": {"num_gemms": num_gemms, "fp8_checkpoint": True}}
    return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)


def _recipe_for_checkpoint():
    return te_recipe.DelayedScaling(amax_history_len=8) if te_recipe is not None else None


def test_te_linear_checkpoint_loads_weights_and_delayed_state():
    module = tep.Linear(64, 32, amax_history_len=8, rng_seed=5)
    rng_before = module.rng_state.clone()
    weight, bias = torch.randn(32, 64), torch.randn(32)
    extra = _te_extra_state(_recipe_for_checkpoint(), num_gemms=1, history_len=8)
    module.load_state_dict({"weight": weight, "bias": bias, "_extra_state": extra})  # strict
    saved = _read(extra)
    assert torch.equal(module.weight, weight) and torch.equal(module.bias, bias)
    assert torch.equal(module.fwd_amax_history, saved["amax_history_fwd"][:, [0, 1]])
    assert torch.equal(module.fwd_scale, saved["scale_fwd"][[0, 1]])
    assert torch.equal(module.bwd_amax_history, saved["amax_history_bwd"][:, [0]])
    assert torch.equal(module.bwd_scale, saved["scale_bwd"][[0]])
    assert torch.equal(module.rng_state, rng_before)


def _read(extra):
    from twinengine.pytorch.te_migration import read_te_extra_state

    return read_te_extra_state(extra)


def test_te_layernorm_mlp_checkpoint_maps_gemm_columns():
    module = tep.LayerNormMLP(64, 96, activation="swiglu", amax_history_len=8)
    extra = _te_extra_state(_recipe_for_checkpoint(), num_gemms=2, history_len=8, seed=3)
    params = {name: torch.randn_like(p) for name, p in module.named_parameters()}
    module.load_state_dict({**params, "_extra_state": extra})
    saved = _read(extra)
    fc1, fc2 = module.basic_ops[1], module.basic_ops[4]
    for op, (cols, col) in ((fc1, ([0, 1], 0)), (fc2, ([3, 4], 2))):
        assert torch.equal(op.fwd_amax_history, saved["amax_history_fwd"][:, cols])
        assert torch.equal(op.fwd_scale, saved["scale_fwd"][cols])
        assert torch.equal(op.bwd_amax_history, saved["amax_history_bwd"][:, [col]])
        assert torch.equal(op.bwd_scale, saved["scale_bwd"][[col]])
    for name, p in module.named_parameters():
        assert torch.equal(p, params[name]), name


def test_te_checkpoint_without_delayed_state_keeps_buffers():
    module = tep.LayerNormLinear(64, 32, amax_history_len=8)
    op = module.basic_ops[1]
    with torch.no_grad():
        op.fwd_scale.fill_(3.0)
    before = {name: b.clone() for name, b in module.named_buffers()}
    params = {name: torch.randn_like(p) for name, p in module.named_parameters()}
    module.load_state_dict({**params, "_extra_state": torch.empty(0, dtype=torch.uint8)})
    for name, b in module.named_buffers():
        assert torch.equal(b, before[name]), name
    assert torch.equal(module.layer_norm_weight, params["layer_norm_weight"])


def test_te_checkpoint_errors():
    module = tep.Linear(64, 32, amax_history_len=4)
    extra = _te_extra_state(_recipe_for_checkpoint(), num_gemms=1, history_len=8)
    with pytest.raises(ValueError, match="amax history has length 8, the module's 4; create the module with "
                                         "amax_history_len=8"):
        module.load_state_dict({"weight": torch.zeros(32, 64), "bias": torch.zeros(32), "_extra_state": extra})

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    evil = torch.frombuffer(bytearray(pickle.dumps({"recipe": Evil()})), dtype=torch.uint8)
    with pytest.raises(pickle.UnpicklingError, match="refers to posix.system"):
        module.load_state_dict({"weight": torch.zeros(32, 64), "bias": torch.zeros(32), "_extra_state": evil})


def test_te_layernorm_mlp_checkpoint_round_trips_through_flax_params():
    torch.manual_seed(1)
    te_dict = {"layer_norm_weight": torch.rand(64) + 0.5, "layer_norm_bias": torch.randn(64) / 4,
               "fc1_weight": torch.randn(192, 64) / 8, "fc1_bias": torch.randn(192) / 8,
               "fc2_weight": torch.randn(64, 96) / 8, "fc2_bias": torch.randn(64) / 8,
               "_extra_state": torch.empty(0, dtype=torch.uint8)}
    module = tep.LayerNormMLP(64, 96, activation="swiglu")
    module.load_state_dict(te_dict)
    params = tej.params_from_torch(te_dict)
    assert sorted(params) == sorted(k for k in te_dict if k != "_extra_state")
    x = np.random.default_rng(2).standard_normal((32, 64)).astype(np.float32)
    recipe = te.recipe.MXFP8BlockScaling()
    with tep.autocast(recipe=recipe):
        y_torch = module(to_torch(x))
    y_jax = jax.jit(lambda x, p: tej.layernorm_mlp(x, p, activation="swiglu", recipe=recipe))(jnp.asarray(x), params)
    assert_bytes_equal(from_torch(y_torch.detach()), np.asarray(y_jax), "torch vs flax params")
    flax_mlp = FlaxLayerNormMLP(intermediate_dim=96, activation="swiglu",
                                recipe=te_recipe.MXFP8BlockScaling() if te_recipe is not None else recipe)
    y_flax = flax_mlp.apply({"params": params}, jnp.asarray(x))
    assert_bytes_equal(from_torch(y_torch.detach()), np.asarray(y_flax), "torch vs Flax LayerNormMLP")
    fresh = tep.LayerNormMLP(64, 96, activation="swiglu")
    fresh.load_state_dict(tej.params_to_torch(params), strict=False)
    for name, p in fresh.named_parameters():
        assert_bytes_equal(from_torch(p.detach()), from_torch(te_dict[name]), f"round trip {name}")


def test_te_transformer_layer_checkpoint_loads():
    """A TE TransformerLayer state dict (fused QKV names, one _extra_state per TE module, TE's
    FP8-attention metadata under core_attention and an older backend key) loads strictly: the
    parameters, each projection's delayed-scaling columns, and the rng states keep their values."""
    layer = tep.TransformerLayer(64, 96, 4, num_gqa_groups=2, activation="swiglu", amax_history_len=8, seed=5)
    with torch.no_grad():
        layer.self_attention.core_attention.rng_state[1] = 7
        layer.hidden_dropout_op.rng_state[1] = 9
    rng_before = {name: b.clone() for name, b in layer.named_buffers() if name.endswith("rng_state")}
    torch.manual_seed(3)
    te_dict = {name: torch.randn_like(p) for name, p in layer.named_parameters()}
    recipe = _recipe_for_checkpoint()
    extras = {"self_attention.layernorm_qkv": (1, 1), "self_attention.proj": (1, 2),
              "self_attention.core_attention": (1, 3), "layernorm_mlp": (2, 4)}
    for module, (gemms, seed) in extras.items():
        te_dict[f"{module}._extra_state"] = _te_extra_state(recipe, num_gemms=gemms, history_len=8, seed=seed)
    te_dict["self_attention.core_attention.fused_attention._extra_state"] = torch.empty(0, dtype=torch.uint8)
    layer.load_state_dict(te_dict)  # strict
    for name, p in layer.named_parameters():
        assert torch.equal(p, te_dict[name]), name
    qkv_op = layer.self_attention.layernorm_qkv.basic_ops[1]
    fc2_op = layer.layernorm_mlp.basic_ops[4]
    for owner, module, (cols, col) in ((qkv_op, "self_attention.layernorm_qkv", ([0, 1], 0)),
                                       (layer.self_attention.proj, "self_attention.proj", ([0, 1], 0)),
                                       (fc2_op, "layernorm_mlp", ([3, 4], 2))):
        saved = _read(te_dict[f"{module}._extra_state"])
        assert torch.equal(owner.fwd_amax_history, saved["amax_history_fwd"][:, cols]), module
        assert torch.equal(owner.fwd_scale, saved["scale_fwd"][cols]), module
        assert torch.equal(owner.bwd_scale, saved["scale_bwd"][[col]]), module
    for name, b in layer.named_buffers():
        if name.endswith("rng_state"):
            assert torch.equal(b, rng_before[name]), name
    mha = tep.MultiheadAttention(64, 4, input_layernorm=False, amax_history_len=8)
    mha_dict = {name: torch.randn_like(p) for name, p in mha.named_parameters()}
    mha_dict.update({"qkv._extra_state": torch.empty(0, dtype=torch.uint8),
                     "proj._extra_state": torch.empty(0, dtype=torch.uint8),
                     "core_attention._extra_state": torch.empty(0, dtype=torch.uint8)})
    mha.load_state_dict(mha_dict)
    assert torch.equal(mha.qkv.weight, mha_dict["qkv.weight"])


def _split_qkv(fused: dict, prefix: str, q_rows: int, kv_rows: int) -> dict:
    """The TE ``fuse_qkv_params=False`` (TE's default) names of a fused state dict: the QKV
    projection's ``weight`` / ``bias`` become ``{query,key,value}_{weight,bias}``."""
    out = {k: v for k, v in fused.items() if k not in (prefix + "weight", prefix + "bias")}
    for suffix in ("weight", "bias"):
        q, k, v = torch.split(fused[prefix + suffix], [q_rows, kv_rows, kv_rows])
        out.update({f"{prefix}query_{suffix}": q.clone(), f"{prefix}key_{suffix}": k.clone(),
                    f"{prefix}value_{suffix}": v.clone()})
    return out


@pytest.mark.parametrize("kind", ["transformer_layer", "mha"])
def test_te_unfused_qkv_checkpoint_loads_as_fused(kind):
    """A TE state dict with split query/key/value parameters (TE's default fuse_qkv_params=False
    names) loads strictly, into the same parameters and the same output bytes as the fused one,
    and params_from_torch gives the same Flax params for both."""
    if kind == "transformer_layer":
        make = lambda **kw: tep.TransformerLayer(64, 96, 4, num_gqa_groups=2, activation="swiglu",  # noqa: E731
                                                 params_dtype=torch.bfloat16, amax_history_len=8, seed=5, **kw)
        prefix, x_dtype = "self_attention.layernorm_qkv.", torch.bfloat16
    else:
        make = lambda **kw: tep.MultiheadAttention(64, 4, num_gqa_groups=2, input_layernorm=False,  # noqa: E731
                                                   amax_history_len=8, **kw)
        prefix, x_dtype = "qkv.", torch.float32
    a, b = make().eval(), make().eval()
    torch.manual_seed(4)
    fused = {name: torch.randn_like(p) / 8 for name, p in a.named_parameters()}
    attention = "self_attention." if kind == "transformer_layer" else ""
    te_modules = {name.rsplit(".", 1)[0] for name in fused} | {attention + "core_attention"}
    fused.update({f"{m}._extra_state": torch.empty(0, dtype=torch.uint8) for m in te_modules})
    unfused = _split_qkv(fused, prefix, q_rows=64, kv_rows=32)
    assert prefix + "weight" not in unfused and prefix + "query_weight" in unfused
    a.load_state_dict(fused)
    b.load_state_dict(unfused)  # strict
    assert prefix + "query_weight" in unfused and prefix + "weight" not in unfused  # the caller's dict unchanged
    for name, p in b.named_parameters():
        assert_bytes_equal(from_torch(p.detach()), from_torch(fused[name]), name)
    x = torch.randn(8, 2, 64, generator=torch.Generator().manual_seed(6)).to(x_dtype)
    with torch.no_grad():
        assert_bytes_equal(from_torch(b(x)), from_torch(a(x)), "unfused vs fused checkpoint")
    p_unfused, p_fused = tej.params_from_torch(unfused), tej.params_from_torch(fused)
    flat_u, flat_f = jax.tree_util.tree_leaves_with_path(p_unfused), jax.tree_util.tree_leaves_with_path(p_fused)
    assert [path for path, _ in flat_u] == [path for path, _ in flat_f]
    for (path, u), (_, f) in zip(flat_u, flat_f):
        assert u.dtype == f.dtype, path
        assert_bytes_equal(np.asarray(u), np.asarray(f), str(path))


def test_te_unfused_qkv_checkpoint_errors():
    """Split QKV rows are [Q; K; V] (TE forces qkv_weight_interleaved=False for them): an
    interleaved module refuses them; a dict with both names is refused; fuse_qkv_params=False at
    construction stays refused."""
    mha = tep.MultiheadAttention(64, 4, input_layernorm=True, qkv_weight_interleaved=True)
    fused = {name: p.detach().clone() for name, p in mha.named_parameters()}
    unfused = _split_qkv(fused, "layernorm_qkv.", q_rows=64, kv_rows=64)
    with pytest.raises(ValueError, match="qkv_weight_interleaved=False"):
        mha.load_state_dict(unfused)
    both = dict(unfused, **{"layernorm_qkv.weight": fused["layernorm_qkv.weight"]})
    plain = tep.MultiheadAttention(64, 4, input_layernorm=True)
    with pytest.raises(ValueError, match="both 'layernorm_qkv.weight' and the split"):
        plain.load_state_dict(both)
    with pytest.raises(ValueError, match="both 'layernorm_qkv.weight' and the split"):
        tej.params_from_torch(both)
    with pytest.raises(ValueError, match="fuse_qkv_params"):
        tep.MultiheadAttention(64, 4, fuse_qkv_params=False)

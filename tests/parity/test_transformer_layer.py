"""TransformerLayer across frameworks: tep.TransformerLayer and twinengine.jax.flax.TransformerLayer
with the same weights (params_from_torch of the torch state_dict) give the same output bytes and
gradients (input and every parameter, back through params_to_torch's names), high precision and
under Float8CurrentScaling (also with FP8 attention, fp8_dpa), DelayedScaling (Flax state in
"fp8_meta") and MXFP8BlockScaling: GQA, rotary embeddings (partial rotary, a
(q, k) pair), LayerNorm / RMSNorm, gelu / swiglu, sbhd / bshd / thd packed sequences, and hidden +
attention dropout in training (the torch module's rng_state buffers passed to Flax as explicit
dropout_rngs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine.jax.flax import MultiHeadAttention, TransformerLayer

HIDDEN, FFN, HEADS, GROUPS, S, B = 64, 128, 4, 2, 16, 2
D = HIDDEN // HEADS

RECIPES = {
    "high_precision": None,
    "float8_current": te.recipe.Float8CurrentScaling(),
    "float8_current_fp8_attention": te.recipe.Float8CurrentScaling(fp8_dpa=True),
    "delayed": te.recipe.DelayedScaling(amax_history_len=4),
    "mxfp8": te.recipe.MXFP8BlockScaling(),
}

CASES = {  # name -> (layout, normalization, activation, dropout, rotary: None | "one" | "pair")
    "sbhd_layernorm_gelu_rotary": ("sbhd", "LayerNorm", "gelu", 0.0, "one"),
    "bshd_rmsnorm_swiglu_dropout_rotary_pair": ("bshd", "RMSNorm", "swiglu", 0.1, "pair"),
    "thd_layernorm_gelu_dropout_rotary": ("thd", "LayerNorm", "gelu", 0.1, "one"),
    "sbhd_rmsnorm_gelu_dropout": ("sbhd", "RMSNorm", "gelu", 0.1, None),
}


def _bytes_equal(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{what}: max diff {np.max(np.abs(a - b))}"


def _fresh_state(tree):
    """The fp8_meta tree with every Linear's state as a fresh delayed_scaling_state (the torch
    buffers before the first forward; init may have run a forward through the blocks)."""
    if "fwd_amax_history" in tree:
        return tej.delayed_scaling_state(tree["fwd_amax_history"].shape[0])
    return {k: _fresh_state(v) for k, v in tree.items()}


def _freqs(frontend, rotary):
    cls = tep.RotaryPositionEmbedding if frontend == "torch" else tej.RotaryPositionEmbedding
    if rotary is None:
        return None
    q = cls(D, rotary_percent=0.5)(S * B)
    return q if rotary == "one" else (q, cls(D, rotary_base=500.0)(S * B))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
def test_transformer_layer_same_bytes_in_torch_and_jax(recipe_name, case):
    recipe = RECIPES[recipe_name]
    fmt, normalization, activation, dropout, rotary = CASES[case]
    kw = dict(num_gqa_groups=GROUPS, hidden_dropout=dropout, attention_dropout=dropout, normalization=normalization,
              activation=activation, self_attn_mask_type="padding_causal" if fmt == "thd" else "causal",
              attn_input_format=fmt)
    torch.manual_seed(0)
    layer = tep.TransformerLayer(HIDDEN, FFN, HEADS, seed=11, amax_history_len=4, **kw)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    rng = np.random.default_rng(3)
    shape = {"sbhd": (S, B, HIDDEN), "bshd": (B, S, HIDDEN), "thd": (S * B, HIDDEN)}[fmt]
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    cu = np.array([0, 5, 5, 24, S * B], np.int32) if fmt == "thd" else None
    hidden_rng = layer.hidden_dropout_op.rng_state.clone().numpy()
    dropout_rngs = {"attention": jnp.asarray(layer.self_attention.core_attention.rng_state.numpy()),
                    "attention_hidden": jnp.asarray(hidden_rng), "mlp_hidden": jnp.asarray(hidden_rng + [0, 1])}

    xt = torch.tensor(x, requires_grad=True)
    cu_t = None if cu is None else torch.from_numpy(cu)
    with tep.autocast(recipe, enabled=recipe is not None):
        yt = layer(xt, rotary_pos_emb=_freqs("torch", rotary), cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t)
    yt.backward(torch.tensor(dy))
    torch_grads = {name: p.grad for name, p in layer.named_parameters()}

    module = TransformerLayer(hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS, recipe=recipe,
                              **kw)
    params = tej.params_from_torch(layer.state_dict())
    cu_j = None if cu is None else jnp.asarray(cu)
    freqs = _freqs("jax", rotary)

    call = dict(rotary_pos_emb=freqs, cu_seqlens_q=cu_j)
    delayed = isinstance(recipe, te.recipe.DelayedScaling)
    # DelayedScaling: the Linears' state in the "fp8_meta" collection, initialized as the torch buffers
    meta = _fresh_state(module.init(jax.random.PRNGKey(0), jnp.asarray(x), **call)["fp8_meta"]) if delayed else {}

    def run(p, v):
        variables = {"params": p, **({"fp8_meta": meta} if delayed else {})}
        y = module.apply(variables, v, deterministic=False, dropout_rngs=dropout_rngs, mutable=["fp8_meta"], **call)
        return y[0]

    yj, vjp = jax.vjp(jax.jit(run), params, jnp.asarray(x))
    gp, gx = vjp(jnp.asarray(dy))
    if dropout and not delayed:
        assert not np.array_equal(yt.detach().numpy(), np.asarray(module.apply({"params": params}, jnp.asarray(x),
                                                                               **call)))
    _bytes_equal(yt.detach().numpy(), yj, "out")
    _bytes_equal(xt.grad.numpy(), gx, "dx")
    flat = tej.params_to_torch(gp)
    assert set(flat) == set(torch_grads)
    for name, g in torch_grads.items():
        _bytes_equal(g.numpy(), flat[name].numpy(), f"grad {name}")


@pytest.mark.parametrize("bad", [dict(num_gqa_groups=3), dict(attn_input_format="hbsd"),
                                 dict(self_attn_mask_type="causal", window_size=(4, 2)),
                                 dict(hidden_size=30), dict(normalization="BatchNorm")])
def test_bad_arguments_give_the_same_error(bad):
    config = dict(hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS) | bad
    with pytest.raises(ValueError) as torch_error:
        tep.TransformerLayer(**config)
    x = jnp.zeros((S, B, config["hidden_size"]), jnp.float32)
    with pytest.raises(ValueError) as jax_error:
        TransformerLayer(**config).init(jax.random.PRNGKey(0), x)
    assert str(torch_error.value).startswith("twinengine.")
    assert str(jax_error.value) == str(torch_error.value)


@pytest.mark.parametrize("input_layernorm", [True, False])
@pytest.mark.parametrize("recipe_name", ["high_precision", "float8_current", "mxfp8"])
def test_multihead_attention_same_bytes(recipe_name, input_layernorm):
    """tep.MultiheadAttention == Flax MultiHeadAttention: the qkv Linear path without input
    layernorm, return_layernorm_output with it, bshd, GQA, rotary (q, k) pair, attention dropout."""
    recipe = RECIPES[recipe_name]
    kw = dict(num_gqa_groups=GROUPS, attention_dropout=0.2, input_layernorm=input_layernorm,
              return_layernorm_output=input_layernorm, normalization="RMSNorm", qkv_format="bshd")
    torch.manual_seed(1)
    mha = tep.MultiheadAttention(HIDDEN, HEADS, seed=3, **kw)
    with torch.no_grad():
        for p in mha.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((B, S, HIDDEN)).astype(np.float32)
    dy = rng.standard_normal((B, S, HIDDEN)).astype(np.float32)
    dropout_rngs = {"attention": jnp.asarray(mha.core_attention.rng_state.numpy())}
    xt = torch.tensor(x, requires_grad=True)
    with tep.autocast(recipe, enabled=recipe is not None):
        out = mha(xt, rotary_pos_emb=_freqs("torch", "pair"))
    yt = out[0] if input_layernorm else out
    yt.backward(torch.tensor(dy))
    module = MultiHeadAttention(hidden_size=HIDDEN, num_attention_heads=HEADS, recipe=recipe, **kw)
    params = tej.params_from_torch(mha.state_dict())
    freqs = _freqs("jax", "pair")

    def run(p, v):
        out = module.apply({"params": p}, v, rotary_pos_emb=freqs, deterministic=False, dropout_rngs=dropout_rngs)
        return out[0] if input_layernorm else out

    yj, vjp = jax.vjp(jax.jit(run), params, jnp.asarray(x))
    gp, gx = vjp(jnp.asarray(dy))
    _bytes_equal(yt.detach().numpy(), yj, "out")
    if input_layernorm:
        ln_j = module.apply({"params": params}, jnp.asarray(x), rotary_pos_emb=freqs)[1]
        _bytes_equal(out[1].detach().numpy(), ln_j, "layernorm output")
    _bytes_equal(xt.grad.numpy(), gx, "dx")
    flat = tej.params_to_torch(gp)
    for name, p in mha.named_parameters():
        _bytes_equal(p.grad.numpy(), flat[name].numpy(), f"grad {name}")

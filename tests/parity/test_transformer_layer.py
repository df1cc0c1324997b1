"""TransformerLayer across frameworks: the same weights give the same output bytes and gradients
(input and every parameter) in twinengine.jax.flax.TransformerLayer and twinengine.pytorch, high
precision and under Float8CurrentScaling and MXFP8BlockScaling, with GQA:

- tep.TransformerLayer (training, hidden and attention dropout: the torch module's rng_state
  buffers passed to Flax as explicit dropout_rngs), bshd / sbhd and thd packed sequences;
- a torch composition of LayerNormLinear, DotProductAttention, apply_rotary_pos_emb, Linear and
  LayerNormMLP with TE's submodule names for the rotary path (docs/attention.md §11).
Weights go through params_from_torch / params_to_torch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine.jax.flax import TransformerLayer

HIDDEN, FFN, HEADS, GROUPS, S, B = 64, 128, 4, 2, 16, 2
D = HIDDEN // HEADS


class _TorchMHA(torch.nn.Module):
    def __init__(self, normalization):
        super().__init__()
        self.layernorm_qkv = tep.LayerNormLinear(HIDDEN, (HEADS + 2 * GROUPS) * D, normalization=normalization)
        self.core_attention = tep.DotProductAttention(HEADS, D, num_gqa_groups=GROUPS, qkv_format="sbhd")
        self.proj = tep.Linear(HEADS * D, HIDDEN)

    def forward(self, x, freqs):
        qkv = self.layernorm_qkv(x)
        q, k, v = torch.split(qkv, [HEADS * D, GROUPS * D, GROUPS * D], dim=-1)
        q = q.reshape(S, B, HEADS, D)
        k, v = k.reshape(S, B, GROUPS, D), v.reshape(S, B, GROUPS, D)
        q = tep.apply_rotary_pos_emb(q, freqs, "sbhd")
        k = tep.apply_rotary_pos_emb(k, freqs, "sbhd")
        return self.proj(self.core_attention(q, k, v))


class _TorchLayer(torch.nn.Module):
    def __init__(self, normalization, activation):
        super().__init__()
        self.self_attention = _TorchMHA(normalization)
        self.layernorm_mlp = tep.LayerNormMLP(HIDDEN, FFN, normalization=normalization, activation=activation)

    def forward(self, x, freqs):
        x1 = x + self.self_attention(x, freqs)
        return x1 + self.layernorm_mlp(x1)


RECIPES = {
    "high_precision": None,
    "float8_current": te.recipe.Float8CurrentScaling(),
    "mxfp8": te.recipe.MXFP8BlockScaling(),
}


def _bytes_equal(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{what}: max diff {np.max(np.abs(a - b))}"


@pytest.mark.parametrize("normalization,activation", [("LayerNorm", "gelu"), ("RMSNorm", "swiglu")])
@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
def test_transformer_layer_same_bytes_in_torch_and_jax(recipe_name, normalization, activation):
    recipe = RECIPES[recipe_name]
    torch.manual_seed(0)
    layer = _TorchLayer(normalization, activation)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((S, B, HIDDEN)).astype(np.float32)
    dy = rng.standard_normal((S, B, HIDDEN)).astype(np.float32)
    freqs_t = tep.RotaryPositionEmbedding(D, rotary_percent=0.5)(S)
    freqs_j = tej.RotaryPositionEmbedding(D, rotary_percent=0.5)(S)

    xt = torch.tensor(x, requires_grad=True)
    if recipe is None:
        yt = layer(xt, freqs_t)
    else:
        with tep.autocast(recipe):
            yt = layer(xt, freqs_t)
    yt.backward(torch.tensor(dy))
    torch_grads = {name: p.grad for name, p in layer.named_parameters()}

    module = TransformerLayer(hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
                              num_gqa_groups=GROUPS, normalization=normalization, activation=activation,
                              hidden_dropout=0.0, attention_dropout=0.0, recipe=recipe)
    params = tej.params_from_torch(layer.state_dict())

    def run(p, v):
        return module.apply({"params": p}, v, rotary_pos_emb=freqs_j)

    yj, vjp = jax.vjp(jax.jit(run), params, jnp.asarray(x))
    gp, gx = vjp(jnp.asarray(dy))
    _bytes_equal(yt.detach().numpy(), yj, "out")
    _bytes_equal(xt.grad.numpy(), gx, "dx")
    flat = tej.params_to_torch(gp)
    assert set(flat) == set(torch_grads)
    for name, g in torch_grads.items():
        _bytes_equal(g.numpy(), flat[name].numpy(), f"grad {name}")


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
def test_tep_transformer_layer_same_bytes_with_dropout(recipe_name, fmt):
    recipe = RECIPES[recipe_name]
    normalization, activation = ("RMSNorm", "swiglu") if fmt == "bshd" else ("LayerNorm", "gelu")
    mask = "padding_causal" if fmt == "thd" else "causal"
    kw = dict(num_gqa_groups=GROUPS, hidden_dropout=0.1, attention_dropout=0.1, normalization=normalization,
              activation=activation, self_attn_mask_type=mask, attn_input_format=fmt)
    torch.manual_seed(0)
    layer = tep.TransformerLayer(HIDDEN, FFN, HEADS, seed=11, **kw)
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
        yt = layer(xt, cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t)
    yt.backward(torch.tensor(dy))
    torch_grads = {name: p.grad for name, p in layer.named_parameters()}

    module = TransformerLayer(hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS, recipe=recipe,
                              **kw)
    params = tej.params_from_torch(layer.state_dict())
    cu_j = None if cu is None else jnp.asarray(cu)

    def run(p, v):
        return module.apply({"params": p}, v, cu_seqlens_q=cu_j, deterministic=False, dropout_rngs=dropout_rngs)

    yj, vjp = jax.vjp(jax.jit(run), params, jnp.asarray(x))
    gp, gx = vjp(jnp.asarray(dy))
    _bytes_equal(yt.detach().numpy(), yj, "out")
    _bytes_equal(xt.grad.numpy(), gx, "dx")
    flat = tej.params_to_torch(gp)
    assert set(flat) == set(torch_grads)
    for name, g in torch_grads.items():
        _bytes_equal(g.numpy(), flat[name].numpy(), f"grad {name}")

"""TransformerLayer across frameworks: the same weights give the same output bytes and gradients
(input and every parameter) in twinengine.jax.flax.TransformerLayer and the torch side, high
precision and under Float8CurrentScaling and MXFP8BlockScaling, with GQA and rotary embeddings.

The torch side is a composition of twinengine.pytorch's LayerNormLinear, DotProductAttention,
apply_rotary_pos_emb, Linear and LayerNormMLP with TE's submodule names (docs/attention.md §11),
whose state_dict converts with params_from_torch."""

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

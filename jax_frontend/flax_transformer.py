"""Flax (linen) MultiHeadAttention and TransformerLayer (TE-JAX names), built from the Flax
LayerNormDenseGeneral, LayerNormMLP and DotProductAttention modules and twinengine.jax's
apply_rotary_pos_emb — the twins of twinengine.pytorch's MultiheadAttention and TransformerLayer,
re-exported by ``twinengine.jax.flax``; ``twinengine.jax.multi_head_attention`` /
``transformer_layer`` are these modules applied to an explicit parameter tree (one implementation).

Parameters carry the torch modules' names and layouts (TE's): TransformerLayer
``self_attention.layernorm_qkv.{layer_norm_weight, layer_norm_bias, weight, bias}`` (the fused QKV
weight's rows ordered [Q; K; V], K and V num_gqa_groups · head_dim rows each),
``self_attention.proj.{weight, bias}``, ``layernorm_mlp.{layer_norm_weight, layer_norm_bias,
fc1_weight, fc1_bias, fc2_weight, fc2_bias}``; a MultiHeadAttention without input layernorm has
``qkv.{weight, bias}``. ``twinengine.jax.params_from_torch(module.state_dict())`` gives the
nested ``"params"`` collection and both frameworks give the same bytes.

Dropout (``deterministic=False``): the attention probabilities (``attention_dropout``) and each
hidden output before its residual add (``hidden_dropout``) draw [seed, offset] from the
``"dropout"`` RNG stream, or take them from ``dropout_rngs=`` ({"attention": .., "attention_hidden": ..,
"mlp_hidden": ..}, each an integer (2,) array). The torch TransformerLayer's streams map onto them:
"attention" = ``self_attention.core_attention.rng_state`` [seed, m], "attention_hidden" /
"mlp_hidden" = [seed, n] / [seed, n + 1] of ``hidden_dropout_op.rng_state`` [seed, n] (the state
before the torch forward) — the same bytes. DelayedScaling state lives in the ``"fp8_meta"``
collection of each Linear, as in the Flax blocks.
"""

from __future__ import annotations

import contextlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..fusion.blocks import attention_heads, check_attention_block, normalization_kind
from ..fusion.ops import check_dropout_p
from ..linear import linear_quantizers
from ..recipe import DelayedScaling, Recipe
from ..te_migration import as_recipe
from ._ops.dense import delayed_scaling_state, dense
from .attention import DotProductAttention
from .autocast import autocast, current_recipe
from .flax_blocks import FP8_META, LayerNormDenseGeneral, LayerNormMLP, _lecun
from .ops import AddExtraInput, Dropout, run_ops
from .rope import apply_rotary_pos_emb


class _Linear(nn.Module):
    """tep.Linear's twin with its parameter names and layout: ``weight`` (features, K), ``bias``
    (features,) — ``tej.dense(x, weight.T, bias)`` under the recipe (same bytes as tep.Linear)."""

    features: int
    use_bias: bool = True
    recipe: Recipe | None = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, rng=None):
        weight = self.param("weight", _lecun, (self.features, x.shape[-1]), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype) if self.use_bias else None
        recipe = self.recipe if self.recipe is not None else current_recipe()
        if recipe is None:
            return dense(x, weight.T, bias, recipe=None)
        recipe = as_recipe(recipe, "Linear")
        if rng is None and linear_quantizers(recipe).needs_rng:
            rng = jax.random.bits(self.make_rng("stochastic_rounding"), (2,), jnp.uint32)
        if isinstance(recipe, DelayedScaling):
            state = self.variable(FP8_META, "delayed_scaling", delayed_scaling_state, recipe.amax_history_len)
            y, after = dense(x, weight.T, bias, recipe=recipe, state=state.value, rng=rng)
            if self.is_mutable_collection(FP8_META) and not self.is_initializing():
                state.value = after
            return y
        return dense(x, weight.T, bias, recipe=recipe, rng=rng)


def _rng(module: nn.Module, rngs, name: str):
    if rngs is not None and rngs.get(name) is not None:
        return jnp.asarray(rngs[name])
    return jax.random.bits(module.make_rng("dropout"), (2,), jnp.uint32)


def residual_dropout_add(branch, residual, p: float, rng, training: bool):
    """fl(dropout(branch) + residual): the Dropout and AddExtraInput basic ops (NUMERICS.md §11), as
    twinengine.pytorch.TransformerLayer runs them — the same bytes for the same [seed, offset]."""
    active = training and p > 0
    return run_ops([Dropout(p), AddExtraInput()], [(), ()], branch, [residual], rngs=[rng if active else None, None],
                   training=active)


class MultiHeadAttention(nn.Module):
    """Self-attention: (norm →) fused QKV projection → rotary embedding of Q and K → DotProductAttention
    → output projection — twinengine.pytorch.MultiheadAttention's twin (same bytes).

    Shapes: x (s, b, hidden) for qkv_format "sbhd", (b, s, hidden) for "bshd", (T, hidden) for "thd"
        (with cu_seqlens_q / kv); returns x's shape. head_dim = kv_channels (default hidden // heads).
    Params: ``layernorm_qkv.{layer_norm_weight, layer_norm_bias, weight, bias}`` with
        input_layernorm, else ``qkv.{weight, bias}``; ``proj.{weight, bias}``. QKV weight rows
        [Q (heads · head_dim); K (groups · head_dim); V (groups · head_dim)].
    Returns: out, or (out, normalized input) with ``return_layernorm_output`` (input_layernorm only).
    Call: ``rotary_pos_emb`` = freqs (s, 1, 1, d2) for Q and K, or a (q_freqs, k_freqs) pair;
        ``seqlens_q/kv`` (padding masks), ``cu_seqlens_q/kv`` (thd; kv defaults to q), ``deterministic``, ``dropout_rngs``.
    Raises:
        ValueError: the torch module's core checks with the same text (core/fusion/blocks.py, op name
            "MultiheadAttention"): head counts, GQA groups, kv_channels, layout, mask type / window,
            normalization; plus the errors of the ops it calls.
    """

    hidden_size: int
    num_attention_heads: int
    num_gqa_groups: int | None = None
    kv_channels: int | None = None
    attention_dropout: float = 0.1
    attn_mask_type: str = "causal"
    window_size: Any = None
    qkv_format: str = "sbhd"
    input_layernorm: bool = True
    return_layernorm_output: bool = False
    normalization: str = "LayerNorm"
    layernorm_epsilon: float = 1e-5
    zero_centered_gamma: bool = False
    use_bias: bool = True
    softmax_scale: float | None = None
    recipe: Recipe | None = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, *, rotary_pos_emb=None, seqlens_q=None, seqlens_kv=None, cu_seqlens_q=None,
                 cu_seqlens_kv=None, deterministic: bool = True, dropout_rngs=None):
        op = "MultiheadAttention"  # the torch module's name: the error texts are shared
        check_attention_block(op, True, self.qkv_format, self.attn_mask_type, self.window_size, self.input_layernorm,
                              self.return_layernorm_output)
        d, groups, width = attention_heads(op, self.hidden_size, self.num_attention_heads, self.kv_channels,
                                           self.num_gqa_groups)
        normalization_kind(self.normalization)
        heads = self.num_attention_heads
        if cu_seqlens_kv is None:
            cu_seqlens_kv = cu_seqlens_q
        if self.input_layernorm:
            qkv = LayerNormDenseGeneral(features=width, use_bias=self.use_bias, epsilon=self.layernorm_epsilon,
                                        normalization=self.normalization, zero_centered_gamma=self.zero_centered_gamma,
                                        return_layernorm_output=self.return_layernorm_output, recipe=self.recipe,
                                        param_dtype=self.param_dtype, name="layernorm_qkv")(x)
            if self.return_layernorm_output:
                qkv, ln_out = qkv
        else:
            qkv = _Linear(width, self.use_bias, self.recipe, self.param_dtype, name="qkv")(x)
        lead = x.shape[:-1]
        q = qkv[..., : heads * d].reshape(lead + (heads, d))
        k = qkv[..., heads * d: (heads + groups) * d].reshape(lead + (groups, d))
        v = qkv[..., (heads + groups) * d:].reshape(lead + (groups, d))
        if rotary_pos_emb is not None:
            q_freqs, k_freqs = rotary_pos_emb if isinstance(rotary_pos_emb, (tuple, list)) else (rotary_pos_emb,) * 2
            q = apply_rotary_pos_emb(q, q_freqs, self.qkv_format, cu_seqlens=cu_seqlens_q)
            k = apply_rotary_pos_emb(k, k_freqs, self.qkv_format, cu_seqlens=cu_seqlens_kv)
        use_dropout = not deterministic and self.attention_dropout > 0
        # The module's recipe (when given) is the attention's too: FP8 attention under fp8_dpa / fp8_mha.
        region = autocast(as_recipe(self.recipe, "MultiHeadAttention")) if self.recipe is not None \
            else contextlib.nullcontext()
        with region:
            ctx = DotProductAttention(head_dim=d, num_attention_heads=heads, num_gqa_groups=groups,
                                      attention_dropout=self.attention_dropout, attn_mask_type=self.attn_mask_type,
                                      qkv_layout=self.qkv_format, window_size=self.window_size,
                                      scale_factor=self.softmax_scale, name="core_attention")(
                q, k, v, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_kv=cu_seqlens_kv, deterministic=deterministic,
                rng=_rng(self, dropout_rngs, "attention") if use_dropout else None)
        ctx = ctx.reshape(lead + (heads * d,))
        out = _Linear(self.hidden_size, self.use_bias, self.recipe, self.param_dtype, name="proj")(ctx)
        return (out, ln_out) if self.return_layernorm_output else out


class TransformerLayer(nn.Module):
    """Pre-norm transformer block: x1 = x + dropout(MultiHeadAttention(x)); out = x1 +
    dropout(LayerNormMLP(x1)) — twinengine.pytorch.TransformerLayer's twin (same bytes).

    Shapes: x (s, b, hidden) for attn_input_format "sbhd", (b, s, hidden) "bshd", (T, hidden)
        "thd" (with cu_seqlens_q / cu_seqlens_kv and a padding mask type); returns x's shape.
    Params: ``self_attention.layernorm_qkv.*``, ``self_attention.proj.*``, ``layernorm_mlp.*``
        (module docstring). ``activation`` is any name of twinengine.ops.activation.ACTIVATIONS
        (gated ones double fc1's width).
    Call: ``rotary_pos_emb``, ``seqlens_q/kv``, ``cu_seqlens_q/kv``, ``deterministic`` (False: dropout),
        ``dropout_rngs`` (explicit [seed, offset] per dropout site, else the "dropout" stream).
    """

    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_gqa_groups: int | None = None
    kv_channels: int | None = None
    layernorm_epsilon: float = 1e-5
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    self_attn_mask_type: str = "causal"
    window_size: Any = None
    normalization: str = "LayerNorm"
    zero_centered_gamma: bool = False
    activation: str = "gelu"
    activation_params: dict | None = None
    attn_input_format: str = "sbhd"
    use_bias: bool = True
    softmax_scale: float | None = None
    recipe: Recipe | None = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, *, rotary_pos_emb=None, seqlens_q=None, seqlens_kv=None, cu_seqlens_q=None,
                 cu_seqlens_kv=None, deterministic: bool = True, dropout_rngs=None):
        p = check_dropout_p(self.hidden_dropout)
        attn = MultiHeadAttention(
            hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
            num_gqa_groups=self.num_gqa_groups, kv_channels=self.kv_channels,
            attention_dropout=self.attention_dropout, attn_mask_type=self.self_attn_mask_type,
            window_size=self.window_size, qkv_format=self.attn_input_format, input_layernorm=True,
            normalization=self.normalization, layernorm_epsilon=self.layernorm_epsilon,
            zero_centered_gamma=self.zero_centered_gamma, use_bias=self.use_bias, softmax_scale=self.softmax_scale,
            recipe=self.recipe, param_dtype=self.param_dtype, name="self_attention")(
            x, rotary_pos_emb=rotary_pos_emb, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, deterministic=deterministic, dropout_rngs=dropout_rngs)
        training = not deterministic and p > 0
        x1 = residual_dropout_add(attn, x, p, _rng(self, dropout_rngs, "attention_hidden") if training else None,
                                  training)
        mlp = LayerNormMLP(intermediate_dim=self.ffn_hidden_size, use_bias=self.use_bias, activation=self.activation,
                           activation_params=self.activation_params, epsilon=self.layernorm_epsilon,
                           normalization=self.normalization, zero_centered_gamma=self.zero_centered_gamma,
                           recipe=self.recipe, param_dtype=self.param_dtype, name="layernorm_mlp")(x1)
        return residual_dropout_add(mlp, x1, p, _rng(self, dropout_rngs, "mlp_hidden") if training else None,
                                    training)


def _apply(module: nn.Module, x, params, fp8_meta, call_kw):
    variables = {"params": params}
    if fp8_meta is not None:
        variables[FP8_META] = fp8_meta
        out, updates = module.apply(variables, x, mutable=[FP8_META], **call_kw)
        return out, updates[FP8_META]
    return module.apply(variables, x, **call_kw)


def multi_head_attention(x, params, *, fp8_meta=None, rotary_pos_emb=None, seqlens_q=None, seqlens_kv=None,
                         cu_seqlens_q=None, cu_seqlens_kv=None, deterministic: bool = True, dropout_rngs=None,
                         **config):
    """``MultiHeadAttention(**config)`` applied to the parameter tree `params` (the nested dict
    ``params_from_torch`` gives): returns out, or (out, new_fp8_meta) when the DelayedScaling
    ``fp8_meta`` collection is given. Dropout (``deterministic=False``) takes its [seed, offset]
    arrays from ``dropout_rngs`` ({"attention": ...})."""
    call_kw = dict(rotary_pos_emb=rotary_pos_emb, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, deterministic=deterministic,
                   dropout_rngs=dropout_rngs)
    return _apply(MultiHeadAttention(**config), x, params, fp8_meta, call_kw)


def transformer_layer(x, params, *, fp8_meta=None, rotary_pos_emb=None, seqlens_q=None, seqlens_kv=None,
                      cu_seqlens_q=None, cu_seqlens_kv=None, deterministic: bool = True, dropout_rngs=None,
                      **config):
    """``TransformerLayer(**config)`` applied to the parameter tree `params`: returns out, or
    (out, new_fp8_meta) when the DelayedScaling ``fp8_meta`` collection is given. Dropout
    (``deterministic=False``) takes its [seed, offset] arrays from ``dropout_rngs`` ({"attention": ...,
    "attention_hidden": ..., "mlp_hidden": ...})."""
    call_kw = dict(rotary_pos_emb=rotary_pos_emb, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, deterministic=deterministic,
                   dropout_rngs=dropout_rngs)
    return _apply(TransformerLayer(**config), x, params, fp8_meta, call_kw)

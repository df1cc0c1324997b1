"""twinengine.jax dot_product_attention: a custom_vjp over the attention_fwd / attention_bwd FFI ops.

Forward saves out and lse; backward is attention_bwd with the forward's arguments (and rng, so dropout
masks agree). Same bytes as twinengine.pytorch.DotProductAttention (one CPU kernel, docs/attention.md).
jit-, grad- and vmap-clean. Errors come from core/ops/attention.py (same text as the torch frontend)."""

from __future__ import annotations

from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..recipe import uses_fp8_attention
from ._ops.attention import attention_bwd, attention_fwd
from .autocast import current_recipe


@partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11, 12))
def _dpa(q, k, v, seqlens_q, seqlens_kv, rng, cu_seqlens, mask_type, window_size, softmax_scale, dropout_p,
         qkv_format, fp8):
    out, _ = _dpa_fwd(q, k, v, seqlens_q, seqlens_kv, rng, cu_seqlens, mask_type, window_size, softmax_scale,
                      dropout_p, qkv_format, fp8)
    return out


def _kw(seqlens_q, seqlens_kv, rng, cu_seqlens, mask_type, window_size, softmax_scale, dropout_p, qkv_format,
        fp8):
    cu_q, cu_kv = cu_seqlens if cu_seqlens is not None else (None, None)
    return dict(mask_type=mask_type, window_size=window_size, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                softmax_scale=softmax_scale, dropout_p=dropout_p, rng=rng, qkv_format=qkv_format,
                cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, fp8=fp8)


def _dpa_fwd(q, k, v, seqlens_q, seqlens_kv, rng, cu_seqlens, mask_type, window_size, softmax_scale, dropout_p,
             qkv_format, fp8):
    kw = _kw(seqlens_q, seqlens_kv, rng, cu_seqlens, mask_type, window_size, softmax_scale, dropout_p, qkv_format,
             fp8)
    out, lse = attention_fwd(q, k, v, **kw)
    return out, (q, k, v, out, lse, seqlens_q, seqlens_kv, rng, cu_seqlens)


def _dpa_bwd(mask_type, window_size, softmax_scale, dropout_p, qkv_format, fp8, res, dout):
    q, k, v, out, lse, seqlens_q, seqlens_kv, rng, cu_seqlens = res
    kw = _kw(seqlens_q, seqlens_kv, rng, cu_seqlens, mask_type, window_size, softmax_scale, dropout_p, qkv_format,
             fp8)
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, **kw)
    return dq, dk, dv, None, None, None, (None if cu_seqlens is None else (None, None))


_dpa.defvjp(_dpa_fwd, _dpa_bwd)


def dot_product_attention(query, key, value, *, attn_mask_type: str = "causal", window_size=None,
                          seqlens_q=None, seqlens_kv=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                          softmax_scale: float | None = None, dropout_probability: float = 0.0, rng=None,
                          qkv_format: str = "bshd"):
    """Scaled dot-product attention, differentiable in query, key and value (custom_vjp).

    Shapes as twinengine.jax attention_fwd: bshd (B,S,H,D), sbhd (S,B,H,D), thd (T,H,D) with int32
    cu_seqlens_q / cu_seqlens_kv; returns out with q's layout and (..., H, D_v) last dims. Dropout
    (dropout_probability > 0) needs rng = [seed, offset] (the Philox stream of docs/attention.md).
    Under ``tej.autocast(recipe)`` with ``fp8_dpa`` / ``fp8_mha`` set (DelayedScaling,
    Float8CurrentScaling) it is FP8 attention (docs/attention.md §9), else high precision.
    """
    window = tuple(window_size) if window_size is not None else None
    cu = None if cu_seqlens_q is None and cu_seqlens_kv is None else (cu_seqlens_q, cu_seqlens_kv)
    return _dpa(query, key, value, seqlens_q, seqlens_kv, rng if dropout_probability > 0 else None, cu,
                attn_mask_type, window, softmax_scale, float(dropout_probability), qkv_format,
                uses_fp8_attention(current_recipe()))


class DotProductAttention(nn.Module):
    """Flax DotProductAttention (TE-JAX name): no parameters; ``__call__(query, key, value, ...)`` is
    ``dot_product_attention`` in the torch module's layout (bshd / sbhd / thd), returning (..., H, D_v)
    like TE-JAX. Dropout (``deterministic=False`` and attention_dropout > 0) draws [seed, offset] from
    the ``"dropout"`` RNG stream (jax.random.bits, uint32), unless ``rng=`` is given."""

    head_dim: int
    num_attention_heads: int
    num_gqa_groups: int | None = None
    attention_dropout: float = 0.0
    attn_mask_type: str = "causal"
    qkv_layout: str = "bshd"
    window_size: Any = None
    scale_factor: float | None = None

    @nn.compact
    def __call__(self, query, key, value, *, seqlens_q=None, seqlens_kv=None, cu_seqlens_q=None,
                 cu_seqlens_kv=None, deterministic: bool = True, rng=None):
        groups = self.num_attention_heads if self.num_gqa_groups is None else self.num_gqa_groups
        if self.num_attention_heads % groups != 0:
            raise ValueError(f"DotProductAttention: num_attention_heads ({self.num_attention_heads}) must be "
                             f"divisible by num_gqa_groups ({groups})")
        p = 0.0 if deterministic else float(self.attention_dropout)
        if p > 0.0 and rng is None:
            rng = jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32)
        return dot_product_attention(query, key, value, attn_mask_type=self.attn_mask_type,
                                     window_size=self.window_size, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                                     cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                                     softmax_scale=self.scale_factor, dropout_probability=p, rng=rng,
                                     qkv_format=self.qkv_layout)

"""DotProductAttention (TE's name and arguments) over torch.ops.twinengine.attention_fwd / _bwd.

One torch.autograd.Function: forward saves out and lse, backward calls attention_bwd with the forward's
arguments (and the forward's rng, so dropout masks agree). Numerics: docs/attention.md."""

from __future__ import annotations

import torch

from ...recipe import uses_fp8_attention
from .._ops.attention import attention_bwd, attention_fwd
from .._state import draw_rng_checkpointable
from ..autocast import current_recipe


class _DotProductAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, seqlens_q, seqlens_kv, rng, cu_seqlens_q, cu_seqlens_kv, mask_type, window_size,
                softmax_scale, dropout_p, qkv_format, fp8):
        out, lse = attention_fwd(q, k, v, mask_type=mask_type, window_size=window_size, seqlens_q=seqlens_q,
                                 seqlens_kv=seqlens_kv, softmax_scale=softmax_scale, dropout_p=dropout_p, rng=rng,
                                 qkv_format=qkv_format, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                                 fp8=fp8)
        ctx.save_for_backward(q, k, v, out, lse, seqlens_q, seqlens_kv, rng, cu_seqlens_q, cu_seqlens_kv)
        ctx.kw = dict(mask_type=mask_type, window_size=window_size, softmax_scale=softmax_scale,
                      dropout_p=dropout_p, qkv_format=qkv_format, fp8=fp8)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, seqlens_q, seqlens_kv, rng, cu_seqlens_q, cu_seqlens_kv = ctx.saved_tensors
        dq, dk, dv = attention_bwd(dout.contiguous(), q, k, v, out, lse, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                                   rng=rng, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, **ctx.kw)
        return (dq, dk, dv) + (None,) * 11


class DotProductAttention(torch.nn.Module):
    """Scaled dot-product attention module (TE's ``DotProductAttention`` arguments).

    Guarantees: forward and backward are the CPU kernel of docs/attention.md (same bytes as
    twinengine.jax); gradients flow to query, key and value. Dropout (training only) draws from the
    Philox stream of the module's ``rng_state`` buffer [seed, offset]; every dropout forward uses
    the current state and then advances offset by 1 (deterministic, checkpointed with the module;
    under ``torch.utils.checkpoint`` the recomputed forward reuses the first run's draw).
    Under ``tep.autocast(recipe)`` with a recipe whose ``fp8_dpa`` / ``fp8_mha`` is set
    (DelayedScaling, Float8CurrentScaling) forward and backward are FP8 attention
    (docs/attention.md §9); otherwise high precision.
    Errors come from core/ops/attention.py (same text as the JAX frontend).
    """

    def __init__(self, num_attention_heads: int, kv_channels: int, num_gqa_groups: int | None = None,
                 attention_dropout: float = 0.0, attn_mask_type: str = "causal", window_size=None,
                 qkv_format: str = "bshd", softmax_scale: float | None = None, seed: int = 0):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.kv_channels = kv_channels
        self.num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if num_attention_heads % self.num_gqa_groups != 0:
            raise ValueError(f"DotProductAttention: num_attention_heads ({num_attention_heads}) must be divisible "
                             f"by num_gqa_groups ({self.num_gqa_groups})")
        self.attention_dropout = float(attention_dropout)
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.qkv_format = qkv_format
        self.softmax_scale = softmax_scale
        self.register_buffer("rng_state", torch.tensor([seed, 0], dtype=torch.int64))

    def forward(self, query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None,
                cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None,
                attn_mask_type=None, window_size=None, seqlens_q=None, seqlens_kv=None):
        """query (B,S,H,D) for bshd, (S,B,H,D) for sbhd, (T,H,D) for thd; returns (..., H*D_v) flattened
        heads like TE. ``attention_mask`` (padding types): bool (B,1,1,S) with True = masked (TE), converted
        to per-sequence lengths (the mask must be a right-padding mask)."""
        fmt = qkv_format or self.qkv_format
        mask_type = attn_mask_type or self.attn_mask_type
        window = window_size if window_size is not None else self.window_size
        if attention_mask is not None:
            if "padding" not in mask_type:
                raise ValueError(f"DotProductAttention: attention_mask needs a padding mask type, got {mask_type!r}")
            masks = attention_mask if isinstance(attention_mask, tuple) else (attention_mask, attention_mask)
            lens = []
            for m, x in zip(masks, (query_layer, key_layer)):
                b = x.shape[1] if fmt == "sbhd" else x.shape[0]
                s = x.shape[0] if fmt == "sbhd" else x.shape[1]
                if m.dim() != 4 or tuple(m.shape) != (b, 1, 1, s):
                    raise ValueError(f"DotProductAttention: attention_mask must have shape ({b}, 1, 1, {s}), "
                                     f"got {tuple(m.shape)}")
                lens.append((~m).reshape(b, s).sum(dim=1).to(torch.int32))
            seqlens_q, seqlens_kv = lens
        dropout_p = self.attention_dropout if self.training else 0.0
        rng = None
        if dropout_p > 0.0:  # drawn once per forward; a checkpoint recompute replays the same draw
            rng = draw_rng_checkpointable(self, (query_layer, key_layer, value_layer))
        out = _DotProductAttentionFn.apply(query_layer, key_layer, value_layer, seqlens_q, seqlens_kv, rng,
                                           cu_seqlens_q, cu_seqlens_kv, mask_type, window, self.softmax_scale,
                                           dropout_p, fmt, uses_fp8_attention(current_recipe()))
        return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])

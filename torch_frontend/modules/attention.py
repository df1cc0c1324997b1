"""DotProductAttention (TE's name and arguments) over torch.ops.twinengine.attention_fwd / _bwd, and
MultiheadAttention built from it and the projection modules.

One torch.autograd.Function: forward saves out and lse, backward calls attention_bwd with the forward's
arguments (and the forward's rng, so dropout masks agree). Numerics: docs/attention.md."""

from __future__ import annotations

import torch

from ...fusion.blocks import attention_heads, check_attention_block, normalization_kind
from ...recipe import uses_fp8_attention
from .._ops.attention import attention_bwd, attention_fwd
from .._ops.rope import apply_rotary_pos_emb
from .._state import draw_rng, is_recompute, may_be_recomputed, record_call, replayed_call
from ..autocast import current_recipe
from ..te_migration import load_te_attention_hook, load_te_mha_hook
from .linear import Linear
from .normalization import LayerNormLinear


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
    under ``torch.utils.checkpoint`` the recomputed forward reuses the first run's draw and its
    FP8-attention choice, whether the autocast region is inside or outside the checkpoint).
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
        self.register_load_state_dict_pre_hook(load_te_attention_hook)  # TE checkpoints (te_migration.py)

    def _call_state(self, dropout: bool, inputs: tuple[torch.Tensor, ...]) -> tuple[bool, torch.Tensor | None]:
        """(fp8, rng) of this call: FP8 attention when the autocast recipe asks for it, the dropout
        rng drawn once (offset advanced by one). Eager activation checkpointing: a forward that
        may be recomputed records the pair; the recompute (run by the backward, where the autocast
        region and the rng offset have moved on) replays it. Compiled: the traced graph holds both."""
        if torch.compiler.is_compiling():
            return uses_fp8_attention(current_recipe()), draw_rng(self) if dropout else None
        if is_recompute():
            return replayed_call(self, inputs)
        fp8, rng = uses_fp8_attention(current_recipe()), draw_rng(self) if dropout else None
        if may_be_recomputed():
            record_call(self, inputs, (fp8, None if rng is None else rng.clone()))
        return fp8, rng

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
        # autograd.Function.apply under Dynamo takes distinct tensors: a repeated one (self-attention's
        # q = k = v, one cu_seqlens for q and kv) goes in as a copy
        key_layer = key_layer.clone() if key_layer is query_layer else key_layer
        value_layer = value_layer.clone() if value_layer is query_layer or value_layer is key_layer else value_layer
        if seqlens_kv is not None and seqlens_kv is seqlens_q:
            seqlens_kv = seqlens_kv.clone()
        if cu_seqlens_kv is not None and cu_seqlens_kv is cu_seqlens_q:
            cu_seqlens_kv = cu_seqlens_kv.clone()
        dropout_p = self.attention_dropout if self.training else 0.0
        fp8, rng = self._call_state(dropout_p > 0.0, (query_layer, key_layer, value_layer))
        out = _DotProductAttentionFn.apply(query_layer, key_layer, value_layer, seqlens_q, seqlens_kv, rng,
                                           cu_seqlens_q, cu_seqlens_kv, mask_type, window, self.softmax_scale,
                                           dropout_p, fmt, fp8)
        return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])


class MultiheadAttention(torch.nn.Module):
    """TE's ``te.MultiheadAttention`` (self-attention): fused QKV projection, scaled dot-product
    attention, output projection — one implementation built from ``LayerNormLinear`` (with
    ``input_layernorm``) or ``Linear``, ``apply_rotary_pos_emb`` of Q and K (with
    ``rotary_pos_emb``), ``DotProductAttention`` and ``Linear``.

    Shapes: hidden_states (S, B, hidden_size) for ``qkv_format="sbhd"`` (TE's default),
        (B, S, hidden_size) for "bshd", (T, hidden_size) packed sequences for "thd" (with
        ``cu_seqlens_q`` / ``cu_seqlens_kv`` and a padding mask type); output of the same shape.
        H = num_attention_heads query heads and G = num_gqa_groups key/value heads (G = H: MHA,
        G = 1: MQA) of D = kv_channels channels each (default hidden_size / H).
    Parameters (TE's fused names, ``fuse_qkv_params=True``): with ``input_layernorm``
        ``layernorm_qkv.layer_norm_weight``, ``layernorm_qkv.layer_norm_bias`` (LayerNorm only),
        ``layernorm_qkv.weight`` ((H + 2G)·D, hidden_size), ``layernorm_qkv.bias``; without it
        ``qkv.weight``, ``qkv.bias``; then ``proj.weight`` (hidden_size, H·D), ``proj.bias``.
        The QKV rows are ordered [Q; K; V] (H·D, G·D, G·D rows; within each, head-major) — TE's
        layout with ``qkv_weight_interleaved=False`` (the Flax modules' layout). With
        ``qkv_weight_interleaved=True`` (TE's default) they are grouped per kv head instead:
        for g < G, the H/G query heads of group g, then its key head, then its value head
        (a reordering only: the same values as the [Q; K; V] layout with rows permuted).
    Checkpoints: a TE MultiheadAttention state dict of these names loads (``te_migration.py``:
        the projections' delayed-scaling state; TE's FP8-attention metadata is dropped), and so
        does one saved with TE's default ``fuse_qkv_params=False`` (``layernorm_qkv.`` / ``qkv.``
        ``{query,key,value}_{weight,bias}``): the parts are concatenated into the fused rows
        [Q; K; V] (TE's split layout is never interleaved, so that needs
        ``qkv_weight_interleaved=False``). The module itself only holds the fused parameter:
        ``fuse_qkv_params=False`` at construction stays refused.
    Dtypes: parameters in ``params_dtype``; the computation follows the sub-modules.
    Numerics: the projections are ``LayerNormLinear`` / ``Linear`` (quantized by the
        ``tep.autocast`` recipe, NUMERICS.md); attention is ``DotProductAttention``
        (docs/attention.md; FP8 attention under a recipe with ``fp8_dpa`` / ``fp8_mha``). The
        result equals running those modules one after another with the same parameters.
    RNG: attention dropout (training only, ``attention_dropout``, TE's default 0.1) draws from
        ``core_attention.rng_state`` = [seed, offset], advanced by one per training forward.
    Returns: the output, or (output, normalized input) with ``return_layernorm_output``.
    Raises:
        ValueError: from the core checks (core/fusion/blocks.py): hidden_size not divisible by
        num_attention_heads without kv_channels, num_attention_heads not divisible by
        num_gqa_groups, unknown normalization / qkv_format / attn_mask_type, a window
        contradicting the mask type, ``fuse_qkv_params=False``; input errors from the sub-modules.
        ValueError (load_state_dict): a split-QKV TE state dict with ``qkv_weight_interleaved=True``.
    """

    def __init__(self, hidden_size: int, num_attention_heads: int, kv_channels: int | None = None,
                 attention_dropout: float = 0.1, layernorm_epsilon: float = 1e-5, *, attn_mask_type: str = "causal",
                 window_size=None, num_gqa_groups: int | None = None, return_layernorm_output: bool = False,
                 input_layernorm: bool = False, fuse_qkv_params: bool = True, qkv_weight_interleaved: bool = False,
                 zero_centered_gamma: bool = False,
                 bias: bool = True, normalization: str = "LayerNorm", qkv_format: str = "sbhd",
                 softmax_scale: float | None = None, params_dtype: torch.dtype = torch.float32, device=None,
                 amax_history_len: int = 1024, seed: int = 0) -> None:
        super().__init__()
        op = "MultiheadAttention"
        check_attention_block(op, fuse_qkv_params, qkv_format, attn_mask_type, window_size, input_layernorm,
                              return_layernorm_output)
        kv_channels, num_gqa_groups, qkv_width = attention_heads(op, hidden_size, num_attention_heads, kv_channels,
                                                                 num_gqa_groups)
        normalization_kind(normalization)
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_gqa_groups
        self.kv_channels = kv_channels
        self.qkv_format = qkv_format
        self.qkv_weight_interleaved = bool(qkv_weight_interleaved)
        self.input_layernorm = input_layernorm
        self.return_layernorm_output = return_layernorm_output
        if input_layernorm:
            self.layernorm_qkv = LayerNormLinear(hidden_size, qkv_width, layernorm_epsilon, bias=bias,
                                                 normalization=normalization,
                                                 return_layernorm_output=return_layernorm_output,
                                                 zero_centered_gamma=zero_centered_gamma, params_dtype=params_dtype,
                                                 device=device, amax_history_len=amax_history_len, rng_seed=seed)
        else:
            self.qkv = Linear(hidden_size, qkv_width, bias, params_dtype=params_dtype, device=device,
                              amax_history_len=amax_history_len, rng_seed=seed)
        self.core_attention = DotProductAttention(num_attention_heads, kv_channels, num_gqa_groups=num_gqa_groups,
                                                  attention_dropout=attention_dropout, attn_mask_type=attn_mask_type,
                                                  window_size=window_size, qkv_format=qkv_format,
                                                  softmax_scale=softmax_scale, seed=seed)
        self.proj = Linear(num_attention_heads * kv_channels, hidden_size, bias, params_dtype=params_dtype,
                           device=device, amax_history_len=amax_history_len, rng_seed=seed + 1)
        self.register_load_state_dict_pre_hook(load_te_mha_hook)  # TE split-QKV checkpoints (te_migration.py)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, attn_mask_type: str | None = None,
                window_size=None, rotary_pos_emb=None, cu_seqlens_q: torch.Tensor | None = None,
                cu_seqlens_kv: torch.Tensor | None = None, max_seqlen_q: int | None = None,
                max_seqlen_kv: int | None = None):
        """``rotary_pos_emb`` (TE's argument): fp32 angles (S_f, 1, 1, d2) from
        ``RotaryPositionEmbedding`` applied to Q and K, or a (q_freqs, k_freqs) pair; each is
        ``apply_rotary_pos_emb(·, freqs, tensor_format=qkv_format)`` on the projected heads
        (thd: positions restart at each ``cu_seqlens_q`` / ``cu_seqlens_kv`` offset).
        ``attention_mask`` / ``attn_mask_type`` / ``window_size`` / ``cu_seqlens_*`` as
        ``DotProductAttention.forward`` (per-call overrides of the constructor's values)."""
        if self.input_layernorm:
            mixed = self.layernorm_qkv(hidden_states)
            if self.return_layernorm_output:
                mixed, ln_out = mixed
        else:
            mixed = self.qkv(hidden_states)
        h, g, d = self.num_attention_heads, self.num_gqa_groups, self.kv_channels
        lead = mixed.shape[:-1]
        if self.qkv_weight_interleaved:  # rows (G, H/G + 2, D): per group its queries, key, value
            q, k, v = mixed.reshape(*lead, g, h // g + 2, d).split([h // g, 1, 1], dim=-2)
        else:  # rows [Q; K; V]
            q, k, v = mixed.split([h * d, g * d, g * d], dim=-1)
        q, k, v = q.reshape(*lead, h, d), k.reshape(*lead, g, d), v.reshape(*lead, g, d)
        if rotary_pos_emb is not None:
            q_freqs, k_freqs = rotary_pos_emb if isinstance(rotary_pos_emb, (tuple, list)) else (rotary_pos_emb,) * 2
            thd = self.qkv_format == "thd"
            q = apply_rotary_pos_emb(q, q_freqs, tensor_format=self.qkv_format,
                                     cu_seqlens=cu_seqlens_q if thd else None)
            k = apply_rotary_pos_emb(k, k_freqs, tensor_format=self.qkv_format,
                                     cu_seqlens=cu_seqlens_kv if thd else None)
        context = self.core_attention(q, k, v, attention_mask=attention_mask, attn_mask_type=attn_mask_type,
                                      window_size=window_size, cu_seqlens_q=cu_seqlens_q,
                                      cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                                      max_seqlen_kv=max_seqlen_kv)
        out = self.proj(context)
        return (out, ln_out) if self.return_layernorm_output else out

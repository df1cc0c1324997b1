"""TransformerLayer (TE's name and arguments): pre-norm self-attention and MLP blocks with residuals,
built from MultiheadAttention, LayerNormMLP and the Dropout / AddExtraInput basic ops."""

from __future__ import annotations

from typing import Any

import torch

from ...fusion.ops import check_dropout_p
from ..ops import AddExtraInput, Dropout, run_ops
from ..te_migration import load_te_transformer_hook
from .attention import MultiheadAttention
from .normalization import LayerNormMLP


class TransformerLayer(torch.nn.Module):
    """TE's ``te.TransformerLayer`` (encoder / decoder-only self-attention layer, pre-norm):

        x = x + dropout(self_attention(x))      # MultiheadAttention, input_layernorm=True
        y = x + dropout(layernorm_mlp(x))       # LayerNormMLP

    Shapes: hidden_states as ``MultiheadAttention`` in layout ``attn_input_format`` (TE's name;
        "sbhd" (S, B, hidden) default, "bshd", or "thd" (T, hidden) with ``cu_seqlens_*``);
        output of the same shape.
    Parameters (TE's names, fused QKV): ``self_attention.layernorm_qkv.{layer_norm_weight,
        layer_norm_bias,weight,bias}``, ``self_attention.proj.{weight,bias}``,
        ``layernorm_mlp.{layer_norm_weight,layer_norm_bias,fc1_weight,fc1_bias,fc2_weight,fc2_bias}``
        (no ``*layer_norm_bias`` with RMSNorm, no biases with ``bias=False``).
    Checkpoints: a TE TransformerLayer state dict of these names (``fuse_qkv_params=True``)
        loads, ``_extra_state`` entries included (``te_migration.py``); build the layer with
        ``qkv_weight_interleaved=True`` for a TE layer saved with TE's default QKV row order
        (``MultiheadAttention``'s docstring). One saved with TE's default
        ``fuse_qkv_params=False`` (``self_attention.layernorm_qkv.{query,key,value}_{weight,bias}``)
        loads too, its parts concatenated into the fused rows [Q; K; V] (build the layer with
        ``qkv_weight_interleaved=False``, which TE itself forces for split parameters).
    Dtypes: parameters in ``params_dtype``; hidden_states of that dtype.
    Numerics: each block as its module (NUMERICS.md; docs/attention.md for the attention); the
        residual adds are fl(x + r) in x's dtype (AddExtraInput); hidden dropout NUMERICS.md §11.
        Under ``tep.autocast`` the projections and MLP follow the recipe and the attention is FP8
        when the recipe sets ``fp8_dpa`` / ``fp8_mha``.
    RNG (explicit, checkpointed with the module): hidden dropout (training, ``hidden_dropout``,
        TE's default 0.1) draws the Dropout stream of the ``hidden_dropout_op.rng_state`` buffer
        [seed, offset]: a training forward uses offset n for the attention residual and n + 1
        for the MLP residual and leaves n + 2, so the two never share random bits; attention
        dropout uses ``self_attention.core_attention.rng_state`` (its own "ATTN" stream). The
        NVFP4 stochastic-rounding streams of the projections are seeded seed … seed + 3.
    Raises:
        ValueError: from the core checks (core/fusion/blocks.py, core/fusion/ops.py): head counts,
        kv_channels, GQA groups, mask type / window, layout, normalization, activation,
        dropout probabilities; input errors from the sub-modules.
    """

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
                 num_gqa_groups: int | None = None, layernorm_epsilon: float = 1e-5, hidden_dropout: float = 0.1,
                 attention_dropout: float = 0.1, *, kv_channels: int | None = None,
                 self_attn_mask_type: str = "causal", window_size=None, zero_centered_gamma: bool = False,
                 bias: bool = True, activation: str = "gelu", activation_params: dict | None = None,
                 normalization: str = "LayerNorm", attn_input_format: str = "sbhd", fuse_qkv_params: bool = True,
                 qkv_weight_interleaved: bool = False,
                 softmax_scale: float | None = None, params_dtype: torch.dtype = torch.float32, device: Any = None,
                 amax_history_len: int = 1024, seed: int = 0) -> None:
        super().__init__()
        self.hidden_dropout = check_dropout_p(hidden_dropout)
        self.self_attention = MultiheadAttention(
            hidden_size, num_attention_heads, kv_channels, attention_dropout, layernorm_epsilon,
            attn_mask_type=self_attn_mask_type, window_size=window_size, num_gqa_groups=num_gqa_groups,
            input_layernorm=True, fuse_qkv_params=fuse_qkv_params, qkv_weight_interleaved=qkv_weight_interleaved,
            zero_centered_gamma=zero_centered_gamma,
            bias=bias, normalization=normalization, qkv_format=attn_input_format, softmax_scale=softmax_scale,
            params_dtype=params_dtype, device=device, amax_history_len=amax_history_len, seed=seed)
        self.layernorm_mlp = LayerNormMLP(hidden_size, ffn_hidden_size, layernorm_epsilon, bias=bias,
                                          normalization=normalization, activation=activation,
                                          zero_centered_gamma=zero_centered_gamma,
                                          activation_params=activation_params, params_dtype=params_dtype,
                                          device=device, amax_history_len=amax_history_len, rng_seed=seed + 2)
        self.hidden_dropout_op = Dropout(self.hidden_dropout, rng_seed=seed, device=device)
        self.residual_add_op = AddExtraInput()
        self.register_load_state_dict_pre_hook(load_te_transformer_hook)  # TE checkpoints (te_migration.py)

    def _residual(self, branch: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return run_ops([self.hidden_dropout_op, self.residual_add_op], [(), ()], branch, [residual])

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, self_attn_mask_type: str | None = None,
                window_size=None, rotary_pos_emb=None, cu_seqlens_q: torch.Tensor | None = None,
                cu_seqlens_kv: torch.Tensor | None = None, max_seqlen_q: int | None = None,
                max_seqlen_kv: int | None = None) -> torch.Tensor:
        """``attention_mask`` / ``self_attn_mask_type`` / ``window_size`` / ``rotary_pos_emb`` /
        ``cu_seqlens_*`` as ``MultiheadAttention.forward`` (per-call overrides of the constructor's values)."""
        attn = self.self_attention(hidden_states, attention_mask=attention_mask, attn_mask_type=self_attn_mask_type,
                                   window_size=window_size, rotary_pos_emb=rotary_pos_emb, cu_seqlens_q=cu_seqlens_q,
                                   cu_seqlens_kv=cu_seqlens_kv,
                                   max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)
        x = self._residual(attn, hidden_states)
        return self._residual(self.layernorm_mlp(x), x)

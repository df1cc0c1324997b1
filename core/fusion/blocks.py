"""Arguments of the blocks built on basic ops (LayerNormLinear, LayerNormMLP, layernorm_dense,
layernorm_mlp): checked once here so both frontends accept and reject the same values."""

from __future__ import annotations

from ..ops.activation import ACTIVATIONS, GATED_ACTIVATIONS
from ..ops.attention import MASK_TYPES, resolve_window
from ..ops.opdef import fail

NORMALIZATIONS = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
"""TE's ``normalization=`` values -> basic-op kind."""


def normalization_kind(normalization: str) -> str:
    """"layernorm" or "rmsnorm" for TE's "LayerNorm" / "RMSNorm"; raises ValueError otherwise."""
    if normalization not in NORMALIZATIONS:
        fail("normalization", ValueError, f"normalization must be 'LayerNorm' or 'RMSNorm', got {normalization!r}")
    return NORMALIZATIONS[normalization]


def activation_kind(activation: str) -> str:
    """The activation kind of TE's ``activation=`` name (lower case, e.g. "gelu", "swiglu")."""
    if not isinstance(activation, str) or activation.lower() not in ACTIVATIONS:
        fail("activation", ValueError, f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    return activation.lower()


def check_activation_params(activation: str, params: dict | None) -> dict:
    """``activation_params`` (limit, alpha) exist for clamped_swiglu only."""
    params = dict(params or {})
    if params and activation_kind(activation) != "clamped_swiglu":
        fail("activation", ValueError, f"activation_params {sorted(params)} are only taken by clamped_swiglu, "
             f"not {activation!r}")
    unknown = sorted(set(params) - {"limit", "alpha"})
    if unknown:
        fail("activation", ValueError, f"clamped_swiglu takes activation_params limit and alpha, got {unknown}")
    return params


def mlp_widths(activation: str, ffn_hidden_size: int) -> int:
    """FC1's output width: ffn_hidden_size, doubled for gated activations (act(a)·b halves it)."""
    if type(ffn_hidden_size) is not int or ffn_hidden_size < 1:
        fail("LayerNormMLP", ValueError, f"ffn_hidden_size must be a positive int, got {ffn_hidden_size!r}")
    return 2 * ffn_hidden_size if activation_kind(activation) in GATED_ACTIVATIONS else ffn_hidden_size


def block_layout(normalization: str, linears: tuple[tuple[str, bool], ...], activation: str | None,
                 return_layernorm_output: bool) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The basic-op list of a norm-led block, as (slot, parameter names) pairs that both
    frontends map to their own ops and parameters (one layout, so the blocks agree).

    Slots: "norm", "extra_output" (MakeExtraOutput, for return_layernorm_output), "linear",
    "bias", "activation". ``linears`` is ((prefix, has_bias), ...) — ("", True) for
    LayerNormLinear's ``weight`` / ``bias``, ("fc1_", b), ("fc2_", b) for LayerNormMLP — with
    the activation between the first and the second.
    """
    norm_params = ("layer_norm_weight", "layer_norm_bias") if normalization_kind(normalization) == "layernorm" \
        else ("layer_norm_weight",)
    layout: list[tuple[str, tuple[str, ...]]] = [("norm", norm_params)]
    if return_layernorm_output:
        layout.append(("extra_output", ()))
    for index, (prefix, has_bias) in enumerate(linears):
        if index == 1 and activation is not None:
            layout.append(("activation", ()))
        layout.append(("linear", (f"{prefix}weight",)))
        if has_bias:
            layout.append(("bias", (f"{prefix}bias",)))
    return tuple(layout)


def _positive_int(op: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail(op, ValueError, f"{name} must be a positive int, got {value!r}")
    return value


def attention_heads(op: str, hidden_size: int, num_attention_heads: int, kv_channels: int | None,
                    num_gqa_groups: int | None) -> tuple[int, int, int]:
    """(kv_channels, num_gqa_groups, fused QKV width) of a MultiheadAttention / TransformerLayer.

    kv_channels defaults to hidden_size / num_attention_heads (which must then divide), num_gqa_groups
    to num_attention_heads (MHA; 1 is MQA) and must divide it. The fused QKV projection has
    (num_attention_heads + 2·num_gqa_groups)·kv_channels output rows, ordered [Q; K; V].
    """
    _positive_int(op, "hidden_size", hidden_size)
    heads = _positive_int(op, "num_attention_heads", num_attention_heads)
    if kv_channels is None:
        if hidden_size % heads != 0:
            fail(op, ValueError, f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({heads}) "
                 "when kv_channels is None (kv_channels defaults to hidden_size / num_attention_heads)")
        kv_channels = hidden_size // heads
    _positive_int(op, "kv_channels", kv_channels)
    groups = heads if num_gqa_groups is None else _positive_int(op, "num_gqa_groups", num_gqa_groups)
    if heads % groups != 0:
        fail(op, ValueError, f"num_attention_heads ({heads}) must be divisible by num_gqa_groups ({groups})")
    return kv_channels, groups, (heads + 2 * groups) * kv_channels


def check_attention_block(op: str, fuse_qkv_params: bool, qkv_format: str, attn_mask_type: str, window_size,
                          input_layernorm: bool, return_layernorm_output: bool) -> None:
    """The MultiheadAttention arguments both frontends accept: fused QKV parameters (TE's
    ``fuse_qkv_params=True`` names), layouts bshd / sbhd / thd, a mask type of
    core/ops/attention.py with a window that does not contradict it, return_layernorm_output only
    with input_layernorm."""
    if return_layernorm_output and not input_layernorm:
        fail(op, ValueError, "return_layernorm_output=True needs input_layernorm=True (no layernorm output "
             "exists without the input layernorm)")
    if fuse_qkv_params is not True:
        fail(op, ValueError, "fuse_qkv_params must be True (one fused QKV weight, TE's fused parameter names); "
             f"split query/key/value parameters are not supported, got {fuse_qkv_params!r}")
    if qkv_format not in ("bshd", "sbhd", "thd"):
        fail(op, ValueError, f"qkv_format must be 'bshd', 'sbhd' or 'thd', got {qkv_format!r}")
    if attn_mask_type not in MASK_TYPES:
        fail(op, ValueError, f"attn_mask_type must be one of {', '.join(repr(m) for m in MASK_TYPES)}, "
             f"got {attn_mask_type!r}")
    resolve_window(op, attn_mask_type, window_size)

"""Arguments of the blocks built on basic ops (LayerNormLinear, LayerNormMLP, layernorm_dense,
layernorm_mlp): checked once here so both frontends accept and reject the same values."""

from __future__ import annotations

from ..ops.activation import ACTIVATIONS, GATED_ACTIVATIONS
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

"""Recipes: training-level choices of quantizer per tensor role (NUMERICS.md §9).

A recipe is a frozen value object. ``recipe.quantizer(role)`` gives the quantizer spec for
``"input"``, ``"weight"`` or ``"grad_output"``.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable

from .quantizers import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8DelayedScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    Quantizer,
)

ROLES = ("input", "weight", "grad_output")


class Format(enum.Enum):
    """FP8 format choice: E4M3 everywhere, or HYBRID (E4M3 forward, E5M2 gradients)."""

    E4M3 = "e4m3"
    HYBRID = "hybrid"
    E5M2 = "e5m2"

    def dtype_for(self, role: str) -> str:
        """FP8 element format ("e4m3" / "e5m2") used for tensors of `role`."""
        if self is Format.HYBRID:
            return "e5m2" if role == "grad_output" else "e4m3"
        return self.value


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")


def _check_format(owner: str, fmt: Format, allowed: tuple[Format, ...]) -> None:
    if not isinstance(fmt, Format):
        raise TypeError(f"{owner}.fp8_format must be a twinengine.recipe.Format, got {type(fmt).__name__}")
    if fmt not in allowed:
        names = ", ".join(f.name for f in allowed)
        raise ValueError(f"{owner}.fp8_format={fmt.name} is not supported (allowed: {names}); "
                         "pure E5M2 is rejected for every FP8 recipe")


def _check_attention_flags(owner: str, recipe: object) -> None:
    for name in ("fp8_dpa", "fp8_mha"):
        if not isinstance(getattr(recipe, name), bool):
            raise TypeError(f"{owner}.{name} must be a bool, got {getattr(recipe, name)!r}")


def uses_fp8_attention(recipe: object) -> bool:
    """Whether attention under `recipe` is FP8 attention (docs/attention.md §9): a
    DelayedScaling or Float8CurrentScaling with ``fp8_dpa`` or ``fp8_mha`` set (TE's fields;
    ``fp8_mha`` implies FP8 attention). False for None, every other recipe and CustomRecipe.
    Modules pass the result as ``fp8=`` to ``attention_fwd`` / ``attention_bwd``."""
    return isinstance(recipe, (DelayedScaling, Float8CurrentScaling)) and bool(recipe.fp8_dpa or recipe.fp8_mha)


def _keep_float_text(recipe: object, name: str) -> None:
    """Stores a number field's exact text next to it (not a dataclass field: eq/hash unchanged)."""
    value = getattr(recipe, name)
    text = float(value).hex() if isinstance(value, float) else str(int(value))
    object.__setattr__(recipe, f"_{name}_text", text)


def _float_field(recipe: object, name: str) -> float:
    """A float field read back from its text. torch.compile(dynamic=True) turns numbers read from
    objects into symbolic values, and a quantizer spec (a constant of the graph) cannot hold one;
    a number parsed from a string is always a constant."""
    return float.fromhex(getattr(recipe, f"_{name}_text"))


def int_field(recipe: object, name: str) -> int:
    """An int field read back from its text (see _float_field)."""
    return int(getattr(recipe, f"_{name}_text"))


class Recipe:
    """Base of the recipes."""

    def quantizer(self, role: str) -> Quantizer:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class DelayedScaling(Recipe):
    """Per-tensor FP8 with scales from an amax history (NUMERICS.md §3)."""

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self) -> None:
        _check_format("DelayedScaling", self.fp8_format, (Format.E4M3, Format.HYBRID))
        _check_attention_flags("DelayedScaling", self)
        if type(self.margin) is not int or not 0 <= self.margin <= 64:
            raise ValueError(f"DelayedScaling.margin must be an int in [0, 64], got {self.margin!r}")
        if type(self.amax_history_len) is not int or self.amax_history_len < 1:
            raise ValueError(f"DelayedScaling.amax_history_len must be an int >= 1, got {self.amax_history_len!r}")
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError("DelayedScaling.amax_compute_algo must be 'max' or 'most_recent', "
                             f"got {self.amax_compute_algo!r}")
        _keep_float_text(self, "margin")
        _keep_float_text(self, "amax_history_len")

    def quantizer(self, role: str) -> Float8DelayedScalingQuantizer:
        _check_role(role)
        return Float8DelayedScalingQuantizer(self.fp8_format.dtype_for(role))


@dataclasses.dataclass(frozen=True)
class Float8CurrentScaling(Recipe):
    """Per-tensor FP8 with the scale from each tensor's own amax (NUMERICS.md §4)."""

    fp8_format: Format = Format.HYBRID
    use_power_2_scales: bool = False
    amax_epsilon: float = 0.0
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self) -> None:
        _check_format("Float8CurrentScaling", self.fp8_format, (Format.E4M3, Format.HYBRID))
        _check_attention_flags("Float8CurrentScaling", self)
        if not float(self.amax_epsilon) >= 0.0:
            raise ValueError(f"Float8CurrentScaling.amax_epsilon must be >= 0, got {self.amax_epsilon!r}")
        _keep_float_text(self, "amax_epsilon")

    def quantizer(self, role: str) -> Float8CurrentScalingQuantizer:
        _check_role(role)
        return Float8CurrentScalingQuantizer(self.fp8_format.dtype_for(role),
                                             force_pow_2_scales=bool(self.use_power_2_scales),
                                             amax_epsilon=_float_field(self, "amax_epsilon"))


@dataclasses.dataclass(frozen=True)
class MXFP8BlockScaling(Recipe):
    """MXFP8 1×32 blocks; optionally 32×32 tiles for weights (NUMERICS.md §5)."""

    fp8_format: Format = Format.E4M3
    enable_2d_quantization: bool = False

    def __post_init__(self) -> None:
        _check_format("MXFP8BlockScaling", self.fp8_format, (Format.E4M3, Format.HYBRID))

    def quantizer(self, role: str) -> MXFP8Quantizer:
        _check_role(role)
        two_d = bool(self.enable_2d_quantization) and role == "weight"
        return MXFP8Quantizer(self.fp8_format.dtype_for(role), with_2d_quantization=two_d)


@dataclasses.dataclass(frozen=True)
class Float8BlockScaling(Recipe):
    """FP8 with fp32 block scales: 1×128 or 128×128 per role (NUMERICS.md §6)."""

    fp8_format: Format = Format.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    use_power_2_scales: bool = True
    amax_epsilon: float = 0.0

    def __post_init__(self) -> None:
        _check_format("Float8BlockScaling", self.fp8_format, (Format.E4M3, Format.HYBRID))
        dims = {"x_block_scaling_dim": self.x_block_scaling_dim, "w_block_scaling_dim": self.w_block_scaling_dim,
                "grad_block_scaling_dim": self.grad_block_scaling_dim}
        for name, dim in dims.items():
            if dim not in (1, 2):
                raise ValueError(f"Float8BlockScaling.{name} must be 1 or 2, got {dim!r}")
        if sum(dim == 2 for dim in dims.values()) > 1:
            raise ValueError("Float8BlockScaling: a GEMM whose two operands are both 2D-block scaled is "
                             f"not supported; got {dims} (fprop uses x and w, dgrad grad and w, wgrad grad and x)")
        if not float(self.amax_epsilon) >= 0.0:
            raise ValueError(f"Float8BlockScaling.amax_epsilon must be >= 0, got {self.amax_epsilon!r}")
        _keep_float_text(self, "amax_epsilon")
        for name in dims:
            _keep_float_text(self, name)

    def quantizer(self, role: str) -> Float8BlockQuantizer:
        _check_role(role)
        dim = int_field(self, {"input": "x_block_scaling_dim", "weight": "w_block_scaling_dim",
                               "grad_output": "grad_block_scaling_dim"}[role])
        return Float8BlockQuantizer(self.fp8_format.dtype_for(role), block_scaling_dim=dim,
                                    force_pow_2_scales=bool(self.use_power_2_scales),
                                    amax_epsilon=_float_field(self, "amax_epsilon"))


@dataclasses.dataclass(frozen=True)
class NVFP4BlockScaling(Recipe):
    """NVFP4: inputs 1D with RHT on the columnwise copy, weights 16×16 2D, gradients 1D with
    RHT and stochastic rounding (NUMERICS.md §7, §9).

    Dtypes: the RHT is defined for bfloat16 operands only. A Linear / dense whose input is
    float32 or float16 runs this recipe with the RHT off (its bytes are exactly those of
    ``disable_rht=True``); bfloat16 inputs get the RHT unless ``disable_rht``. ``quantizer(role)``
    itself is dtype-independent and keeps ``with_rht`` (quantizing a non-bf16 tensor with it
    directly raises, as NUMERICS.md §7.8 says).
    """

    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False

    def quantizer(self, role: str) -> NVFP4Quantizer:
        _check_role(role)
        if role == "weight":
            return NVFP4Quantizer(with_2d_quantization=not self.disable_2d_quantization)
        return NVFP4Quantizer(with_rht=not self.disable_rht,
                              stochastic_rounding=role == "grad_output" and not self.disable_stochastic_rounding)


@dataclasses.dataclass(frozen=True)
class CustomRecipe(Recipe):
    """Quantizers chosen by a user function ``qfactory(role) -> Quantizer``."""

    qfactory: Callable[[str], Quantizer]

    def __post_init__(self) -> None:
        if not callable(self.qfactory):
            raise TypeError("CustomRecipe.qfactory must be callable: role -> Quantizer")

    def quantizer(self, role: str) -> Quantizer:
        _check_role(role)
        q = self.qfactory(role)
        if not isinstance(q, Quantizer):
            raise TypeError(f"CustomRecipe.qfactory({role!r}) must return a twinengine Quantizer, "
                            f"got {type(q).__name__}")
        return q

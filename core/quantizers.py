"""Quantizer specs: frozen value objects describing how a tensor is quantized.

A quantizer holds plain values only (bools, ints, floats, strings) — never a tensor or a
process group — so it has value equality and a hash, can be baked into an FX graph
(``__fx_repr__``) and be a static argument under ``jax.jit``. Equal quantizers are
interchangeable; a different one is a different compiled program.
"""

from __future__ import annotations

import dataclasses
import functools
import typing

_FP8_FORMATS = ("e4m3", "e5m2")


@functools.cache
def _field_types(cls: type) -> dict[str, typing.Any]:
    """The resolved field annotations of a quantizer class (compiled graphs rebuild quantizers
    from their __fx_repr__ on every call, so this must be cheap)."""
    return typing.get_type_hints(cls)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Quantizer:
    """Base of every quantizer spec.

    Attributes:
        rowwise: produce the rowwise copy (blocks along the last dimension K).
        columnwise: produce the columnwise copy (used for the transposed GEMM operands).
    """

    rowwise: bool = True
    columnwise: bool = True

    scaling_mode: typing.ClassVar[str] = ""
    """Format family: "fp8_current", "fp8_delayed", "mxfp8", "fp8_block" or "nvfp4"."""

    def __post_init__(self) -> None:
        hints = _field_types(type(self))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            expected = hints[field.name]
            if expected is float and type(value) is int:
                object.__setattr__(self, field.name, float(value))
                continue
            if type(value) is not expected:
                raise TypeError(
                    f"{type(self).__name__}.{field.name} must be a plain {expected.__name__}, got "
                    f"{type(value).__module__}.{type(value).__qualname__} (quantizers hold values, "
                    "never tensors or process groups)"
                )
        if not (self.rowwise or self.columnwise):
            raise ValueError(f"{type(self).__name__}: at least one of rowwise and columnwise must be True")
        self._check()

    def _check(self) -> None:
        """Field rules of a concrete quantizer (raises ValueError)."""

    def plan_key(self) -> "Quantizer":
        """Itself as a plan-cache key (core/ops/opdef.py): a frozen value of plain fields."""
        return self

    def with_usage(self, *, rowwise: bool | None = None, columnwise: bool | None = None) -> "Quantizer":
        """The same quantizer with the given usages changed."""
        changes = {}
        if rowwise is not None:
            changes["rowwise"] = rowwise
        if columnwise is not None:
            changes["columnwise"] = columnwise
        return dataclasses.replace(self, **changes)

    def __fx_repr__(self) -> tuple[str, dict[str, type]]:
        """Evaluable source for FX codegen (PyTorch opaque value types)."""
        args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        name = type(self).__name__
        return f"{name}({args})", {name: type(self)}


def _check_fp8_dtype(owner: str, fp8_dtype: str) -> None:
    if fp8_dtype not in _FP8_FORMATS:
        raise ValueError(f"{owner}.fp8_dtype must be 'e4m3' or 'e5m2', got {fp8_dtype!r}")


def _check_epsilon(owner: str, amax_epsilon: float) -> None:
    if not amax_epsilon >= 0.0:
        raise ValueError(f"{owner}.amax_epsilon must be >= 0, got {amax_epsilon!r}")


@dataclasses.dataclass(frozen=True)
class Float8CurrentScalingQuantizer(Quantizer):
    """Per-tensor FP8 with the scale computed from this tensor's amax (NUMERICS.md §4).

    Data: rowwise the input's shape, columnwise the (K, R) transpose, FP8 dtype of
    ``fp8_dtype``; one fp32 scale_inv (1,) serves both; ``amax`` (1,) is returned.
    """

    fp8_dtype: str = "e4m3"
    _: dataclasses.KW_ONLY
    force_pow_2_scales: bool = False
    amax_epsilon: float = 0.0

    scaling_mode: typing.ClassVar[str] = "fp8_current"


    def _check(self) -> None:
        _check_fp8_dtype(type(self).__name__, self.fp8_dtype)
        _check_epsilon(type(self).__name__, self.amax_epsilon)


@dataclasses.dataclass(frozen=True)
class Float8DelayedScalingQuantizer(Quantizer):
    """Per-tensor FP8 with a scale given by the caller (delayed scaling, NUMERICS.md §3).

    ``quantize(x, q, scale=s)`` casts ``x·s``, stores ``1/s`` and returns the amax of the
    unscaled input in the result's ``amax``; the history/scale update is its own op.
    """

    fp8_dtype: str = "e4m3"

    scaling_mode: typing.ClassVar[str] = "fp8_delayed"


    def _check(self) -> None:
        _check_fp8_dtype(type(self).__name__, self.fp8_dtype)


@dataclasses.dataclass(frozen=True)
class MXFP8Quantizer(Quantizer):
    """MXFP8: 1×32 blocks (32×1 columnwise) with E8M0 scales (NUMERICS.md §5).

    Data keeps the input's shape in both copies; scales are uint8 E8M0 codes padded to
    (128, 4) multiples. ``with_2d_quantization`` shares one exponent per 32×32 tile.
    """

    fp8_dtype: str = "e4m3"
    _: dataclasses.KW_ONLY
    with_2d_quantization: bool = False

    scaling_mode: typing.ClassVar[str] = "mxfp8"


    def _check(self) -> None:
        _check_fp8_dtype(type(self).__name__, self.fp8_dtype)


@dataclasses.dataclass(frozen=True)
class Float8BlockQuantizer(Quantizer):
    """FP8 with fp32 block scales, DeepSeek style (NUMERICS.md §6).

    ``block_scaling_dim=1``: 1×128 blocks along K (columnwise: 1×128 blocks of the
    transpose, stored (K, R)); ``block_scaling_dim=2``: 128×128 tiles, columnwise the exact
    transpose of rowwise.
    """

    fp8_dtype: str = "e4m3"
    _: dataclasses.KW_ONLY
    block_scaling_dim: int = 1
    force_pow_2_scales: bool = True
    amax_epsilon: float = 0.0

    scaling_mode: typing.ClassVar[str] = "fp8_block"

    def _check(self) -> None:
        _check_fp8_dtype(type(self).__name__, self.fp8_dtype)
        _check_epsilon(type(self).__name__, self.amax_epsilon)
        if self.block_scaling_dim not in (1, 2):
            raise ValueError(f"Float8BlockQuantizer.block_scaling_dim must be 1 or 2, got {self.block_scaling_dim!r}")


@dataclasses.dataclass(frozen=True)
class NVFP4Quantizer(Quantizer):
    """NVFP4: E2M1 data, E4M3 scales per 1×16 block, fp32 global scale (NUMERICS.md §7).

    ``with_rht`` applies the 16-point random Hadamard transform to the columnwise copy
    (bf16 input only; no effect with columnwise=False; that copy dequantizes to the
    transformed values); ``with_2d_quantization`` shares a scale per 16×16 tile;
    ``stochastic_rounding`` rounds with Philox bits from an explicit ``rng=[seed, offset]``
    array (see ``twinengine.ops.quantize.RNG_DTYPES``), required exactly when it is set.
    """

    with_rht: bool = False
    with_2d_quantization: bool = False
    stochastic_rounding: bool = False

    scaling_mode: typing.ClassVar[str] = "nvfp4"

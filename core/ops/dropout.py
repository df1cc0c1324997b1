"""The dropout family (NUMERICS.md §11): forward with an explicit rng and a 1-bit mask, and the
backward from that mask.

Each op is one :class:`OpDef`; both frontends call ``OP.plan(...)``.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import HIGH_PRECISION
from .opdef import KernelCall, OpDef, TensorSpec, ceil_div, dims, fail
from .quantize import RNG_DTYPES, ArrayMeta


def numel(shape: tuple[Any, ...]) -> Any:
    n = 1
    for d in shape:
        n = n * d
    return n


def mask_shape(shape: tuple[Any, ...]) -> tuple[Any]:
    """(ceil(numel/8),): one bit per element, bit i % 8 of byte i // 8."""
    return (ceil_div(numel(shape), 8),)


# The largest p that rounds to an fp32 below 1: from 1 - 2**-25 on, p rounds to 1.0 (a tie goes
# to the even 1.0). Attributes reach the kernels as fp32, so every check is on the rounded value.
_P_LIMIT = 1.0 - 2.0**-25


def _check_p(op: str, p: Any) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        fail(op, TypeError, f"p must be a float in [0, 1), got {p!r}")
    if not 0.0 <= p < _P_LIMIT:  # NaN fails both comparisons
        fail(op, ValueError, f"p must be in [0, 1) (after rounding to float32), got {float(p)!r}")


def _check_data(op: str, name: str, x: ArrayMeta) -> None:
    if x.dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"{name} must be float32, bfloat16 or float16, got {x.dtype}")


def _validate_fwd(x: ArrayMeta, p: float, rng: ArrayMeta | None) -> None:
    op = "dropout_fwd"
    _check_data(op, "x", x)
    _check_p(op, p)
    if rng is None:
        fail(op, ValueError, "dropout needs rng= (an integer array [seed, offset] of shape (2,), dtype uint32, "
             "int32 or int64)")
    if rng.dtype not in RNG_DTYPES:
        fail(op, TypeError, f"rng must have dtype uint32, int32 or int64, got {rng.dtype}")
    if tuple(rng.shape) != (2,):
        fail(op, ValueError, f"rng must have shape (2,) ([seed, offset]), got {dims(rng.shape)}")


def _infer_fwd(x: ArrayMeta, p: float, rng: ArrayMeta | None) -> KernelCall:
    return KernelCall("dropout_fwd", ("x", "rng"),
                      (TensorSpec("y", tuple(x.shape), x.dtype), TensorSpec("mask", mask_shape(x.shape), "uint8")),
                      (("p", float(p)),))


DROPOUT_FWD = OpDef(name="dropout_fwd", args=("x", "rng"), attrs=("p",), validate=_validate_fwd, infer=_infer_fwd)
"""dropout_fwd(x, p, rng) -> y, mask.

Shapes: y x's shape; mask uint8 (ceil(numel/8),), bit i % 8 of byte i // 8 set iff element i
    (row-major) is kept; the padding bits are 0.
Dtypes: x float32 / bfloat16 / float16; y x's dtype; rng per quantize.RNG_DTYPES (low 32 bits).
Numerics: Philox4x32-10, key (seed, 0), counter (floor(i/4) mod 2^32, floor(i/2^34), offset,
    0x44524F50), word x_{i mod 4}; kept iff word >= floor(p·2^32) with p rounded to fp32;
    kept values fl(x·fl(1/fl(1−p))), dropped +0.0.
"""


def _validate_bwd(dy: ArrayMeta, mask: ArrayMeta, p: float) -> None:
    op = "dropout_bwd"
    _check_data(op, "dy", dy)
    _check_p(op, p)
    if mask.dtype != "uint8":
        fail(op, TypeError, f"mask must have dtype uint8, got {mask.dtype}")
    if tuple(mask.shape) != mask_shape(dy.shape):
        fail(op, ValueError, f"mask must have shape {mask_shape(dy.shape)} (one bit per element of dy "
             f"{dims(dy.shape)}), got {dims(mask.shape)}")


def _infer_bwd(dy: ArrayMeta, mask: ArrayMeta, p: float) -> KernelCall:
    return KernelCall("dropout_bwd", ("dy", "mask"), (TensorSpec("dx", tuple(dy.shape), dy.dtype),),
                      (("p", float(p)),))


DROPOUT_BWD = OpDef(name="dropout_bwd", args=("dy", "mask"), attrs=("p",), validate=_validate_bwd, infer=_infer_bwd)
"""dropout_bwd(dy, mask, p) -> dx: fl(dy·fl(1/fl(1−p))) where the mask bit is set, +0.0 elsewhere."""

"""twinengine.jax dropout forward / backward over XLA FFI calls (no custom_vjp). Shapes, checks
and errors come from core/ops/dropout.py."""

from __future__ import annotations

from ...ops.dropout import DROPOUT_BWD, DROPOUT_FWD
from .._library import ffi, meta

__all__ = ["dropout_fwd", "dropout_bwd"]


def dropout_fwd(x, p: float, rng):
    """Dropout with an explicit rng: returns (y, mask) (jit-, vmap-clean; under vmap each batch
    element draws from element index 0 of its own slice).

    Shapes: y x's shape; mask uint8 (ceil(numel/8),), bit i % 8 of byte i // 8 set iff element i kept.
    Dtypes: x float32 / bfloat16 / float16; rng (2,) [seed, offset], uint32 / int32 / int64.
    Numerics: NUMERICS.md §11; identical bytes to ``twinengine.pytorch``'s dropout_fwd.
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    y, mask = ffi(DROPOUT_FWD.plan(meta(x), p, meta(rng)), [x, rng])
    return y, mask


def dropout_bwd(dy, mask, p: float):
    """dx = fl(dy·fl(1/fl(1−p))) where `mask` keeps, +0.0 elsewhere.

    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    (dx,) = ffi(DROPOUT_BWD.plan(meta(dy), meta(mask), p), [dy, mask])
    return dx

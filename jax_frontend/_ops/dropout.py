"""twinengine.jax dropout forward / backward over XLA FFI calls (no custom_vjp). Shapes, checks
and errors come from core/ops/dropout.py.

Sharded jit (``twinengine.jax.partitioning``): the forward runs replicated (gathered x): each
element's random bits are a function of its index in the whole tensor (NUMERICS.md §11) and
the kernel takes no index origin, so a shard cannot draw its elements' bits; the backward
(a per-element product with the saved mask) shards its leading dimension locally when each
shard holds whole mask bytes (8 elements)."""

from __future__ import annotations

from ...ops.dropout import DROPOUT_BWD, DROPOUT_FWD
from .._library import ffi, meta
from ..partitioning import feature_rule, partitioned

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
    call = DROPOUT_FWD.plan(meta(x), p, meta(rng))
    y, mask = _op(feature_rule("dropout_fwd", call, x.shape, hidden_local=False, rows_local=False),
                  ("fwd", p), x, rng)
    return y, mask


def dropout_bwd(dy, mask, p: float):
    """dx = fl(dy·fl(1/fl(1−p))) where `mask` keeps, +0.0 elsewhere.

    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    call = DROPOUT_BWD.plan(meta(dy), meta(mask), p)
    (dx,) = _op(feature_rule("dropout_bwd", call, dy.shape, hidden_local=True), ("bwd", p), dy, mask)
    return dx


def _shard(static, sizes, a, b):
    which, p = static
    call = DROPOUT_FWD.plan(meta(a), p, meta(b)) if which == "fwd" else DROPOUT_BWD.plan(meta(a), meta(b), p)
    return ffi(call, [a, b])


_op = partitioned(_shard)

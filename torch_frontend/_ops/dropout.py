"""torch.ops.twinengine.dropout_fwd / dropout_bwd and their Python wrappers (no autograd).
Shapes, checks and errors come from core/ops/dropout.py."""

from __future__ import annotations

import torch

from ...ops.dropout import DROPOUT_BWD, DROPOUT_FWD
from .._library import check_tensor_device, empty_outputs, launch, meta, surface_errors, tensor_fallback, tuple_fallback

__all__ = ["dropout_fwd", "dropout_bwd"]


@torch.library.custom_op("twinengine::dropout_fwd", mutates_args=())
def _dropout_fwd(x: torch.Tensor, p: float, rng: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y, mask = launch(DROPOUT_FWD.plan(meta(x), p, meta(rng)), [x, rng], x.device)
    return y, mask


@_dropout_fwd.register_fake
def _(x, p, rng):
    y, mask = empty_outputs(DROPOUT_FWD.infer(meta(x), p, meta(rng)), x.device)
    return y, mask


@torch.library.custom_op("twinengine::dropout_bwd", mutates_args=())
def _dropout_bwd(dy: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    (dx,) = launch(DROPOUT_BWD.plan(meta(dy), meta(mask), p), [dy, mask], dy.device)
    return dx


@_dropout_bwd.register_fake
def _(dy, mask, p):
    (dx,) = empty_outputs(DROPOUT_BWD.infer(meta(dy), meta(mask), p), dy.device)
    return dx


@surface_errors(tuple_fallback(2))
def dropout_fwd(x: torch.Tensor, p: float, rng: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropout with an explicit rng: returns (y, mask).

    Shapes: y x's shape; mask uint8 (ceil(numel/8),), bit i % 8 of byte i // 8 set iff element i
        (row-major) is kept.
    Dtypes: x float32 / bfloat16 / float16; rng (2,) [seed, offset], uint32 / int32 / int64
        (low 32 bits used; a new value is a new input, never a recompile).
    Numerics: NUMERICS.md §11 (Philox4x32-10, keep iff word >= floor(p·2^32), kept values
        fl(x·fl(1/fl(1−p))), dropped +0.0); p == 0 keeps everything. Same bytes as
        ``twinengine.jax`` for the same rng.
    Raises:
        TypeError / ValueError: p outside [0, 1) or NaN, missing or malformed rng, bad dtype.
    """
    for name, t in (("x", x), ("rng", rng)):
        check_tensor_device("dropout_fwd", name, t)
    DROPOUT_FWD.validate(meta(x), p, meta(rng))
    return torch.ops.twinengine.dropout_fwd(x, float(p), rng)


@surface_errors(tensor_fallback)
def dropout_bwd(dy: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """dx = fl(dy·fl(1/fl(1−p))) where `mask` keeps, +0.0 elsewhere (the mask of dropout_fwd).

    Shapes: dx dy's shape; mask (ceil(numel/8),) uint8. Dtypes: dx dy's dtype.
    Raises:
        TypeError / ValueError: p outside [0, 1) or NaN, a mask of the wrong size or dtype.
    """
    for name, t in (("dy", dy), ("mask", mask)):
        check_tensor_device("dropout_bwd", name, t)
    DROPOUT_BWD.validate(meta(dy), meta(mask), p)
    return torch.ops.twinengine.dropout_bwd(dy, mask, float(p))

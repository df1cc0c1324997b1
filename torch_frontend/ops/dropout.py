"""Basic op Dropout with an explicit Philox stream (NUMERICS.md §11)."""

from __future__ import annotations

import torch

from ...fusion.ops import OpDesc, check_dropout_p, check_input_kind
from .._ops.dropout import dropout_bwd, dropout_fwd
from .._state import draw_rng
from .op import BasicOperation


class Dropout(BasicOperation):
    """Training: keeps element i iff its Philox word ≥ floor(p·2³²) and scales kept values by
    fl(1/fl(1−p)); eval (``module.eval()``) or p = 0: identity.

    RNG: ``rng_state`` int64 (2,) buffer [seed, offset] (seed ``rng_seed``): each training call
    uses the current value and advances the offset by one — the stream
    ``twinengine.jax.ops.Dropout`` reproduces with ``rng=[seed, offset]``. The mask is saved as
    bits and the backward never regenerates it.
    Raises:
        ValueError: p outside [0, 1).
    """

    def __init__(self, p: float, *, rng_seed: int = 0, device=None) -> None:
        super().__init__()
        self.p = check_dropout_p(p)
        self.register_buffer("rng_state", torch.tensor([rng_seed, 0], dtype=torch.int64, device=device))

    replay_snapshot = ("rng",)

    def describe(self) -> OpDesc:
        return OpDesc("dropout", "Dropout")

    def op_call(self, recipe):
        if not self.training or self.p == 0.0:
            return {"active": False}, {}
        return {"active": True}, {"rng": draw_rng(self)}

    def op_forward_compute(self, x, params, *, active=False, rng=None):
        check_input_kind("Dropout", not isinstance(x, torch.Tensor), False)
        if not active:
            return x, None
        y, mask = dropout_fwd(x, self.p, rng)
        return y, mask

    def op_backward(self, ctx, dy):
        if ctx.saved is None:
            return dy, ()
        return dropout_bwd(dy, ctx.saved, self.p), ()

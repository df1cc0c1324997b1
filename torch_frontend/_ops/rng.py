"""twinengine::rng_advance: read an [seed, offset] state and advance its offset, as one op.

Modules that draw random bits per call (stochastic rounding, dropout) keep an int64 (2,)
buffer. Reading it and advancing it in plain aten ops lets the compiled backward recompute the
read from the buffer after it has already been advanced (the partitioner rematerializes cheap
ops from the graph inputs); a custom op's output is saved, never recomputed, so the backward
sees the offset the forward used — eager and torch.compile give the same bits.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("twinengine::rng_advance", mutates_args=("state",))
def _rng_advance(state: torch.Tensor) -> torch.Tensor:
    current = state.clone()
    state[1] += 1
    return current


@_rng_advance.register_fake
def _(state):
    return torch.empty_like(state)


def rng_advance(state: torch.Tensor) -> torch.Tensor:
    """Returns a copy of `state` ([seed, offset]) and advances its offset by one in place."""
    return torch.ops.twinengine.rng_advance(state)

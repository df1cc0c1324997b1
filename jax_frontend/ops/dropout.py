"""JAX basic op Dropout (twinengine.pytorch.ops.Dropout's twin, NUMERICS.md §11)."""

from __future__ import annotations

import jax.numpy as jnp

from ...fusion.ops import OpDesc, check_dropout_p, check_input_kind
from ...ops.opdef import fail
from ...quantized_tensor import QuantizedTensor
from .._ops.dropout import dropout_bwd, dropout_fwd
from .op import BasicOperation


class Dropout(BasicOperation):
    """Training (``training=True`` in the Sequential call) with p > 0 needs ``rng`` = [seed,
    offset] for this op; the bytes equal the torch op's for the same [seed, offset]."""

    def __init__(self, p: float) -> None:
        self.p = check_dropout_p(p)

    def describe(self) -> OpDesc:
        return OpDesc("dropout", "Dropout")

    def op_call(self, recipe, state, rng, training):
        if not training or self.p == 0.0:
            return {"active": False}, {}
        if rng is None:
            fail("Dropout", ValueError, "training with p > 0 needs rng= (an integer array [seed, offset] of shape (2,))")
        return {"active": True}, {"rng": jnp.asarray(rng)}

    def op_forward_compute(self, x, params, *, active=False, rng=None):
        check_input_kind("Dropout", isinstance(x, QuantizedTensor), False)
        if not active:
            return x, None
        return dropout_fwd(x, self.p, rng)

    def op_backward(self, ctx, dy):
        if ctx.saved is None:
            return dy, ()
        return dropout_bwd(dy, ctx.saved, self.p), ()

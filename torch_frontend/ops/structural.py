"""Structural basic ops: Identity, Reshape, ConstantScale, AddExtraInput, MakeExtraOutput (TE's names)."""

from __future__ import annotations

from typing import Sequence

import torch

from ...fusion.ops import OpDesc, check_input_kind
from .._ops.bias import add, scale
from .op import BasicOperation


class Identity(BasicOperation):
    """y = x."""

    def describe(self) -> OpDesc:
        return OpDesc("identity", "Identity")

    def op_forward_compute(self, x, params):
        return x, None

    def op_backward(self, ctx, dy):
        return dy, ()


class Reshape(BasicOperation):
    """y = x.reshape(shape) (one dimension may be -1); the gradient is reshaped back."""

    def __init__(self, shape: Sequence[int]) -> None:
        super().__init__()
        self.shape = tuple(int(s) for s in shape)

    def describe(self) -> OpDesc:
        return OpDesc("reshape", "Reshape")

    def op_forward_compute(self, x, params):
        check_input_kind("Reshape", not isinstance(x, torch.Tensor), False)
        return x.reshape(self.shape), tuple(x.shape)

    def op_backward(self, ctx, dy):
        return dy.reshape(ctx.saved), ()


class ConstantScale(BasicOperation):
    """y = fl(x · c) with c rounded to fp32 first, in x's dtype; dx = fl(dy · c)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = float(scale)

    def describe(self) -> OpDesc:
        return OpDesc("constant_scale", "ConstantScale")

    def op_forward_compute(self, x, params):
        check_input_kind("ConstantScale", not isinstance(x, torch.Tensor), False)
        return scale(x, self.scale), None

    def op_backward(self, ctx, dy):
        return scale(dy, self.scale), ()


class AddExtraInput(BasicOperation):
    """y = fl(x + e) in x's dtype, e the next extra input of the Sequential call (a residual);
    both get the gradient dy."""

    num_extra_inputs = 1

    def describe(self) -> OpDesc:
        return OpDesc("add_extra_input", "AddExtraInput")

    def op_forward_compute(self, x, params, *, extra_inputs):
        check_input_kind("AddExtraInput", not isinstance(x, torch.Tensor), False)
        (extra,) = extra_inputs
        return add(x, extra), extra.dtype

    def op_backward(self, ctx, dy):
        extra_grad = dy if dy.dtype == ctx.saved else dy.to(ctx.saved)
        return (dy, (extra_grad,)), ()


class MakeExtraOutput(BasicOperation):
    """Passes x on and also returns it as an extra output of the Sequential (e.g. the residual);
    dx = fl(dy + d_extra)."""

    num_extra_outputs = 1

    def describe(self) -> OpDesc:
        return OpDesc("make_extra_output", "MakeExtraOutput")

    def op_forward_compute(self, x, params):
        check_input_kind("MakeExtraOutput", not isinstance(x, torch.Tensor), False)
        return (x, (x,)), None

    def op_backward(self, ctx, dy):
        dy, (d_extra,) = dy
        return add(dy, d_extra), ()

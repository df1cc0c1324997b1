"""JAX structural basic ops: Identity, Reshape, ConstantScale, AddExtraInput, MakeExtraOutput."""

from __future__ import annotations

from typing import Sequence

from ...fusion.ops import OpDesc, check_input_kind
from ...quantized_tensor import QuantizedTensor
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
    """y = x.reshape(shape); the gradient is reshaped back."""

    def __init__(self, shape: Sequence[int]) -> None:
        self.shape = tuple(int(s) for s in shape)

    def describe(self) -> OpDesc:
        return OpDesc("reshape", "Reshape")

    def op_forward_compute(self, x, params):
        check_input_kind("Reshape", isinstance(x, QuantizedTensor), False)
        return x.reshape(self.shape), tuple(x.shape)

    def op_backward(self, ctx, dy):
        return dy.reshape(ctx.saved), ()


class ConstantScale(BasicOperation):
    """y = fl(x · c) in x's dtype; dx = fl(dy · c)."""

    def __init__(self, scale: float) -> None:
        self.scale = float(scale)

    def describe(self) -> OpDesc:
        return OpDesc("constant_scale", "ConstantScale")

    def op_forward_compute(self, x, params):
        check_input_kind("ConstantScale", isinstance(x, QuantizedTensor), False)
        return scale(x, self.scale), None

    def op_backward(self, ctx, dy):
        return scale(dy, self.scale), ()


class AddExtraInput(BasicOperation):
    """y = fl(x + e), e the next extra input; both get dy."""

    num_extra_inputs = 1

    def describe(self) -> OpDesc:
        return OpDesc("add_extra_input", "AddExtraInput")

    def op_forward_compute(self, x, params, *, extra_inputs):
        check_input_kind("AddExtraInput", isinstance(x, QuantizedTensor), False)
        (extra,) = extra_inputs
        return add(x, extra), extra.dtype

    def op_backward(self, ctx, dy):
        return (dy, (dy.astype(ctx.saved),)), ()


class MakeExtraOutput(BasicOperation):
    """Passes x on and returns it as an extra output; dx = fl(dy + d_extra)."""

    num_extra_outputs = 1

    def describe(self) -> OpDesc:
        return OpDesc("make_extra_output", "MakeExtraOutput")

    def op_forward_compute(self, x, params):
        check_input_kind("MakeExtraOutput", isinstance(x, QuantizedTensor), False)
        return (x, (x,)), None

    def op_backward(self, ctx, dy):
        dy, (d_extra,) = dy
        return add(dy, d_extra), ()

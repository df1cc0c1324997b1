"""JAX basic op Quantize (twinengine.pytorch.ops.Quantize's twin)."""

from __future__ import annotations

from ...fusion.ops import OpDesc, check_quantize_op_quantizer
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._ops.quantize import quantize
from .op import BasicOperation


class Quantize(BasicOperation):
    """Quantizes its input for the BasicLinear after it (that Linear's input quantization under a
    recipe, else ``quantizer``; neither: pass-through). Backward: straight-through."""

    def __init__(self, quantizer: Quantizer | None = None) -> None:
        check_quantize_op_quantizer(quantizer)
        self.quantizer = quantizer

    def describe(self) -> OpDesc:
        return OpDesc("quantize", "Quantize")

    def op_input_quantization(self, static, arrays):
        return {"quantizer": self.quantizer, "scale": None} if self.quantizer is not None else None

    def op_forward_compute(self, x, params, *, quantizer=None, scale=None, rng=None):
        if isinstance(x, QuantizedTensor):
            return x, None
        quantizer = quantizer if quantizer is not None else self.quantizer
        if quantizer is None or x.size == 0:  # zero rows stay a (empty) high-precision array
            return x, None
        return quantize(x, quantizer, scale=scale, rng=rng), None

    def op_backward(self, ctx, dy):
        return dy, ()

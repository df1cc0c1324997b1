"""Basic op Quantize: hands the next op a QuantizedTensor instead of a high-precision tensor."""

from __future__ import annotations

import torch

from ...fusion.ops import OpDesc, check_quantize_op_quantizer
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._ops.quantize import quantize
from .op import BasicOperation


class Quantize(BasicOperation):
    """Quantizes its input for the BasicLinear after it (TE's ``ops.Quantize``).

    Under autocast, when followed by a BasicLinear, it uses that Linear's input quantization (so
    the bytes equal the Linear quantizing its input itself); otherwise it uses ``quantizer``
    (current-scaling kinds only: delayed scaling needs a Linear's state). With neither it passes
    its input through. A norm or activation before it writes the quantized output itself (one
    fused kernel). The backward is straight-through: dx = dy.

    Raises:
        TypeError: a quantizer that is not a twinengine Quantizer, or a delayed-scaling one.
    """

    def __init__(self, quantizer: Quantizer | None = None) -> None:
        super().__init__()
        check_quantize_op_quantizer(quantizer)
        self.quantizer = quantizer

    def describe(self) -> OpDesc:
        return OpDesc("quantize", "Quantize")

    def op_input_quantization(self, static, tensors):
        return {"quantizer": self.quantizer, "scale": None} if self.quantizer is not None else None

    def op_forward_compute(self, x, params, *, quantizer=None, scale=None, rng=None):
        if isinstance(x, QuantizedTensor):
            return x, None
        quantizer = quantizer if quantizer is not None else self.quantizer
        if quantizer is None or x.numel() == 0:  # zero rows stay a (empty) high-precision tensor
            return x, None
        return quantize(x, quantizer, scale=scale, rng=rng), None

    def op_backward(self, ctx, dy):
        return dy, ()

"""twinengine: low-precision (FP8, MXFP8, FP8 block, NVFP4) training, one numerics core.

This package is framework-free: it imports neither torch nor jax. Frontends live in
``twinengine.pytorch`` and ``twinengine.jax``; both quantize through the same kernels and
give the same bytes for the same input.
"""

from . import recipe
from .dtypes import canonical_dtype
from .quantized_tensor import QuantizedTensor
from .quantizers import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8DelayedScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    Quantizer,
)

__all__ = [
    "Float8BlockQuantizer",
    "Float8CurrentScalingQuantizer",
    "Float8DelayedScalingQuantizer",
    "MXFP8Quantizer",
    "NVFP4Quantizer",
    "QuantizedTensor",
    "Quantizer",
    "canonical_dtype",
    "recipe",
]

__version__ = "0.1.0"

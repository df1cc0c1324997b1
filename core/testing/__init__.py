"""twinengine.testing: what you need to test your own quantization kernels against twinengine.

- ``assert_quantized_equal(a, b)``: two QuantizedTensors (torch, JAX or NumPy arrays) equal bit
  for bit — data, scales with zero padding, amaxes — with a readable first-difference report.
- ``reference_quantize(x, quantizer)`` / ``reference_dequantize(qt)``: the independent NumPy
  reference of every format (``twinengine.testing.reference``, written from NUMERICS.md; it
  imports no kernel and no frontend), the bytes twinengine's kernels are tested against.
- ``edge_values(dtype, fmt)``: the inputs that break quantizers (ties, subnormals, over-max,
  ±inf, NaN, all-zero blocks, constant rows).

Needs NumPy and ml_dtypes; imports torch or JAX only to read arrays you pass from them.
"""

from . import reference
from .compare import assert_quantized_equal, to_numpy
from .edge_values import FAMILIES, edge_values
from .quantize import reference_dequantize, reference_quantize

__all__ = ["FAMILIES", "assert_quantized_equal", "edge_values", "reference", "reference_dequantize",
           "reference_quantize", "to_numpy"]

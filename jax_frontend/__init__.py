"""twinengine.jax: twinengine ops for JAX as XLA FFI calls, jit- and vmap-clean."""

from . import _library  # noqa: F401  (registers FFI targets and the QuantizedTensor pytree)
from .autocast import autocast
from .ops.dense import delayed_scaling_state, dense
from .ops.gemm import gemm
from .ops.quantize import dequantize, quantize, record_amax, update_delayed_scaling

__all__ = ["autocast", "delayed_scaling_state", "dense", "dequantize", "gemm", "quantize", "record_amax", "update_delayed_scaling"]

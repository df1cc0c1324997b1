"""twinengine.jax.from_torch: torch tensors and QuantizedTensors as JAX arrays sharing their memory."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy  # noqa: F401  (jax.numpy.dtype)

from ..dtypes import canonical_dtype
from ..interop import fail_dtype, fail_no_device, fail_not_contiguous, hand_over
from ..ops.opdef import fail

_OP = "from_torch"
_X64_DTYPES = ("int64", "uint64", "float64", "complex128")
"""Dtypes JAX narrows to 32 bits (a copy) unless jax_enable_x64 is set."""


@functools.cache
def _dlpack_carries(name: str) -> bool:
    """Whether torch's and JAX's DLPack both carry dtype `name` (float8 codes are DLPack 1.1)."""
    import torch

    try:
        return jax.dlpack.from_dlpack(torch.zeros(1, dtype=getattr(torch, name))).dtype == jax.numpy.dtype(name)
    except (BufferError, RuntimeError, TypeError, ValueError):
        return False


def _device_type(tensor: Any) -> str:
    return tensor.device.type


def _to_jax(name: str, tensor: Any) -> jax.Array:
    import torch

    if not isinstance(tensor, torch.Tensor):
        fail(_OP, TypeError, f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        fail_not_contiguous(_OP, name, tuple(tensor.shape), tuple(tensor.stride()))
    if tensor.device.type != "cpu" and not jax.devices()[0].platform == "gpu":
        fail_no_device(_OP, name, str(tensor.device), "JAX", ", ".join(sorted({d.platform for d in jax.devices()})))
    dtype = canonical_dtype(tensor.dtype)
    if dtype in _X64_DTYPES and not jax.config.jax_enable_x64:
        fail_dtype(_OP, name, dtype, "JAX runs without jax_enable_x64 and would narrow it to 32 bits")
    tensor = tensor.detach()
    if _dlpack_carries(dtype):
        return jax.dlpack.from_dlpack(tensor)
    if tensor.element_size() != 1:
        fail_dtype(_OP, name, dtype, "DLPack of this torch / JAX pair has no code for it")
    # A 1-byte payload (float8) DLPack lacks crosses as its uint8 bytes; JAX's bitcast back to
    # the dtype is a new buffer.
    return jax.lax.bitcast_convert_type(jax.dlpack.from_dlpack(tensor.view(torch.uint8)), jax.numpy.dtype(dtype))


def from_torch(value: Any) -> Any:
    """A torch tensor, or a ``twinengine.QuantizedTensor`` of torch tensors, as JAX arrays that
    share its memory (DLPack, no copy on CPU or CUDA).

    Shapes: unchanged; every present QuantizedTensor field (both copies, scales, amaxes) crosses;
        quantizer, shape and dtype are kept.
    Dtypes: unchanged, float8 included (DLPack 1.1 codes); a 1-byte dtype the installed DLPack
        lacks crosses as uint8 bytes and is viewed back as its dtype (JAX's bitcast copies once).
        NVFP4 data is packed E2M1 in uint8 and crosses as is.
    Numerics: bytes identical; in-place writes through torch are seen by the JAX array.
    Raises:
        TypeError: not a torch tensor; a 64-bit dtype while JAX runs without x64.
        ValueError: a non-contiguous tensor, a device JAX does not see, or a QuantizedTensor
            whose arrays live on different devices.
    """
    return hand_over(_OP, value, _to_jax, _device_type)

"""twinengine.pytorch.from_jax: JAX arrays and QuantizedTensors as torch tensors sharing their memory."""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..dtypes import canonical_dtype
from ..interop import fail_dtype, fail_no_device, hand_over
from ..ops.opdef import fail

_OP = "from_jax"


@functools.cache
def _dlpack_carries(name: str) -> bool:
    """Whether torch's and JAX's DLPack both carry dtype `name` (float8 codes are DLPack 1.1)."""
    import jax.numpy as jnp

    try:
        return torch.from_dlpack(jnp.zeros((1,), name)).dtype == getattr(torch, name, None)
    except (BufferError, RuntimeError, TypeError, ValueError):
        return False


def _device_type(array: Any) -> str:
    (device,) = array.devices()
    return device.platform


def _to_torch(name: str, array: Any) -> torch.Tensor:
    import jax

    if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer):
        fail(_OP, TypeError, f"{name} must be a concrete jax.Array (not a tracer inside jax.jit), "
             f"got {type(array).__name__}")
    if len(array.devices()) != 1:
        fail(_OP, ValueError, f"{name} is sharded over {len(array.devices())} devices; DLPack hands over one "
             "device's buffer, so gather it (or hand over each shard) first")
    platform = _device_type(array)
    if platform != "cpu" and not torch.cuda.is_available():
        fail_no_device(_OP, name, platform, "torch", "cpu only")
    dtype = canonical_dtype(array.dtype)
    if _dlpack_carries(dtype):
        return torch.from_dlpack(array)
    if array.dtype.itemsize != 1:
        fail_dtype(_OP, name, dtype, "DLPack of this torch / JAX pair has no code for it")
    # A 1-byte payload (float8) DLPack lacks crosses as its uint8 bytes; JAX's bitcast is a new
    # buffer, the torch view of it is not.
    return torch.from_dlpack(jax.lax.bitcast_convert_type(array, "uint8")).view(getattr(torch, dtype))


def from_jax(value: Any) -> Any:
    """A JAX array, or a ``twinengine.QuantizedTensor`` of JAX arrays, as torch tensors that
    share its memory (DLPack, no copy on CPU or CUDA).

    Shapes: unchanged; every present QuantizedTensor field (both copies, scales, amaxes) crosses;
        quantizer, shape and dtype are kept.
    Dtypes: unchanged, float8 included (DLPack 1.1 codes); a 1-byte dtype the installed DLPack
        lacks crosses as uint8 bytes and is viewed back as its dtype (then JAX side copies once).
        NVFP4 data is packed E2M1 in uint8 and crosses as is.
    Numerics: bytes identical; writes through either framework's handle are seen by the other
        (JAX treats its arrays as immutable: mutate only buffers JAX no longer uses).
    Raises:
        TypeError: not a concrete jax.Array (e.g. a tracer).
        ValueError: an array sharded over several devices, a device torch does not see, or a
            QuantizedTensor whose arrays live on different devices.
    """
    return hand_over(_OP, value, _to_torch, _device_type)

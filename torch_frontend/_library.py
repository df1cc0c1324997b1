"""PyTorch glue shared by every op family: the extension, dtype maps, opaque quantizer
registration, the QuantizedTensor pytree, and launching a core KernelCall on tensors."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch._library.opaque_object import register_opaque_type

from .. import _C
from .. import quantizers as _quantizers
from ..dtypes import ABI_CODES, canonical_dtype
from ..ops.opdef import KernelCall, check_device
from ..ops.quantize import ArrayMeta
from ..quantized_tensor import QuantizedTensor

_TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint32": torch.uint32,
}
_DEVICE_CODES = {"cpu": 0, "cuda": 1}


SUPPORTED_DEVICES: tuple[str, ...] = ("cpu", "cuda") if _C.has_cuda() else ("cpu",)
"""Device types this build has kernels for (a constant, so compiled code reads no extension)."""


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return canonical_dtype(dtype)


def meta(t: torch.Tensor | None) -> ArrayMeta | None:
    """What core sees of a tensor: its shape and dtype name."""
    if t is None:
        return None
    return ArrayMeta(tuple(t.shape), dtype_name(t.dtype))


def check_tensor_device(op: str, name: str, t: torch.Tensor | None) -> None:
    if t is not None:
        check_device(op, name, t.device.type, SUPPORTED_DEVICES)


def _view(t: torch.Tensor) -> tuple[int, int, int, tuple[int, ...]]:
    return (t.data_ptr(), ABI_CODES[dtype_name(t.dtype)], _DEVICE_CODES[t.device.type], tuple(t.shape))


def empty_outputs(call: KernelCall, device: torch.device) -> list[torch.Tensor]:
    """Outputs of a planned call, allocated on `device` (fake tensors under FakeTensorMode)."""
    return [torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device=device) for spec in call.outputs]


def launch(call: KernelCall, inputs: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Runs a planned kernel call on the current stream of `device` (made the current CUDA
    device for the call, as the CUDA kernels require); returns its outputs. A call whose
    outputs are all empty has nothing to write and launches nothing."""
    inputs = [t.contiguous() for t in inputs]
    outputs = empty_outputs(call, device)
    if all(t.numel() == 0 for t in outputs):
        return outputs
    views = ([_view(t) for t in inputs], [_view(t) for t in outputs])
    if device.type == "cuda":
        with torch.cuda.device(device):
            _C.call(call.op, *views, call.attr_dict(), torch.cuda.current_stream(device).cuda_stream)
    else:
        _C.call(call.op, *views, call.attr_dict(), 0)
    return outputs


def _register_quantizers() -> None:
    """Every concrete quantizer spec becomes an opaque *value* type: an argument of
    torch.ops.twinengine.* ops, baked into FX graphs, guarded by value."""
    classes = [_quantizers.Quantizer]
    for cls in classes:
        classes.extend(cls.__subclasses__())
        register_opaque_type(cls, typ="value")


def _register_pytree() -> None:
    pytree.register_pytree_node(
        QuantizedTensor,
        lambda qt: qt.tree_flatten(),
        lambda children, aux: QuantizedTensor.tree_unflatten(aux, children),
        serialized_type_name="twinengine.QuantizedTensor",
    )


_register_quantizers()
_register_pytree()

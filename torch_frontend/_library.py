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


_DTYPE_NAMES = {dtype: name for name, dtype in _TORCH_DTYPES.items()}
_ABI_BY_TORCH = {dtype: ABI_CODES[name] for name, dtype in _TORCH_DTYPES.items()}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    return name if name is not None else canonical_dtype(dtype)


def plain_eager(*tensors: torch.Tensor | None) -> bool:
    """Whether an op may skip the torch dispatcher and run its real impl directly: plain
    eager execution (not compiling or tracing, no dispatch or function mode, no functorch
    transform) on plain tensors that need no autograd. The custom op stays the path for
    everything else (torch.compile, export, FakeTensor, opcheck, vmap, subclasses); both run
    the same impl, so the bytes are the same."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled()):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or (grad and t.requires_grad)
                              or torch._C._functorch.is_functorch_wrapped_tensor(t)):
            return False
    return True


def meta(t: torch.Tensor | None) -> ArrayMeta | None:
    """What core sees of a tensor: its shape and dtype name."""
    if t is None:
        return None
    return ArrayMeta(tuple(t.shape), dtype_name(t.dtype))


def check_tensor_device(op: str, name: str, t: torch.Tensor | None) -> None:
    if t is not None and not t.is_cpu:
        check_device(op, name, t.device.type, SUPPORTED_DEVICES)


def view_spec(t: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    """A tensor's view for _C without its data pointer: (dtype code, device code, shape)."""
    code = _ABI_BY_TORCH.get(t.dtype)
    if code is None:
        code = ABI_CODES[dtype_name(t.dtype)]
    return (code, _DEVICE_CODES[t.device.type], tuple(t.shape))


def _view(t: torch.Tensor) -> tuple[int, int, int, tuple[int, ...]]:
    return (t.data_ptr(), *view_spec(t))


def empty_outputs(call: KernelCall, device: torch.device) -> list[torch.Tensor]:
    """Outputs of a planned call, allocated on `device` (fake tensors under FakeTensorMode)."""
    return [torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device=device) for spec in call.outputs]


def packed_call(call: KernelCall, device: torch.device):
    """(output (shape, torch dtype, view without pointer) list, _C.PreparedOp) of a call on a
    device, computed once per (cached) plan."""
    packed = call.memo.get(device)
    if packed is None:
        code = _DEVICE_CODES[device.type]
        outs = [(spec.shape, torch_dtype(spec.dtype), (ABI_CODES[spec.dtype], code, tuple(spec.shape)))
                for spec in call.outputs]
        packed = call.memo[device] = (outs, _C.prepare(call.op, call.attr_dict()))
    return packed


def launch(call: KernelCall, inputs: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Runs a planned kernel call on the current stream of `device` (made the current CUDA
    device for the call, as the CUDA kernels require), on CPU with ``torch.get_num_threads()``
    threads (results never depend on the count); returns its outputs."""
    outs, prepared = packed_call(call, device)
    inputs = [t.contiguous() for t in inputs]  # kept alive until the call returns
    in_views = [_view(t) for t in inputs]
    outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, _ in outs]
    out_views = [(t.data_ptr(), *view) for t, (_, _, view) in zip(outputs, outs)]
    if device.type == "cuda":
        with torch.cuda.device(device):
            prepared(in_views, out_views, torch.cuda.current_stream(device).cuda_stream)
    else:
        prepared(in_views, out_views, 0, torch.get_num_threads())
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

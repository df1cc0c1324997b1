"""PyTorch glue shared by every op family: the extension, dtype maps, opaque quantizer
registration, the QuantizedTensor pytree, and launching a core KernelCall on tensors."""

from __future__ import annotations

import functools
from typing import Any, Callable

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


def launch(call: KernelCall, inputs: list[torch.Tensor], device: torch.device,
           outputs: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Runs a planned kernel call on the current stream of `device` (made the current CUDA
    device for the call, as the CUDA kernels require), on CPU with ``torch.get_num_threads()``
    threads (results never depend on the count); returns its outputs. `outputs`, when given, are
    written in place (contiguous, of the planned shapes and dtypes: the caller checks). A call
    whose outputs are all empty has nothing to write and launches nothing."""
    outs, prepared = packed_call(call, device)
    inputs = [t.contiguous() for t in inputs]  # kept alive until the call returns
    in_views = [_view(t) for t in inputs]
    if outputs is None:
        outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, _ in outs]
        out_views = [(t.data_ptr(), *view) for t, (_, _, view) in zip(outputs, outs)]
    else:
        out_views = [_view(t) for t in outputs]
    if all(t.numel() == 0 for t in outputs):
        return outputs
    if device.type == "cuda":
        with torch.cuda.device(device):
            prepared(in_views, out_views, torch.cuda.current_stream(device).cuda_stream)
    else:
        prepared(in_views, out_views, 0, torch.get_num_threads())
    return outputs


# ---- our errors under torch.compile(fullgraph=True) ------------------------------------------
# Dynamo turns an exception raised while it traces (our shared core checks run at trace time)
# into torch._dynamo.exc.Unsupported ("Observed exception") under fullgraph=True. The public
# functions therefore catch our TypeError / ValueError while compiling and put a call of
# twinengine::raise_error into the graph instead: it raises the same type with the same text
# when the compiled code runs — before any op that consumes the failed call's results (they
# depend on its output), and never removed (it is registered as a side effect).
# The text must be a constant at trace time: with symbolic sizes (dynamic=True, or a size
# Dynamo made dynamic after a recompile) core prints sizes through int() / opdef.dims, which
# Dynamo specializes on this failure path; a message printing a raw symbolic size would reach
# the user as Dynamo's Unsupported error instead.

_ERROR_TYPES = {"TypeError": TypeError, "ValueError": ValueError, "RuntimeError": RuntimeError}


@torch.library.custom_op("twinengine::raise_error", mutates_args=())
def _raise_error(anchor: torch.Tensor, exc_type: str, message: str) -> torch.Tensor:
    raise _ERROR_TYPES[exc_type](message)


@_raise_error.register_fake
def _(anchor, exc_type, message):
    return torch.empty_like(anchor)


def _raise_error_backward(ctx, grad):
    # Reached only while AOT autograd traces the joint graph of a failing call whose inputs
    # require grad: the compiled forward raises before any backward runs.
    return grad, None, None


_raise_error.register_autograd(_raise_error_backward)
torch.fx.node.has_side_effect(torch.ops.twinengine.raise_error.default)


def _first_tensor(values) -> torch.Tensor | None:
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, QuantizedTensor):
            for name in ("rowwise_data", "columnwise_data"):
                if getattr(value, name) is not None:
                    return getattr(value, name)
    return None


def surface_errors(fallback: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator of a public function: under torch.compile our TypeError / ValueError reach the
    user with their type and text when the compiled code runs (see above). `fallback(err,
    *args, **kwargs)` builds a stand-in result from the raise_error output `err` so that the
    trace can go on; it is never returned to the user (the call raises first)."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling():
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            except (TypeError, ValueError) as error:
                anchor = _first_tensor(list(args) + list(kwargs.values()))
                if anchor is None or not str(error).startswith("twinengine."):
                    raise
                err = torch.ops.twinengine.raise_error(anchor, type(error).__name__, str(error))
                return fallback(err, *args, **kwargs)
        return wrapper
    return decorate


def tensor_fallback(err: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return err


def tuple_fallback(count: int) -> Callable[..., tuple[torch.Tensor, ...]]:
    return lambda err, *args, **kwargs: (err,) * count


def zeros_like_args(*indices: int) -> Callable[..., Any]:
    """Stand-in of a backward function: zeros shaped like its positional arguments `indices`
    (the forward inputs whose gradients it returns), so that the autograd.Function whose
    forward failed still returns gradients of the right shapes while AOT autograd traces it
    (the compiled forward raises first; this backward never runs)."""
    def fallback(err: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        grads = tuple(torch.zeros_like(args[i]) for i in indices)
        return grads[0] if len(grads) == 1 else grads
    return fallback


def quantized_stand_in(err: torch.Tensor, quantizer: Any) -> QuantizedTensor:
    """A QuantizedTensor whose every array is the raise_error output (a trace stand-in)."""
    spec = quantizer if isinstance(quantizer, _quantizers.Quantizer) else None
    amax = err.new_zeros((1,), dtype=torch.float32) + err.sum().float() * 0  # amaxes are (1,) fp32
    return QuantizedTensor(rowwise_data=err, rowwise_scale_inv=err, columnwise_data=err, columnwise_scale_inv=err,
                           amax=amax, columnwise_amax=amax, quantizer=spec, shape=tuple(err.shape))


def fused_quantize_fallback(count: int) -> Callable[..., tuple[Any, ...]]:
    """Stand-in of a function returning `count` tensors and then a QuantizedTensor (None when
    called without ``quantizer=``): the norm / activation families with a fused quantize."""
    def fallback(err: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        quantizer = kwargs.get("quantizer")
        return (err,) * count + (None if quantizer is None else quantized_stand_in(err, quantizer),)
    return fallback


def norm_fallback(count: int) -> Callable[..., tuple[Any, ...]]:
    """Stand-in of a norm forward (x, weight, ...) returning y, `count - 1` per-row statistics
    and a QuantizedTensor (None without ``quantizer=``), shaped as a valid call would be: y is
    x.shape[:-1] + weight's length, the statistics x.shape[:-1] in fp32. So when x's last
    dimension does not match the weight, the ops after the norm (a Linear of the norm's
    width) and their backward still trace, and the compiled call raises our error first."""
    def fallback(err: torch.Tensor, x: torch.Tensor, weight: Any = None, *args: Any, **kwargs: Any) -> tuple:
        features = weight.shape[-1] if isinstance(weight, torch.Tensor) and weight.dim() == 1 else x.shape[-1]
        tie = err.sum() * 0  # keeps the raise_error call in the graph
        y = err.new_zeros((*x.shape[:-1], features)) + tie
        stats = err.new_zeros(x.shape[:-1], dtype=torch.float32) + tie.float()
        quantizer = kwargs.get("quantizer")
        return (y,) + (stats,) * (count - 1) + (None if quantizer is None else quantized_stand_in(y, quantizer),)
    return fallback


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


def _register_pickle_codec() -> None:
    """float8 tensors cannot go through plain pickle (torch's UntypedStorage has no dtype for
    them): a QuantizedTensor pickles them as their uint8 bytes plus the dtype name."""
    from ..quantized_tensor import PICKLE_CODECS

    float8 = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
    PICKLE_CODECS.append((
        lambda a: isinstance(a, torch.Tensor) and a.dtype in float8,
        lambda a: (float8[a.dtype], a.detach().contiguous().view(torch.uint8)),
        lambda payload: payload[1].view(torch_dtype(payload[0])),
    ))


def _package_quantizer_constants() -> None:
    """torch.export.save writes the program's constants from ``ExportedProgram.constants`` only,
    while its graph serializer names opaque *value* arguments ``_custom_obj_<n>`` and expects
    them among the loaded constants, so ``torch.export.load`` fails with KeyError
    '_custom_obj_0' for any program holding our quantizer specs (torch 2.13). This wraps the
    archive writer's constant packaging to also write those values (plain pickle, the format
    the loader reads back for opaque values), under the names the graph uses."""
    import os
    import pickle

    from torch._export.serde import schema
    from torch._export.serde.serialize import GraphModuleSerializer
    from torch._library.opaque_object import is_opaque_value
    from torch.export.pt2_archive import _package
    from torch.export.pt2_archive.constants import CONSTANTS_DIR, OPAQUE_OBJ_FILENAME_PREFIX

    original = _package._package_constants
    if getattr(original, "_twinengine", False):
        return

    def package_constants(model_name, exported_program, archive_writer, pickle_protocol=pickle.DEFAULT_PROTOCOL):
        config = original(model_name, exported_program, archive_writer, pickle_protocol)
        serializer = GraphModuleSerializer(exported_program.graph_signature, exported_program.module_call_graph)
        serializer.serialize(exported_program.graph_module)
        index = archive_writer.count_prefix(os.path.join(CONSTANTS_DIR, OPAQUE_OBJ_FILENAME_PREFIX))
        for name, value in serializer.custom_objs.items():
            if name in config.config or name in exported_program.constants or not is_opaque_value(value):
                continue
            if not isinstance(value, _quantizers.Quantizer):
                continue
            path_name = f"{OPAQUE_OBJ_FILENAME_PREFIX}{index}"
            index += 1
            archive_writer.write_bytes(os.path.join(CONSTANTS_DIR, path_name), pickle.dumps(value, protocol=2))
            config.config[name] = schema.PayloadMeta(path_name=path_name, is_param=False, use_pickle=True,
                                                     tensor_meta=None)
        return config

    package_constants._twinengine = True
    _package._package_constants = package_constants


_register_quantizers()
_register_pytree()
_register_pickle_codec()
_package_quantizer_constants()

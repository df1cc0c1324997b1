"""JAX glue shared by every op family: FFI target registration, dtype maps, the
QuantizedTensor pytree, and calling a core KernelCall through jax.ffi."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _C
from ..dtypes import canonical_dtype
from ..ops.opdef import KernelCall
from ..ops.quantize import ArrayMeta
from ..quantized_tensor import QuantizedTensor

_JAX_DTYPES = {
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "float16": jnp.float16,
    "float8_e4m3fn": jnp.float8_e4m3fn,
    "float8_e5m2": jnp.float8_e5m2,
    "uint8": jnp.uint8,
    "int32": jnp.int32,
    "int64": jnp.int64,
    "uint32": jnp.uint32,
}


def jax_dtype(name: str):
    return _JAX_DTYPES[name]


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = canonical_dtype(np.dtype(dtype).name)
    return name


def meta(x) -> ArrayMeta | None:
    """What core sees of an array: its shape and dtype name."""
    if x is None:
        return None
    return ArrayMeta(tuple(x.shape), dtype_name(x.dtype))


def _attr(value: int | float):
    """Attributes typed as the handlers read them: int64 or float32."""
    return np.float32(value) if isinstance(value, float) else np.int64(value)


def _ffi_call(call: KernelCall, inputs) -> list:
    result_types = [jax.ShapeDtypeStruct(spec.shape, jax_dtype(spec.dtype)) for spec in call.outputs]
    attrs = {name: _attr(value) for name, value in call.attrs}
    outputs = list(jax.ffi.ffi_call(call.ffi_target, result_types, vmap_method="sequential")(*inputs, **attrs))
    return _varying_like(inputs, outputs)


def _vma(x) -> frozenset:
    """The manual mesh axes a traced value varies over (empty outside shard_map)."""
    if not isinstance(x, jax.core.Tracer):
        return frozenset()
    mat = getattr(jax.typeof(x), "mat", None)
    return frozenset(getattr(mat, "varying", ()))


def varying_together(*trees):
    """`trees` with every traced array leaf typed as varying over the union of the manual mesh
    axes any leaf varies over (``lax.pcast(to="varying")``, what JAX inserts for its own
    primitives). Called on a custom_vjp's arguments inside ``jax.shard_map(check_vma=True)``:
    the gradient of a replicated (invariant) argument is then ``psum``-ed by the pcast's
    transpose, as for a ``jnp`` op. Identity outside shard_map."""
    leaves, treedef = jax.tree_util.tree_flatten(trees)
    return treedef.unflatten(_varying_like(leaves, leaves))


def _varying_like(inputs, outputs) -> list:
    """Outputs typed as varying over every manual mesh axis an input varies over: inside
    ``jax.shard_map(check_vma=True)`` a kernel's results are per-shard values (XLA's FFI call
    leaves them invariant-typed, which the shard_map's gradients reject)."""
    axes = frozenset().union(*[_vma(a) for a in inputs if a is not None])
    if not axes:
        return outputs
    return [out if not isinstance(out, jax.core.Tracer) and not isinstance(out, jax.Array)
            or not (missing := tuple(sorted(axes - _vma(out)))) else jax.lax.pcast(out, missing, to="varying")
            for out in outputs]


def ffi(call: KernelCall, inputs: list) -> list:
    """Runs a planned kernel call as an XLA FFI custom call; returns its outputs.

    vmap runs the call once per batch element, so batching never changes the numerics. A call
    whose outputs are all empty has nothing to write and is not emitted. Called eagerly (no
    input is a tracer), it runs a jax.jit of the call kept with the (cached) plan, so repeated
    eager calls dispatch a compiled executable instead of binding the custom call afresh each
    time; the kernel and its bytes are the same.
    """
    if all(np.prod(spec.shape, dtype=np.int64) == 0 for spec in call.outputs):
        return [jnp.zeros(spec.shape, jax.dtypes.canonicalize_dtype(jax_dtype(spec.dtype))) for spec in call.outputs]
    if any(isinstance(a, jax.core.Tracer) for a in inputs):
        return _ffi_call(call, inputs)
    jitted = call.memo.get("jax")
    if jitted is None:  # plans that are not cached still meet an equal call's jit here
        jitted = _JITTED.get(call)
        if jitted is None:
            if len(_JITTED) >= _JITTED_LIMIT:
                _JITTED.clear()
            jitted = _JITTED[call] = jax.jit(lambda *args: _ffi_call(call, args))
        call.memo["jax"] = jitted
    return list(jitted(*inputs))


_JITTED: dict[KernelCall, object] = {}  # eager calls' jitted FFI calls, by value
_JITTED_LIMIT = 4096


def export_disabled_checks() -> list:
    """The ``disabled_checks=`` that ``jax.export.export`` needs for programs calling twinengine:
    one ``DisabledSafetyCheck.custom_call`` per FFI target. Our targets carry no cross-version
    compatibility guarantee: a serialized program runs with the same twinengine build (the
    targets are registered by ``import twinengine.jax``)."""
    return [jax.export.DisabledSafetyCheck.custom_call(name) for name in sorted(_C.ffi_targets())]


def _register_targets() -> None:
    for name, platforms in _C.ffi_targets().items():
        for platform, capsule in platforms.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)


def _register_pytree() -> None:
    jax.tree_util.register_pytree_node(
        QuantizedTensor,
        lambda qt: qt.tree_flatten(),
        QuantizedTensor.tree_unflatten,
    )


_register_targets()
_register_pytree()

"""twinengine.jax.gemm over the XLA FFI target twinengine_gemm.
Shapes, checks and errors come from core/ops/gemm.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ... import _C
from ...ops.gemm import GEMM, gemm_arrays, gemm_operand, gemm_plan_query, gemm_workspace_bytes, with_workspace
from ...quantized_tensor import QuantizedTensor
from .._library import dtype_name, ffi, jax_dtype, meta
from ..partitioning import Dims, Rule, factor_sizes, partitioned, plain_dims, quantized_blocks, quantized_dims, shards_locally


def _cuda_capability() -> int:
    """Compute capability (major·10 + minor) of the default backend's device, 0 off CUDA."""
    device = jax.devices()[0]
    if device.platform != "gpu" or not _C.has_cuda():
        return 0
    major, minor = str(device.compute_capability).split(".")
    return 10 * int(major) + int(minor)


def gemm(a, b, bias=None, *, a_columnwise: bool = False, b_columnwise: bool = False, out_dtype=jnp.float32):
    """out = op(a) · op(b)ᵀ (+ bias), op(x) = x (rowwise copy) or xᵀ (columnwise copy).

    Shapes, Dtypes, Numerics: as ``twinengine.pytorch.gemm`` (same kernel, identical bytes).
        Under vmap each batch element runs its own GEMM.
    Sharded jit (``twinengine.jax.partitioning``): rows of op(a) and of op(b) (the output's
        rows and columns) shard locally, bytes unchanged; a sharded K gives fp32 partial
        outputs, ``psum``-ed, then bias added and cast: the unsharded result within the
        tolerance of another fp32 summation order (NUMERICS.md §12). NVFP4 operands, and
        columnwise operands of rank > 2, run replicated.
    Raises:
        TypeError / ValueError: from the shared core checks (core/ops/gemm.py).
    """
    if not isinstance(a, QuantizedTensor):
        a = jnp.asarray(a)
    if not isinstance(b, QuantizedTensor):
        b = jnp.asarray(b)
    descs = [x if isinstance(x, QuantizedTensor) else meta(x) for x in (a, b)]
    call = GEMM.plan(*descs, meta(bias), a_columnwise=a_columnwise, b_columnwise=b_columnwise,
                     out_dtype=dtype_name(out_dtype))
    arrays = gemm_arrays(a, b, bias, a_columnwise, b_columnwise)
    quantizers = tuple(x.quantizer if isinstance(x, QuantizedTensor) else None for x in (a, b))
    static = (quantizers, a_columnwise, b_columnwise, dtype_name(out_dtype), call.inputs)
    (out,) = _gemm_op(_gemm_rule(call, a, b, bias, a_columnwise, b_columnwise), static,
                      *[arrays[name] for name in call.inputs])
    return out


def _operand_dims(x, columnwise: bool, out: str) -> Dims:
    """The logical dims of one operand: its op() rows named out0, out1, ..., the contraction k."""
    rank = len(x.shape)
    if columnwise:
        return (("k",), (f"{out}0",)) if rank == 2 else plain_dims(out, x.shape)
    return plain_dims(out, x.shape[:-1]) + (("k",),)


def _gemm_rule(call, a, b, bias, a_columnwise: bool, b_columnwise: bool) -> Rule:
    """Output rows / columns local, K a partial-sum factor; replicated for NVFP4 operands and
    columnwise operands of rank > 2."""
    dims, shapes, blocks = {}, [], []
    for name, x, columnwise, out in (("a", a, a_columnwise, "m"), ("b", b, b_columnwise, "n")):
        x_dims = _operand_dims(x, columnwise, out)
        shapes.append((x_dims, x.shape))
        if isinstance(x, QuantizedTensor):
            prefix, amax = ("columnwise", "columnwise_amax") if columnwise else ("rowwise", "amax")
            fields = {"data": f"{prefix}_data", "scale_inv": f"{prefix}_scale_inv", "amax": amax}
            for part, field in fields.items():
                dims[f"{name}_{part}"] = quantized_dims(x.quantizer, x_dims, field)
            blocks += quantized_blocks(x.quantizer, x_dims, name)
        else:
            dims[f"{name}_data"] = x_dims
    a_out = tuple(f for d in shapes[0][0] if d != ("k",) for f in d)
    b_out = tuple(f for d in shapes[1][0] if d != ("k",) for f in d)
    dims["bias"] = (b_out,)
    sizes = factor_sizes(shapes)
    plain = all(("k",) in d for d, _ in shapes) and not any(
        isinstance(x, QuantizedTensor) and not shards_locally(x.quantizer) for x in (a, b))
    factors = frozenset(f for f, _ in sizes)
    return Rule("gemm", tuple((name, dims[name]) for name in call.inputs), ((a_out, b_out),), sizes,
                local=factors - {"k"} if plain else frozenset(), reduce=frozenset({"k"}) if plain else frozenset(),
                blocks=tuple(blocks), partial=(0,))


def _gemm_operands(static, arrays):
    quantizers, a_columnwise, b_columnwise, _, names = static
    named = dict(zip(names, arrays))
    operands = []
    for name, quantizer, columnwise in (("a", quantizers[0], a_columnwise), ("b", quantizers[1], b_columnwise)):
        if quantizer is None:
            operands.append(named[f"{name}_data"])
        else:
            operands.append(gemm_operand(named[f"{name}_data"], named[f"{name}_scale_inv"], quantizer, columnwise,
                                         named.get(f"{name}_amax")))
    return operands[0], operands[1], named.get("bias")


def _gemm_shard(static, sizes, *arrays):
    """The GEMM on one shard (or the whole operands)."""
    a, b, bias = _gemm_operands(static, arrays)
    return (_gemm_local(a, b, bias, static[1], static[2], static[3]),)


def _gemm_partial(static, sizes, *arrays):
    """A K shard's fp32 partial output; finished as fl(Σ + bias) in the output dtype."""
    a, b, bias = _gemm_operands(static, arrays)
    partial = _gemm_local(a, b, None, static[1], static[2], "float32")

    def finish(sums):
        y = sums[0] if bias is None else sums[0] + bias.astype(jnp.float32)
        return (y.astype(jax_dtype(static[3])),)
    return (partial,), finish


_gemm_op = partitioned(_gemm_shard, _gemm_partial)


def _gemm_local(a, b, bias, a_columnwise: bool, b_columnwise: bool, out_dtype: str):
    descs = [x if isinstance(x, QuantizedTensor) else meta(x) for x in (a, b)]
    kwargs = {"a_columnwise": a_columnwise, "b_columnwise": b_columnwise, "out_dtype": out_dtype}
    call = GEMM.plan(*descs, meta(bias), **kwargs)
    sm = _cuda_capability()
    if sm:
        # The CUDA plan's workspace, an XLA result buffer (the op's other results are unchanged).
        query = gemm_plan_query(*descs, meta(bias), **kwargs, device="cuda", sm=sm,
                                cublaslt_version=_C.gemm_cublaslt_version())
        call = with_workspace(call, gemm_workspace_bytes(_C.gemm_plan(query), query))
    arrays = gemm_arrays(a, b, bias, a_columnwise, b_columnwise)
    return ffi(call, [arrays[name] for name in call.inputs])[0]

"""twinengine.jax.gemm over the XLA FFI target twinengine_gemm.
Shapes, checks and errors come from core/ops/gemm.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ... import _C
from ...ops.gemm import GEMM, gemm_arrays, gemm_plan_query, gemm_workspace_bytes, with_workspace
from ...quantized_tensor import QuantizedTensor
from .._library import dtype_name, ffi, meta


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
    Raises:
        TypeError / ValueError: from the shared core checks (core/ops/gemm.py).
    """
    if not isinstance(a, QuantizedTensor):
        a = jnp.asarray(a)
    if not isinstance(b, QuantizedTensor):
        b = jnp.asarray(b)
    descs = [x if isinstance(x, QuantizedTensor) else meta(x) for x in (a, b)]
    kwargs = {"a_columnwise": a_columnwise, "b_columnwise": b_columnwise, "out_dtype": dtype_name(out_dtype)}
    call = GEMM.plan(*descs, meta(bias), **kwargs)
    sm = _cuda_capability()
    if sm:
        # The CUDA plan's workspace, an XLA result buffer (the op's other results are unchanged).
        query = gemm_plan_query(*descs, meta(bias), **kwargs, device="cuda", sm=sm,
                                cublaslt_version=_C.gemm_cublaslt_version())
        call = with_workspace(call, gemm_workspace_bytes(_C.gemm_plan(query), query))
    arrays = gemm_arrays(a, b, bias, a_columnwise, b_columnwise)
    out = ffi(call, [arrays[name] for name in call.inputs])[0]
    return out

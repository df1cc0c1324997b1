"""twinengine.jax.gemm over the XLA FFI target twinengine_gemm.
Shapes, checks and errors come from core/ops/gemm.py."""

from __future__ import annotations

import jax.numpy as jnp

from ...ops.gemm import GEMM, gemm_arrays
from ...quantized_tensor import QuantizedTensor
from .._library import dtype_name, ffi, meta


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
    call = GEMM.plan(*descs, meta(bias), a_columnwise=a_columnwise, b_columnwise=b_columnwise,
                     out_dtype=dtype_name(out_dtype))
    arrays = gemm_arrays(a, b, bias, a_columnwise, b_columnwise)
    (out,) = ffi(call, [arrays[name] for name in call.inputs])
    return out

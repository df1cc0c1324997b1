"""torch.ops.twinengine.gemm / gemm_quantized and the Python wrapper ``gemm``.
Shapes, checks and errors come from core/ops/gemm.py."""

from __future__ import annotations

import math

import torch

from ... import _C
from ...ops.gemm import (GEMM, copy_arrays, gemm_arrays, gemm_operand, gemm_plan_query, gemm_workspace_bytes,
                         with_workspace)
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._library import (check_tensor_device, dtype_name, empty_outputs, launch, meta, surface_errors,
                        tensor_fallback)


def _describe(x):
    return x if isinstance(x, QuantizedTensor) else meta(x)


def _gemm_impl(a, b, bias, a_columnwise: bool, b_columnwise: bool, out_dtype: str, device: torch.device,
               fake: bool) -> torch.Tensor:
    """a, b: high-precision tensors or single-copy QuantizedTensors (see gemm_operand)."""
    args = (_describe(a), _describe(b), meta(bias))
    kwargs = {"a_columnwise": a_columnwise, "b_columnwise": b_columnwise, "out_dtype": out_dtype}
    if fake:
        (out,) = empty_outputs(GEMM.infer(*args, **kwargs), device)
        return out
    call = GEMM.plan(*args, **kwargs)
    if device.type == "cuda":
        # The plan's workspace, from the caching allocator on the current stream.
        major, minor = torch.cuda.get_device_capability(device)
        query = gemm_plan_query(*args, **kwargs, device="cuda", sm=10 * major + minor,
                                cublaslt_version=_C.gemm_cublaslt_version())
        call = with_workspace(call, gemm_workspace_bytes(_C.gemm_plan(query), query))
    arrays = gemm_arrays(a, b, bias, a_columnwise, b_columnwise)
    out = launch(call, [arrays[name] for name in call.inputs], device)[0]
    return out


@torch.library.custom_op("twinengine::gemm", mutates_args=())
def _gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, a_columnwise: bool, b_columnwise: bool,
          out_dtype: str) -> torch.Tensor:
    return _gemm_impl(a, b, bias, a_columnwise, b_columnwise, out_dtype, a.device, fake=False)


@_gemm.register_fake
def _(a, b, bias, a_columnwise, b_columnwise, out_dtype):
    return _gemm_impl(a, b, bias, a_columnwise, b_columnwise, out_dtype, a.device, fake=True)


@torch.library.custom_op("twinengine::gemm_quantized", mutates_args=())
def _gemm_quantized(a_data: torch.Tensor, a_scale_inv: torch.Tensor, a_amax: torch.Tensor | None,
                    a_quantizer: Quantizer, b_data: torch.Tensor, b_scale_inv: torch.Tensor,
                    b_amax: torch.Tensor | None, b_quantizer: Quantizer, bias: torch.Tensor | None, a_columnwise: bool,
                    b_columnwise: bool, out_dtype: str) -> torch.Tensor:
    a = gemm_operand(a_data, a_scale_inv, a_quantizer, a_columnwise, a_amax)
    b = gemm_operand(b_data, b_scale_inv, b_quantizer, b_columnwise, b_amax)
    return _gemm_impl(a, b, bias, a_columnwise, b_columnwise, out_dtype, a_data.device, fake=False)


@_gemm_quantized.register_fake
def _(a_data, a_scale_inv, a_amax, a_quantizer, b_data, b_scale_inv, b_amax, b_quantizer, bias, a_columnwise,
      b_columnwise, out_dtype):
    a = gemm_operand(a_data, a_scale_inv, a_quantizer, a_columnwise, a_amax)
    b = gemm_operand(b_data, b_scale_inv, b_quantizer, b_columnwise, b_amax)
    return _gemm_impl(a, b, bias, a_columnwise, b_columnwise, out_dtype, a_data.device, fake=True)


def _nvfp4_only(qt: QuantizedTensor, amax: torch.Tensor | None) -> torch.Tensor | None:
    """The copy's global amax where the GEMM reads it (NVFP4), else None (fewer graph inputs)."""
    return amax if qt.quantizer.scaling_mode == "nvfp4" else None


def _gemm_fallback(err: torch.Tensor, a, b, bias=None, *, a_columnwise: bool = False, b_columnwise: bool = False,
                   out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A stand-in of gemm's (M, N) result (see surface_errors), so that code after a failed
    gemm (reshapes in Linear-like ops) still traces to the raise."""
    def rows(t, columnwise: bool):
        shape = tuple(getattr(t, "shape", ()))
        if not shape:
            return 1
        return shape[-1] if columnwise else math.prod(shape[:-1])
    dtype = out_dtype if isinstance(out_dtype, torch.dtype) else err.dtype
    return err.new_zeros((rows(a, a_columnwise), rows(b, b_columnwise)), dtype=dtype)


@surface_errors(_gemm_fallback)
def gemm(a: torch.Tensor | QuantizedTensor, b: torch.Tensor | QuantizedTensor, bias: torch.Tensor | None = None, *,
         a_columnwise: bool = False, b_columnwise: bool = False, out_dtype: torch.dtype = torch.float32
         ) -> torch.Tensor:
    """out = op(a) · op(b)ᵀ (+ bias), op(x) = x (rowwise copy) or xᵀ (columnwise copy).

    Shapes: op(a) (M, K), op(b) (N, K) with leading dimensions flattened; bias (N,); out (M, N).
        Linear: fprop gemm(x, w), dgrad gemm(dy, w, b_columnwise=True), wgrad
        gemm(dy, x, a_columnwise=True, b_columnwise=True).
    Dtypes: both operands high precision (fp32/bf16/fp16) or both QuantizedTensors of one
        format family (per-tensor FP8, MXFP8, FP8 block, NVFP4); out fp32 / bf16 / fp16.
    Numerics: NUMERICS.md §8 (fp32 accumulation, per-K-block scaling for block formats, one
        final rounding); the same kernel as ``twinengine.jax.gemm``, so identical bytes.
    Raises:
        TypeError / ValueError: from the shared core checks (core/ops/gemm.py).
    """
    out_name = dtype_name(out_dtype)
    descs = (_describe(a), _describe(b), meta(bias))
    GEMM.validate(*descs, a_columnwise=a_columnwise, b_columnwise=b_columnwise, out_dtype=out_name)
    if isinstance(a, QuantizedTensor):
        a_data, a_scale, a_amax = copy_arrays(a, a_columnwise)
        b_data, b_scale, b_amax = copy_arrays(b, b_columnwise)
        for name, t in (("a", a_data), ("b", b_data), ("bias", bias)):
            check_tensor_device("gemm", name, t)
        return torch.ops.twinengine.gemm_quantized(a_data, a_scale, _nvfp4_only(a, a_amax), a.quantizer, b_data,
                                                   b_scale, _nvfp4_only(b, b_amax), b.quantizer, bias, a_columnwise,
                                                   b_columnwise, out_name)
    for name, t in (("a", a), ("b", b), ("bias", bias)):
        check_tensor_device("gemm", name, t)
    return torch.ops.twinengine.gemm(a, b, bias, a_columnwise, b_columnwise, out_name)

"""twinengine.jax.grouped_dense: G expert dense layers over consecutive row blocks of one input,
one grouped kernel call per GEMM phase, ``group_sizes`` a traced array the kernels read (a new
split does not recompile). The same kernels in the same order as
twinengine.pytorch.GroupedLinear, so outputs and gradients are bit-identical to PyTorch's
(kernels (G, K, N) here are the transposes of torch's weights (N, K))."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...ops.gemm import (
    GROUPED_GEMM,
    GROUPED_GEMM_WGRAD,
    check_grouped_weights,
    check_m_splits,
    grouped_quantizers,
)
from ...ops.opdef import fail
from ...ops.permute import check_split_values
from ...ops.quantize import ArrayMeta
from .._library import dtype_name, ffi, meta
from ..autocast import current_recipe


def _grouped_gemm(a, b, m_splits, bias, b_columnwise: bool, out_dtype):
    call = GROUPED_GEMM.plan(meta(a), meta(b), meta(m_splits), meta(bias), b_columnwise=b_columnwise,
                             out_dtype=dtype_name(out_dtype))
    arrays = {"a": a, "b": b, "m_splits": m_splits, "bias": bias}
    return ffi(call, [arrays[name] for name in call.inputs])[0]


def _grouped_wgrad(a, b, m_splits, a_row_sum: bool, out_dtype):
    call = GROUPED_GEMM_WGRAD.plan(meta(a), meta(b), meta(m_splits), a_row_sum=a_row_sum,
                                   out_dtype=dtype_name(out_dtype))
    return ffi(call, [a, b, m_splits])[0]


@jax.custom_vjp
def _grouped(x, w, m_splits, bias):
    return _grouped_fwd(x, w, m_splits, bias)[0]


def _grouped_fwd(x, w, m_splits, bias):
    y = _grouped_gemm(x, w, m_splits, bias, False, x.dtype)
    return y, (x, w, m_splits, None if bias is None else jnp.zeros((0,), bias.dtype))


def _grouped_bwd(res, dy):
    x, w, m_splits, bias_tag = res
    dx = _grouped_gemm(dy, w, m_splits, None, True, x.dtype)
    dw = _grouped_wgrad(dy, x, m_splits, False, w.dtype)
    db = None
    if bias_tag is not None:
        ones = jnp.ones((1, dy.shape[0]), dy.dtype)
        db = _grouped_wgrad(ones, dy, m_splits, True, bias_tag.dtype).reshape(w.shape[0], w.shape[1])
    return dx, dw, np.zeros(m_splits.shape, jax.dtypes.float0), db


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


def grouped_dense(x, kernels, group_sizes, bias=None):
    """y[rows_g] = x[rows_g] · kernels[g] (+ bias[g]) for the G consecutive row blocks of
    ``group_sizes``; jit-, grad-clean, one grouped kernel call per GEMM phase.

    Shapes: x (..., K) (leading dimensions flattened to M rows); kernels (G, K, N); bias (G, N);
        group_sizes (G,) int array (traced under jit: a new split reuses the compiled program);
        y (..., N).
    Dtypes: fp32 / bf16 / fp16; y has x's dtype, gradients their input's dtype.
    Numerics: exactly ``twinengine.pytorch.grouped_linear`` with weights = kernelsᵀ (each group
        the bytes of ``twinengine.jax.dense`` on its rows). High precision only.
    Raises:
        TypeError / ValueError: the shared core checks (as grouped_linear); for concrete CPU
            group_sizes also Σ > rows or a negative size; TypeError inside an autocast region
            with a recipe.
    """
    if grouped_quantizers(current_recipe()) is not None:
        fail("grouped_linear", TypeError, "twinengine.jax.grouped_dense runs in high precision only so far (the "
             "Float8CurrentScaling grouped path exists in twinengine.pytorch.GroupedLinear)")
    kernels = jnp.asarray(kernels)
    group_sizes = jnp.asarray(group_sizes)
    num_gemms = group_sizes.shape[0] if group_sizes.ndim == 1 else -1
    check_m_splits(ArrayMeta(tuple(group_sizes.shape), "int32"), num_gemms)
    # One (N, K) weight per kernel (G, K, N), one (N,) bias per row of bias (G, N).
    weights = [ArrayMeta((kernels.shape[-1], kernels.shape[-2]), dtype_name(kernels.dtype))] * kernels.shape[0]
    biases = None if bias is None else [ArrayMeta(tuple(bias.shape[1:]), dtype_name(bias.dtype))] * bias.shape[0]
    check_grouped_weights(num_gemms, weights, biases)
    x2 = jnp.asarray(x).reshape(-1, x.shape[-1])
    splits = group_sizes.astype(jnp.int32)
    if not isinstance(splits, jax.core.Tracer) and all(d.platform == "cpu" for d in splits.devices()):
        check_split_values("grouped_linear", np.asarray(splits).tolist(), x2.shape[0])
    w = jnp.transpose(kernels, (0, 2, 1))
    y = _grouped(x2, w, splits, None if bias is None else jnp.asarray(bias))
    return y.reshape(*x.shape[:-1], w.shape[1])

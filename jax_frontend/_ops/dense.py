"""twinengine.jax.dense: y = x · kernel + bias as a custom_vjp over the twinengine GEMM and
quantize kernels — the same kernels, in the same order, as twinengine.pytorch.Linear, so the
output and every gradient are bit-identical to PyTorch's for the same inputs (kernel (K, N)
here is the transpose of torch's weight (N, K))."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ...linear import LinearQuantizers, check_delayed_state, check_linear_shapes, check_rng, linear_quantizers
from ...ops.gemm import gemm_operand
from ...recipe import Recipe
from ..autocast import current_recipe
from .._library import dtype_name, varying_together
from ..sharding import amax_axes, amax_reduction
from .bias import bias_add, bias_grad
from .gemm import gemm
from .quantize import quantize, record_amax, update_delayed_scaling

STATE_FIELDS = ("fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale")


def delayed_scaling_state(amax_history_len: int = 1024) -> dict:
    """Initial DelayedScaling state of one dense layer (NUMERICS.md §3): histories zero, scales one.

    Shapes: fwd_amax_history (L, 2) (input, weight), fwd_scale (2,), bwd_amax_history (L, 1)
        (grad_output), bwd_scale (1,); all float32.
    """
    return {"fwd_amax_history": jnp.zeros((amax_history_len, 2), jnp.float32),
            "fwd_scale": jnp.ones((2,), jnp.float32),
            "bwd_amax_history": jnp.zeros((amax_history_len, 1), jnp.float32),
            "bwd_scale": jnp.ones((1,), jnp.float32)}


def _add_bias(y, bias):
    """fl(y + b) in y's dtype after the GEMM's own rounding: the bytes of ops.BasicLinear + ops.Bias."""
    return y if bias is None else bias_add(y, bias)


def _bias_grad(dy2, dtype):
    """Σc over the rows of dy (NUMERICS.md §11), as ops.Bias."""
    return bias_grad(dy2, dtype)


# ---- high precision ---------------------------------------------------------------------

@jax.custom_vjp
def _dense(x, kernel, bias):
    return _dense_fwd(x, kernel, bias)[0]


def _dense_fwd(x, kernel, bias):
    w = kernel.T
    y = _add_bias(gemm(x.reshape(-1, x.shape[-1]), w, out_dtype=x.dtype), bias).reshape(*x.shape[:-1], w.shape[0])
    return y, (x, w, None if bias is None else jnp.zeros((0,), bias.dtype))


def _dense_bwd(res, dy):
    x, w, bias_tag = res
    dy2 = dy.reshape(-1, dy.shape[-1])
    dx = gemm(dy2, w, b_columnwise=True, out_dtype=x.dtype).reshape(x.shape)
    dw = gemm(dy2, x.reshape(-1, x.shape[-1]), a_columnwise=True, b_columnwise=True, out_dtype=w.dtype)
    return dx, dw.T, None if bias_tag is None else _bias_grad(dy2, bias_tag.dtype)


_dense.defvjp(_dense_fwd, _dense_bwd)


# ---- quantized --------------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _dense_quantized(x, kernel, bias, state, rng, qs: LinearQuantizers, axes: tuple[str, ...]):
    return _dense_quantized_fwd(x, kernel, bias, state, rng, qs, axes)[0]


def _dense_quantized_fwd(x, kernel, bias, state, rng, qs: LinearQuantizers, axes: tuple[str, ...]):
    w = kernel.T
    x2 = x.reshape(-1, x.shape[-1])
    fwd_scale = state["fwd_scale"] if qs.delayed else None
    qx = quantize(x2, qs.input, scale=None if fwd_scale is None else fwd_scale[0:1])
    qw = quantize(w, qs.weight, scale=None if fwd_scale is None else fwd_scale[1:2])
    y = _add_bias(gemm(qx, qw, out_dtype=x.dtype), bias).reshape(*x.shape[:-1], w.shape[0])
    new_state = state
    if qs.delayed:
        history = record_amax(state["fwd_amax_history"], jnp.concatenate([qx.amax, qw.amax]))
        new_history, new_scale = update_delayed_scaling(history, fwd_scale, qs.fwd_fp8_dtype, margin=qs.margin,
                                                        amax_compute_algo=qs.amax_compute_algo)
        new_state = {**state, "fwd_amax_history": new_history, "fwd_scale": new_scale}
    residuals = (qx.columnwise_data, qx.columnwise_scale_inv, qx.columnwise_amax, qw.columnwise_data,
                 qw.columnwise_scale_inv, qw.columnwise_amax, jnp.zeros((0,), x.dtype), jnp.zeros((0,), kernel.dtype),
                 None if bias is None else jnp.zeros((0,), bias.dtype), new_state, rng)
    return (y, new_state), residuals


def _dense_quantized_bwd(qs: LinearQuantizers, axes: tuple[str, ...], res, cotangents):
    # the backward is traced after the forward's amax_reduction region has closed: re-enter it
    with amax_reduction(axes):
        return _dense_quantized_bwd_in_region(qs, res, cotangents)


def _dense_quantized_bwd_in_region(qs: LinearQuantizers, res, cotangents):
    (x_col, x_col_scale, x_col_amax, w_col, w_col_scale, w_col_amax, x_tag, w_tag, bias_tag, state, rng) = res
    dy = cotangents[0]
    dy2 = dy.reshape(-1, dy.shape[-1])
    bwd_scale = state["bwd_scale"] if qs.delayed else None
    qdy = quantize(dy2, qs.grad_output, scale=bwd_scale, rng=rng)
    state_out = None
    if qs.delayed:
        history = record_amax(state["bwd_amax_history"], qdy.amax)
        new_history, new_scale = update_delayed_scaling(history, bwd_scale, qs.bwd_fp8_dtype, margin=qs.margin,
                                                        amax_compute_algo=qs.amax_compute_algo)
        # The state's "gradient" is the next state: forward slots from the forward, grad slot from here.
        state_out = {**state, "bwd_amax_history": new_history, "bwd_scale": new_scale}
    qw = gemm_operand(w_col, w_col_scale, qs.weight, True, w_col_amax)
    qx = gemm_operand(x_col, x_col_scale, qs.input, True, x_col_amax)
    dx = gemm(qdy, qw, b_columnwise=True, out_dtype=x_tag.dtype).reshape(*dy.shape[:-1], qw.shape[1])
    dw = gemm(qdy, qx, a_columnwise=True, b_columnwise=True, out_dtype=w_tag.dtype)
    db = None if bias_tag is None else _bias_grad(dy2, bias_tag.dtype)
    rng_ct = None if rng is None else np.zeros(rng.shape, dtype=jax.dtypes.float0)
    return dx, dw.T, db, state_out, rng_ct


_dense_quantized.defvjp(_dense_quantized_fwd, _dense_quantized_bwd)


def dense(x, kernel, bias=None, *, recipe: Recipe | None = None, state: dict | None = None, rng=None):
    """y = x · kernel (+ bias), quantized as `recipe` (default: the innermost
    ``twinengine.jax.autocast`` region) says; jit-, grad- and vmap-clean.

    Shapes: x (..., K); kernel (K, N) (Flax layout); bias (N,); y (..., N).
    Dtypes: fp32 / bf16 / fp16; y has x's dtype, each gradient its input's dtype.
    Numerics: the PyTorch Linear's kernels and order (NUMERICS.md §8, §9): bit-identical y,
        dx, dkernel, dbias to ``twinengine.pytorch.Linear`` with weight = kernelᵀ.
    DelayedScaling (functional, NUMERICS.md §3): pass ``state`` (``delayed_scaling_state``);
        returns ``(y, state_after_forward)`` (forward slots updated), and the gradient of the
        loss with respect to ``state`` *is* the next state (forward slots from the forward,
        the grad slot updated in the backward pass) — use it instead of applying it.
    rng: integer [seed, offset] (2,), required when the recipe's grad_output rounds
        stochastically (NVFP4); the same values as the torch Linear's rng_state give the same bytes.
    Raises:
        TypeError / ValueError: unsupported recipe or combination, missing / mismatched state.
    """
    x, kernel = jnp.asarray(x), jnp.asarray(kernel)
    check_linear_shapes(x.shape, kernel.shape[::-1], None if bias is None else jnp.shape(bias))
    if recipe is None:
        recipe = current_recipe()
    x, kernel, bias = varying_together(x, kernel, bias)
    if recipe is None:
        return _dense(x, kernel, bias)
    qs = linear_quantizers(recipe, dtype_name(x.dtype))
    check_rng(qs, rng is not None)
    rng = jnp.asarray(rng) if qs.needs_rng else None
    if qs.delayed:
        check_delayed_state(None if state is None else state["fwd_amax_history"].shape[0], qs)
        return _dense_quantized(x, kernel, bias, state, rng, qs, amax_axes())
    y, _ = _dense_quantized(x, kernel, bias, None, rng, qs, amax_axes())
    return y

"""twinengine.jax.grouped_dense: G expert dense layers over consecutive row blocks of one input,
one grouped kernel call per GEMM phase, ``group_sizes`` a traced array the kernels read (a new
split does not recompile). The same kernels in the same order as
twinengine.pytorch.GroupedLinear, so outputs and gradients are bit-identical to PyTorch's
(kernels (G, K, N) here are the transposes of torch's weights (N, K))."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .bias import bias_grad_grouped
from ...ops.gemm import (
    GROUPED_GEMM,
    GROUPED_GEMM_FP8,
    GROUPED_GEMM_WGRAD,
    GROUPED_GEMM_WGRAD_FP8,
    block_2d,
    check_grouped_delayed_state,
    check_grouped_rng,
    check_grouped_weights,
    check_m_split_values,
    check_m_splits,
    grouped_quantizers,
)
from ...ops.quantize import GROUPED_QUANTIZE, ArrayMeta
from .._library import dtype_name, ffi, meta
from ..autocast import current_recipe
from .dense import STATE_FIELDS
from .quantize import record_amax, update_delayed_scaling


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
        db = bias_grad_grouped(dy, m_splits, bias_tag.dtype)
    return dx, dw, np.zeros(m_splits.shape, jax.dtypes.float0), db


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


# ---- per-tensor FP8 (Float8CurrentScaling): each expert's blocks quantized on their own ----------

def _grouped_quantize(x, m_splits, quantizer, scale=None, rng=None):
    """([rowwise data, its scales, columnwise data, its scales], per-group amax (per-tensor FP8)
    or NVFP4 rowwise amax, NVFP4 columnwise amax) of each row block quantized on its own."""
    call = GROUPED_QUANTIZE.plan(meta(x), meta(m_splits), meta(scale), meta(rng), quantizer=quantizer)
    arrays = {"x": x, "m_splits": m_splits, "scale": scale, "rng": rng}
    outs = list(ffi(call, [arrays[name] for name in call.inputs]))
    amaxes = outs[4:] + [None, None]
    return outs[:4], amaxes[0], amaxes[1] if quantizer.scaling_mode == "nvfp4" else None


def grouped_delayed_scaling_state(num_gemms: int, amax_history_len: int = 1024) -> dict:
    """Initial DelayedScaling state of a grouped dense layer of G = num_gemms experts
    (NUMERICS.md §3): histories zero, scales one.

    Shapes: fwd_amax_history (L, 2G) (the G inputs' slots, then the G kernels'), fwd_scale
        (2G,), bwd_amax_history (L, G), bwd_scale (G,); all float32. Expert g's slots (columns
        g and G+g forward, g backward) evolve exactly as ``delayed_scaling_state`` of a
        ``twinengine.jax.dense`` on its rows.
    """
    return {"fwd_amax_history": jnp.zeros((amax_history_len, 2 * num_gemms), jnp.float32),
            "fwd_scale": jnp.ones((2 * num_gemms,), jnp.float32),
            "bwd_amax_history": jnp.zeros((amax_history_len, num_gemms), jnp.float32),
            "bwd_scale": jnp.ones((num_gemms,), jnp.float32)}


def _gemm_fp8(a, a_s, b, b_s, m_splits, bias, mode, b_k_major, out_dtype, a_block_2d=False, b_block_2d=False,
              a_amax=None, b_amax=None):
    call = GROUPED_GEMM_FP8.plan(meta(a), meta(a_s), meta(b), meta(b_s), meta(m_splits), meta(bias), meta(a_amax),
                                 meta(b_amax), scaling_mode=mode, b_k_major=b_k_major, out_dtype=dtype_name(out_dtype),
                                 a_block_2d=a_block_2d, b_block_2d=b_block_2d)
    arrays = {"a": a, "a_scale_inv": a_s, "b": b, "b_scale_inv": b_s, "m_splits": m_splits, "bias": bias,
              "a_amax": a_amax, "b_amax": b_amax}
    return ffi(call, [arrays[name] for name in call.inputs])[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _grouped_fp8(x, w, m_splits, bias, state, rng, qs):
    return _grouped_fp8_fwd(x, w, m_splits, bias, state, rng, qs)[0]


def _grouped_fp8_fwd(x, w, m_splits, bias, state, rng, qs):
    groups, n, k = w.shape
    mode = qs.input.scaling_mode
    nvfp4 = mode == "nvfp4"
    fwd_scale = state["fwd_scale"] if qs.delayed else None
    (x_row, x_row_s, x_col, x_col_s), x_amax, x_col_amax = _grouped_quantize(
        x, m_splits, qs.input, None if fwd_scale is None else fwd_scale[:groups])
    (w_row, w_row_s, w_col, w_col_s), w_amax, w_col_amax = _grouped_quantize(
        w.reshape(groups * n, k), jnp.full((groups,), n, jnp.int32), qs.weight,
        None if fwd_scale is None else fwd_scale[groups:])
    y = _gemm_fp8(x_row, x_row_s, w_row.reshape(groups, n, k // 2 if nvfp4 else k), w_row_s, m_splits, bias, mode,
                  True, x.dtype, block_2d(qs.input), block_2d(qs.weight), x_amax if nvfp4 else None,
                  w_amax if nvfp4 else None)
    new_state = state
    if qs.delayed:
        history = record_amax(state["fwd_amax_history"], jnp.concatenate([x_amax, w_amax]))
        new_history, new_scale = update_delayed_scaling(history, fwd_scale, qs.fwd_fp8_dtype, margin=qs.margin,
                                                        amax_compute_algo=qs.amax_compute_algo)
        new_state = {**state, "fwd_amax_history": new_history, "fwd_scale": new_scale}
    tags = (jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype), None if bias is None else jnp.zeros((0,), bias.dtype))
    col_amaxes = (x_col_amax, w_col_amax) if nvfp4 else (None, None)
    return (y, new_state), (x_col, x_col_s, w_col, w_col_s, col_amaxes, m_splits, tags, new_state, rng)


def _grouped_fp8_bwd(qs, res, cotangents):
    x_col, x_col_s, w_col, w_col_s, (x_col_amax, w_col_amax), m_splits, (x_tag, w_tag, b_tag), state, rng = res
    dy = cotangents[0]
    groups = m_splits.shape[0]
    rows, n = dy.shape
    mode = qs.grad_output.scaling_mode
    nvfp4 = mode == "nvfp4"
    k = w_col.size * (2 if nvfp4 else 1) // (groups * n)
    bwd_scale = state["bwd_scale"] if qs.delayed else None
    (d_row, d_row_s, d_col, d_col_s), d_amax, d_col_amax = _grouped_quantize(dy, m_splits, qs.grad_output, bwd_scale,
                                                                             rng)
    state_out = None
    if qs.delayed:
        history = record_amax(state["bwd_amax_history"], d_amax)
        new_history, new_scale = update_delayed_scaling(history, bwd_scale, qs.bwd_fp8_dtype, margin=qs.margin,
                                                        amax_compute_algo=qs.amax_compute_algo)
        # The state's "gradient" is the next state: forward slots from the forward, grad slots from here.
        state_out = {**state, "bwd_amax_history": new_history, "bwd_scale": new_scale}
    if mode == "mxfp8":  # columnwise copies keep the (rows, cols) layout
        w_b, d_a, x_b = w_col.reshape(groups, n, k), d_col, x_col
    elif nvfp4:  # transposed packed copies, block after block
        w_b, d_a, x_b = w_col.reshape(groups, k, n // 2), d_col.reshape(n, rows // 2), x_col.reshape(k, rows // 2)
    else:  # per-tensor FP8: transposed copies, block after block
        w_b, d_a, x_b = w_col.reshape(groups, k, n), d_col.reshape(n, rows), x_col.reshape(k, rows)
    g_2d = block_2d(qs.grad_output)
    dx = _gemm_fp8(d_row, d_row_s, w_b, w_col_s, m_splits, None, mode, mode != "mxfp8", x_tag.dtype, g_2d,
                   block_2d(qs.weight), d_amax if nvfp4 else None, w_col_amax)
    a_amax, b_amax = (d_col_amax, x_col_amax) if nvfp4 else (None, None)
    call = GROUPED_GEMM_WGRAD_FP8.plan(meta(d_a), meta(d_col_s), meta(x_b), meta(x_col_s), meta(m_splits),
                                       meta(a_amax), meta(b_amax), scaling_mode=mode,
                                       out_dtype=dtype_name(w_tag.dtype), a_block_2d=g_2d,
                                       b_block_2d=block_2d(qs.input))
    arrays = {"a": d_a, "a_scale_inv": d_col_s, "b": x_b, "b_scale_inv": x_col_s, "m_splits": m_splits,
              "a_amax": a_amax, "b_amax": b_amax}
    dw = ffi(call, [arrays[name] for name in call.inputs])[0]
    db = None
    if b_tag is not None:
        db = bias_grad_grouped(dy, m_splits, b_tag.dtype)
    d_rng = None if rng is None else np.zeros(rng.shape, jax.dtypes.float0)
    return dx, dw, np.zeros(m_splits.shape, jax.dtypes.float0), db, state_out, d_rng


_grouped_fp8.defvjp(_grouped_fp8_fwd, _grouped_fp8_bwd)


def grouped_dense(x, kernels, group_sizes, bias=None, *, state: dict | None = None, rng=None):
    """y[rows_g] = x[rows_g] · kernels[g] (+ bias[g]) for the G consecutive row blocks of
    ``group_sizes``; jit-, grad-clean, one grouped kernel call per GEMM phase.

    Shapes: x (..., K) (leading dimensions flattened to M rows); kernels (G, K, N); bias (G, N);
        group_sizes (G,) int array (traced under jit: a new split reuses the compiled program);
        y (..., N).
    Dtypes: fp32 / bf16 / fp16; y has x's dtype, gradients their input's dtype.
    Numerics: exactly ``twinengine.pytorch.grouped_linear`` with weights = kernelsᵀ (each group
        the bytes of ``twinengine.jax.dense`` on its rows), in high precision and inside
        ``autocast(DelayedScaling | Float8CurrentScaling | MXFP8BlockScaling |
        Float8BlockScaling | NVFP4BlockScaling)`` (per-expert quantization, CPU only; every
        group size a multiple of 32 for MXFP8, of 128 for FP8 block, of 16 for NVFP4).
    rng (recipes whose gradient rounds stochastically: NVFP4BlockScaling): int (2,) [seed,
        offset]; expert g rounds its gradient with [seed, offset + g] (the torch module's
        ``rng_state`` before its call).
    DelayedScaling (functional, as ``dense``): pass ``state``
        (``grouped_delayed_scaling_state(G, L)``); returns ``(y, state_after_forward)``, and the
        gradient of the loss with respect to ``state`` *is* the next state (forward slots from
        the forward, grad slots from the backward) — use it instead of applying it.
    Raises:
        TypeError / ValueError: the shared core checks (as grouped_linear); for concrete CPU
            group_sizes also Σ != rows or a negative size (traced: the CPU kernel fails the call
            with that text); TypeError inside an autocast region
            with a recipe whose grouped path is not built; delayed state missing or misshapen;
            ValueError: stochastic rounding without rng.
    """
    qs = grouped_quantizers(current_recipe(), dtype_name(jnp.asarray(x).dtype))
    if qs is not None:
        check_grouped_rng(qs, rng is not None)
    rng = None if qs is None or not qs.needs_rng else jnp.asarray(rng)
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
        check_m_split_values(np.asarray(splits).tolist(), x2.shape[0])
    w = jnp.transpose(kernels, (0, 2, 1))
    bias = None if bias is None else jnp.asarray(bias)
    if qs is None:
        return _grouped(x2, w, splits, bias).reshape(*x.shape[:-1], w.shape[1])
    if qs.delayed:
        check_grouped_delayed_state(num_gemms, None if state is None else state["fwd_amax_history"].shape[0], qs,
                                    None if state is None else [jnp.shape(state[f]) for f in STATE_FIELDS])
        y, new_state = _grouped_fp8(x2, w, splits, bias, state, rng, qs)
        return y.reshape(*x.shape[:-1], w.shape[1]), new_state
    y, _ = _grouped_fp8(x2, w, splits, bias, None, rng, qs)
    return y.reshape(*x.shape[:-1], w.shape[1])

"""torch.ops.twinengine.grouped_gemm / grouped_gemm_wgrad / grouped_linear: the G expert GEMMs
of a GroupedLinear in one kernel call per GEMM phase, with ``m_splits`` a tensor the kernel
reads (no host sync, no graph break, no recompile when the split changes). Shapes, checks and
errors come from core/ops/gemm.py."""

from __future__ import annotations

from typing import Sequence

import torch

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
from ...ops.quantize import GROUPED_QUANTIZE
from ...quantizers import Quantizer
from .._library import check_tensor_device, dtype_name, empty_outputs, launch, meta
from ..autocast import current_recipe
from .quantize import record_amax, update_delayed_scaling

Tensor = torch.Tensor
_OP = "grouped_linear"


@torch.library.custom_op("twinengine::grouped_gemm", mutates_args=())
def _grouped_gemm(a: Tensor, b: Tensor, m_splits: Tensor, bias: Tensor | None, b_columnwise: bool,
                  out_dtype: str) -> Tensor:
    call = GROUPED_GEMM.plan(meta(a), meta(b), meta(m_splits), meta(bias), b_columnwise=b_columnwise,
                             out_dtype=out_dtype)
    arrays = {"a": a, "b": b, "m_splits": m_splits, "bias": bias}
    return launch(call, [arrays[name] for name in call.inputs], a.device)[0]


@_grouped_gemm.register_fake
def _(a, b, m_splits, bias, b_columnwise, out_dtype):
    call = GROUPED_GEMM.plan(meta(a), meta(b), meta(m_splits), meta(bias), b_columnwise=b_columnwise,
                             out_dtype=out_dtype)
    return empty_outputs(call, a.device)[0]


@torch.library.custom_op("twinengine::grouped_gemm_wgrad", mutates_args=())
def _grouped_gemm_wgrad(a: Tensor, b: Tensor, m_splits: Tensor, a_row_sum: bool, out_dtype: str) -> Tensor:
    call = GROUPED_GEMM_WGRAD.plan(meta(a), meta(b), meta(m_splits), a_row_sum=a_row_sum, out_dtype=out_dtype)
    return launch(call, [a, b, m_splits], a.device)[0]


@_grouped_gemm_wgrad.register_fake
def _(a, b, m_splits, a_row_sum, out_dtype):
    call = GROUPED_GEMM_WGRAD.plan(meta(a), meta(b), meta(m_splits), a_row_sum=a_row_sum, out_dtype=out_dtype)
    return empty_outputs(call, a.device)[0]


def grouped_fprop(x: Tensor, weight: Tensor, m_splits: Tensor, bias: Tensor | None) -> Tensor:
    """out[rows_g] = x[rows_g] · weight[g]ᵀ (+ bias[g]): x (M, K), weight (G, N, K), bias (G, N)."""
    return torch.ops.twinengine.grouped_gemm(x, weight, m_splits, bias, False, dtype_name(x.dtype))


def grouped_backward(dy: Tensor, x: Tensor, weight: Tensor, m_splits: Tensor, bias_dtype: torch.dtype | None
                     ) -> tuple[Tensor, Tensor, Tensor | None]:
    """(dx (M, K), dweight (G, N, K), dbias (G, N) or None), each group exactly tep.Linear's
    backward on its rows (dgrad, wgrad, bias gradient Σc over the group's rows)."""
    dx = torch.ops.twinengine.grouped_gemm(dy, weight, m_splits, None, True, dtype_name(x.dtype))
    dw = torch.ops.twinengine.grouped_gemm_wgrad(dy, x, m_splits, False, dtype_name(weight.dtype))
    db = None
    if bias_dtype is not None:
        db = bias_grad_grouped(dy, m_splits, bias_dtype)
    return dx, dw, db


def _grouped_linear_body(x: Tensor, weight: Tensor, m_splits: Tensor, bias: Tensor | None) -> Tensor:
    return grouped_fprop(x, weight, m_splits, bias)


_grouped_linear = torch.library.custom_op("twinengine::grouped_linear", mutates_args=())(_grouped_linear_body)
_grouped_linear.register_fake(_grouped_linear_body)


def _setup(ctx, inputs, output):
    x, weight, m_splits, bias = inputs
    ctx.save_for_backward(x, weight, m_splits)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, dy):
    x, weight, m_splits = ctx.saved_tensors
    dx, dw, db = grouped_backward(dy, x, weight, m_splits, ctx.bias_dtype)
    return dx, dw, None, db


_grouped_linear.register_autograd(_backward, setup_context=_setup)


# ---- per-tensor FP8 (Float8CurrentScaling): each expert's blocks quantized on their own -----------

@torch.library.custom_op("twinengine::grouped_quantize", mutates_args=())
def _grouped_quantize(x: Tensor, m_splits: Tensor, scale: Tensor | None, quantizer: Quantizer,
                      rng: Tensor | None = None) -> list[Tensor]:
    call = GROUPED_QUANTIZE.plan(meta(x), meta(m_splits), meta(scale), meta(rng), quantizer=quantizer)
    arrays = {"x": x, "m_splits": m_splits, "scale": scale, "rng": rng}
    return launch(call, [arrays[name] for name in call.inputs], x.device)


@_grouped_quantize.register_fake
def _(x, m_splits, scale, quantizer, rng=None):
    call = GROUPED_QUANTIZE.plan(meta(x), meta(m_splits), meta(scale), meta(rng), quantizer=quantizer)
    return empty_outputs(call, x.device)


@torch.library.custom_op("twinengine::grouped_gemm_fp8", mutates_args=())
def _grouped_gemm_fp8(a: Tensor, a_scale_inv: Tensor, b: Tensor, b_scale_inv: Tensor, m_splits: Tensor,
                      bias: Tensor | None, scaling_mode: str, b_k_major: bool, out_dtype: str, a_block_2d: bool = False,
                      b_block_2d: bool = False, a_amax: Tensor | None = None, b_amax: Tensor | None = None) -> Tensor:
    args = (meta(a), meta(a_scale_inv), meta(b), meta(b_scale_inv), meta(m_splits), meta(bias), meta(a_amax),
            meta(b_amax))
    call = GROUPED_GEMM_FP8.plan(*args, scaling_mode=scaling_mode, b_k_major=b_k_major, out_dtype=out_dtype,
                                 a_block_2d=a_block_2d, b_block_2d=b_block_2d)
    arrays = {"a": a, "a_scale_inv": a_scale_inv, "b": b, "b_scale_inv": b_scale_inv, "m_splits": m_splits,
              "bias": bias, "a_amax": a_amax, "b_amax": b_amax}
    return launch(call, [arrays[name] for name in call.inputs], a.device)[0]


@_grouped_gemm_fp8.register_fake
def _(a, a_scale_inv, b, b_scale_inv, m_splits, bias, scaling_mode, b_k_major, out_dtype, a_block_2d=False,
      b_block_2d=False, a_amax=None, b_amax=None):
    args = (meta(a), meta(a_scale_inv), meta(b), meta(b_scale_inv), meta(m_splits), meta(bias), meta(a_amax),
            meta(b_amax))
    call = GROUPED_GEMM_FP8.plan(*args, scaling_mode=scaling_mode, b_k_major=b_k_major, out_dtype=out_dtype,
                                 a_block_2d=a_block_2d, b_block_2d=b_block_2d)
    return empty_outputs(call, a.device)[0]


@torch.library.custom_op("twinengine::grouped_gemm_wgrad_fp8", mutates_args=())
def _grouped_gemm_wgrad_fp8(a: Tensor, a_scale_inv: Tensor, b: Tensor, b_scale_inv: Tensor, m_splits: Tensor,
                            scaling_mode: str, out_dtype: str, a_block_2d: bool = False,
                            b_block_2d: bool = False, a_amax: Tensor | None = None,
                            b_amax: Tensor | None = None) -> Tensor:
    call = GROUPED_GEMM_WGRAD_FP8.plan(meta(a), meta(a_scale_inv), meta(b), meta(b_scale_inv), meta(m_splits),
                                       meta(a_amax), meta(b_amax), scaling_mode=scaling_mode, out_dtype=out_dtype,
                                       a_block_2d=a_block_2d, b_block_2d=b_block_2d)
    arrays = {"a": a, "a_scale_inv": a_scale_inv, "b": b, "b_scale_inv": b_scale_inv, "m_splits": m_splits,
              "a_amax": a_amax, "b_amax": b_amax}
    return launch(call, [arrays[name] for name in call.inputs], a.device)[0]


@_grouped_gemm_wgrad_fp8.register_fake
def _(a, a_scale_inv, b, b_scale_inv, m_splits, scaling_mode, out_dtype, a_block_2d=False, b_block_2d=False,
      a_amax=None, b_amax=None):
    call = GROUPED_GEMM_WGRAD_FP8.plan(meta(a), meta(a_scale_inv), meta(b), meta(b_scale_inv), meta(m_splits),
                                       meta(a_amax), meta(b_amax), scaling_mode=scaling_mode, out_dtype=out_dtype,
                                       a_block_2d=a_block_2d, b_block_2d=b_block_2d)
    return empty_outputs(call, a.device)[0]


def _quantized_parts(outputs: Sequence[Tensor], mode: str) -> tuple[list[Tensor], Tensor | None, Tensor | None]:
    """([rowwise data, its scales, columnwise data, its scales], per-group amax (per-tensor FP8)
    or NVFP4 rowwise amax, NVFP4 columnwise amax) of a grouped_quantize's outputs."""
    copies, amaxes = list(outputs[:4]), list(outputs[4:]) + [None, None]
    return copies, amaxes[0], amaxes[1] if mode == "nvfp4" else None


def _grouped_linear_fp8_body(x: Tensor, weight: Tensor, m_splits: Tensor, bias: Tensor | None, q_input: Quantizer,
                             q_weight: Quantizer, q_grad: Quantizer, fwd_scale: Tensor | None,
                             bwd_scale: Tensor | None, bwd_history: Tensor | None, margin: int,
                             amax_compute_algo: str, w_rowwise_data: Tensor | None = None,
                             w_rowwise_scale_inv: Tensor | None = None, w_columnwise_data: Tensor | None = None,
                             w_columnwise_scale_inv: Tensor | None = None, rng: Tensor | None = None) -> list[Tensor]:
    """[y, x columnwise data, its scales, weight columnwise data, its scales, x columnwise amax
    (G,), weight columnwise amax (G,), amax (2G,)] (the copies the backward needs are outputs,
    so the context saves them; the columnwise amaxes are NVFP4's global amaxes, else zeros).
    DelayedScaling (fwd_scale (2G,) given: inputs' scales, then weights'): amax holds the G
    input amaxes, then the G weight amaxes; otherwise zeros. Given weight copies (the four
    outputs of the weight's grouped_quantize: FP8 weight caching) are used instead of
    quantizing `weight`; their weight amaxes are then 0 (as tep.Linear's with a cached weight)
    and the returned weight copies empty (the backward reads the given ones). rng: the
    backward's (NVFP4 stochastic rounding of the gradient)."""
    groups, n, k = weight.shape
    delayed = fwd_scale is not None
    cached = w_rowwise_data is not None
    mode = q_input.scaling_mode
    (x_row, x_row_s, x_col, x_col_s), x_amax, x_col_amax = _quantized_parts(torch.ops.twinengine.grouped_quantize(
        x, m_splits, fwd_scale[:groups] if delayed else None, q_input), mode)
    zeros = torch.zeros(groups, dtype=torch.float32, device=x.device)
    if cached:
        w_row, w_row_s, w_col, w_col_s = w_rowwise_data, w_rowwise_scale_inv, w_columnwise_data, w_columnwise_scale_inv
        w_amax = w_col_amax = zeros
    else:
        w_splits = torch.full((groups,), n, dtype=torch.int32, device=x.device)
        (w_row, w_row_s, w_col, w_col_s), w_amax, w_col_amax = _quantized_parts(torch.ops.twinengine.grouped_quantize(
            weight.reshape(groups * n, k), w_splits, fwd_scale[groups:] if delayed else None, q_weight), mode)
    nvfp4 = mode == "nvfp4"
    y = torch.ops.twinengine.grouped_gemm_fp8(x_row, x_row_s, w_row.view(groups, n, k // 2 if nvfp4 else k), w_row_s,
                                              m_splits, bias, mode, True, dtype_name(x.dtype), block_2d(q_input),
                                              block_2d(q_weight), x_amax if nvfp4 else None,
                                              w_amax if nvfp4 else None)
    amax = torch.cat([x_amax, w_amax]) if delayed else torch.cat([zeros, zeros])
    if cached:  # an op must not return its inputs
        w_col, w_col_s = (torch.empty(0, dtype=t.dtype, device=x.device) for t in (w_col, w_col_s))
    col_amaxes = (x_col_amax, w_col_amax) if nvfp4 else (zeros.clone(), zeros.clone())
    return [y, x_col, x_col_s, w_col, w_col_s, *col_amaxes, amax]


_grouped_linear_fp8 = torch.library.custom_op("twinengine::grouped_linear_fp8", mutates_args=())(
    _grouped_linear_fp8_body)
_grouped_linear_fp8.register_fake(_grouped_linear_fp8_body)


def _fp8_setup(ctx, inputs, output):
    (x, weight, m_splits, bias, _, _, q_grad, _, bwd_scale, bwd_history, margin, algo, *extra) = inputs
    cache, rng = (extra + [None] * 5)[:4], (extra + [None] * 5)[4]
    given_w_col, given_w_col_s = cache[2:4]
    # The dispatcher drops trailing arguments equal to their defaults (the weight-cache and rng
    # Nones); the backward returns one gradient per argument it kept.
    ctx.num_inputs = 12 + max([i + 1 for i, t in enumerate(extra) if t is not None], default=0)
    _, x_col, x_col_s, w_col, w_col_s, x_col_amax, w_col_amax, amax = output
    ctx.mark_non_differentiable(x_col, x_col_s, w_col, w_col_s, x_col_amax, w_col_amax, amax)
    if given_w_col is not None:
        w_col, w_col_s = given_w_col, given_w_col_s
    ctx.save_for_backward(x_col, x_col_s, w_col, w_col_s, x_col_amax, w_col_amax, m_splits, bwd_scale, bwd_history,
                          rng)
    ctx.q_grad, ctx.shape = q_grad, tuple(weight.shape)
    ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
    ctx.delayed = (margin, algo)
    ctx.block_2d = (block_2d(inputs[4]), block_2d(inputs[5]))


def fp8_backward(dy: Tensor, saved: tuple, q_grad: Quantizer, shape: tuple, dtypes: tuple,
                 delayed: tuple = (0, "max"), two_d: tuple = (False, False),
                 rng: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(dx, dweight (G, N, K), dbias or None) of the per-expert quantized path from the saved
    (x columnwise data, its scales, weight columnwise data, its scales, x columnwise amax,
    weight columnwise amax, m_splits[, bwd_scale (G,), bwd_amax_history (L, G)]);
    DelayedScaling (bwd_scale given): dy's blocks use the grad slots' scales and the slots'
    history and scale are updated in place (NUMERICS.md §3). NVFP4 stochastic rounding: dy's
    block g rounds with [seed, offset + g] of `rng`."""
    x_col, x_col_s, w_col, w_col_s, x_col_amax, w_col_amax, m_splits, *state = saved
    bwd_scale, bwd_history = state if state else (None, None)
    groups, n, k = shape
    x_dtype, w_dtype, b_dtype = dtypes
    rows = dy.shape[0]
    mode = q_grad.scaling_mode
    nvfp4 = mode == "nvfp4"
    (d_row, d_row_s, d_col, d_col_s), d_amax, d_col_amax = _quantized_parts(
        torch.ops.twinengine.grouped_quantize(dy, m_splits, bwd_scale, q_grad, rng), mode)
    if bwd_scale is not None:
        margin, algo = delayed
        new_history, new_scale = update_delayed_scaling(record_amax(bwd_history, d_amax), bwd_scale,
                                                        q_grad.fp8_dtype, margin=margin, amax_compute_algo=algo)
        bwd_history.copy_(new_history)
        bwd_scale.copy_(new_scale)
    if mode == "mxfp8":  # columnwise copies keep the (rows, cols) layout
        w_b, d_a, x_b = w_col.view(groups, n, k), d_col, x_col
    elif nvfp4:  # transposed packed copies, block after block
        w_b, d_a, x_b = w_col.view(groups, k, n // 2), d_col.view(n, rows // 2), x_col.view(k, rows // 2)
    else:  # per-tensor FP8: transposed copies, block after block
        w_b, d_a, x_b = w_col.view(groups, k, n), d_col.view(n, rows), x_col.view(k, rows)
    x_2d, w_2d = two_d  # FP8 block: which operands hold 128x128 tiles
    g_2d = block_2d(q_grad)
    dx = torch.ops.twinengine.grouped_gemm_fp8(d_row, d_row_s, w_b, w_col_s, m_splits, None, mode, mode != "mxfp8",
                                               dtype_name(x_dtype), g_2d, w_2d, d_amax if nvfp4 else None,
                                               w_col_amax if nvfp4 else None)
    dw = torch.ops.twinengine.grouped_gemm_wgrad_fp8(d_a, d_col_s, x_b, x_col_s, m_splits, mode, dtype_name(w_dtype),
                                                     g_2d, x_2d, d_col_amax if nvfp4 else None,
                                                     x_col_amax if nvfp4 else None)
    db = None
    if b_dtype is not None:
        db = bias_grad_grouped(dy, m_splits, b_dtype)
    return dx, dw, db


def _fp8_backward(ctx, grads):
    *saved, rng = ctx.saved_tensors
    dx, dw, db = fp8_backward(grads[0], tuple(saved), ctx.q_grad, ctx.shape, ctx.dtypes, ctx.delayed, ctx.block_2d,
                              rng)
    return (dx, dw, None, db) + (None,) * (ctx.num_inputs - 4)


_grouped_linear_fp8.register_autograd(_fp8_backward, setup_context=_fp8_setup)


def prepare_m_splits(op: str, m_splits: Tensor | Sequence[int], num_gemms: int, num_rows: int,
                     device: torch.device) -> Tensor:
    """m_splits as an int32 tensor on `device` (a list of ints becomes one), checked by core;
    values checked eagerly on the CPU (Σ = rows, no negative split)."""
    if not isinstance(m_splits, torch.Tensor):
        m_splits = torch.tensor(list(m_splits), dtype=torch.int32, device=device)
    check_tensor_device(op, "m_splits", m_splits)
    m_splits = m_splits.to(torch.int32)
    check_m_splits(meta(m_splits), num_gemms)
    if not torch.compiler.is_compiling() and m_splits.device.type == "cpu":
        check_m_split_values(m_splits.tolist(), num_rows)
    return m_splits


def grouped_linear(x: Tensor, weights: Sequence[Tensor], m_splits: Tensor | Sequence[int],
                   biases: Sequence[Tensor] | None = None, *,
                   delayed_state: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
                   weight_cache: Sequence[Tensor] | None = None, rng: Tensor | None = None,
                   fwd_state_writer=None) -> Tensor:
    """y[rows_g] = x[rows_g] · weights[g]ᵀ (+ biases[g]) for the G consecutive row blocks of
    ``m_splits`` (TE's GroupedLinear), one grouped kernel per GEMM phase.

    Shapes: x (..., K), its leading dimensions flattened to M rows; weights G × (N, K);
        biases G × (N,); m_splits (G,) (a tensor — read by the kernels, so a new split neither
        syncs nor recompiles — or a list of ints) summing to M (x is the concatenation of the
        expert blocks); y (..., N).
        delayed_state (DelayedScaling only): (fwd_amax_history (L, 2G) — the G inputs' slots,
        then the G weights' —, fwd_scale (2G,), bwd_amax_history (L, G), bwd_scale (G,)),
        updated in place: the forward slots after the forward, the grad slots in the backward.
        Expert g's slots (columns g and G+g forward, g backward) are exactly the state of a
        ``twinengine.pytorch.Linear`` run on its rows. weight_cache: the four tensors of
        ``grouped_weight_copies`` made under the active recipe, used instead of quantizing the
        weights (FP8 weight caching across micro-batches, ``GroupedLinear(...,
        is_first_microbatch=...)``; the weights still get their gradients; DelayedScaling
        records weight amax 0, as tep.Linear with a cached weight; not for NVFP4). rng (recipes
        whose gradient rounds stochastically: NVFP4BlockScaling): int (2,) [seed, offset];
        expert g rounds its gradient with [seed, offset + g], the rng of its own tep.Linear call.
        fwd_state_writer: called as ``fwd_state_writer(new_history, new_scale)`` instead of
        copying the updated forward slots into delayed_state's tensors (``_state.state_writer``:
        a module's buffers, rebound inside a compiled checkpoint region).
    Dtypes: fp32 / bf16 / fp16; y has x's dtype, gradients their input's dtype.
    Numerics: each group's rows give exactly the bytes of ``twinengine.pytorch.linear`` on
        those rows with that group's weight (output, dx, dweight, dbias); empty groups give
        zero weight gradients. Inside ``autocast(DelayedScaling | Float8CurrentScaling |
        MXFP8BlockScaling | Float8BlockScaling | NVFP4BlockScaling)`` each expert's input rows,
        weight and gradient rows are quantized on their own (per-tensor scales per expert,
        MXFP8 / FP8 / NVFP4 blocks and NVFP4 global amaxes per expert, NVFP4's RHT on each
        expert's columnwise copies of bf16 operands; CPU only; every split a multiple of 32
        for MXFP8, of 128 for FP8 block, of 16 for NVFP4), again exactly the per-expert
        Linear's bytes (and, for DelayedScaling, its state updates).
    Raises:
        TypeError / ValueError: from core — wrong number of weights/biases, m_splits not a 1-D
            int tensor of G entries, shapes, delayed state missing or misshapen; eagerly on CPU
            also Σ m_splits != rows or a negative split (for traced splits the CPU kernel raises
            them when it runs); TypeError inside an autocast region
            with a recipe whose grouped path is not built, or an NVFP4 weight_cache;
            ValueError: stochastic rounding without rng.
    """
    qs = grouped_quantizers(current_recipe(), dtype_name(x.dtype))
    if qs is None and weight_cache is not None:
        raise TypeError("twinengine.grouped_linear: a weight_cache needs an active "
                        "twinengine.pytorch.autocast(recipe=...) region")
    if qs is not None:
        check_grouped_rng(qs, rng is not None, weight_cache is not None)
    num_gemms = len(m_splits) if not isinstance(m_splits, torch.Tensor) else m_splits.shape[0]
    check_grouped_weights(num_gemms, weights, biases)
    for name, t in (("x", x), ("weight0", weights[0])):
        check_tensor_device(_OP, name, t)
    x2 = x.reshape(-1, x.shape[-1])
    splits = prepare_m_splits(_OP, m_splits, num_gemms, x2.shape[0], x.device)
    weight = torch.stack(list(weights))
    bias = None if biases is None else torch.stack(list(biases))
    if qs is None:
        y = torch.ops.twinengine.grouped_linear(x2, weight, splits, bias)
        return y.reshape(*x.shape[:-1], weight.shape[1])
    fwd_history = fwd_scale = bwd_history = bwd_scale = None
    if qs.delayed:
        check_grouped_delayed_state(num_gemms, None if delayed_state is None else delayed_state[0].shape[0], qs,
                                    [t.shape for t in delayed_state] if delayed_state is not None else None)
        fwd_history, fwd_scale, bwd_history, bwd_scale = delayed_state
    cache = tuple(weight_cache) if weight_cache is not None else (None,) * 4
    y, *_, amax = torch.ops.twinengine.grouped_linear_fp8(x2, weight, splits, bias, qs.input, qs.weight,
                                                          qs.grad_output, fwd_scale, bwd_scale, bwd_history,
                                                          qs.margin, qs.amax_compute_algo, *cache,
                                                          rng if qs.needs_rng else None)
    if qs.delayed:
        new_history, new_scale = update_delayed_scaling(record_amax(fwd_history, amax), fwd_scale, qs.fwd_fp8_dtype,
                                                        margin=qs.margin, amax_compute_algo=qs.amax_compute_algo)
        if fwd_state_writer is not None:
            fwd_state_writer(new_history, new_scale)
        else:
            fwd_history.copy_(new_history)
            fwd_scale.copy_(new_scale)
    return y.reshape(*x.shape[:-1], weight.shape[1])


def grouped_weight_copies(weights: Sequence[Tensor], quantizer: Quantizer, scale: Tensor | None = None
                          ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(rowwise data, rowwise scales, columnwise data, columnwise scales) of the G weights (N, K)
    each quantized on its own with `quantizer` (DelayedScaling: scale (G,), the weights' slots),
    the bytes grouped_linear's forward makes: its ``weight_cache`` (no gradient)."""
    with torch.no_grad():
        weight = torch.stack([w.detach() for w in weights])
        groups, n, k = weight.shape
        splits = torch.full((groups,), n, dtype=torch.int32, device=weight.device)
        return tuple(torch.ops.twinengine.grouped_quantize(weight.reshape(groups * n, k), splits, scale, quantizer)[:4])

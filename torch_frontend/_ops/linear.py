"""torch.ops.twinengine.linear / linear_quantized: y = x · wᵀ + b with register_autograd.

The forward quantizes x and w (or takes a pre-quantized w), runs the fprop GEMM and returns
the columnwise copies the backward needs; the backward quantizes dy, runs the dgrad and
wgrad GEMMs and reduces the bias gradient with the same GEMM kernel (so both frontends give
identical bytes). With DelayedScaling the forward uses the given scales and returns the two
amaxes; the backward quantizes dy with the grad-slot scale and updates the grad-slot amax
history and scale in place (NUMERICS.md §3, §8)."""

from __future__ import annotations

import torch

from ...linear import check_delayed_state, check_linear_shapes, check_rng, linear_quantizers
from ...ops.gemm import gemm_operand
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from ..autocast import current_amax_group, current_recipe
from ..distributed import group_amax, quantize_reduced, quantize_with_amax, reduce_amax, reduces_amax
from ...ops.quantize import QUANTIZE, ArrayMeta
from .._library import dtype_name, meta, surface_errors, tensor_fallback
from .bias import bias_add, bias_grad
from .gemm import gemm
from .quantize import quantize, record_amax, update_delayed_scaling


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """fl(y + b) in y's dtype after the GEMM's own rounding (NUMERICS.md §11 "Fusion never changes
    bytes"): the bytes of ops.BasicLinear followed by ops.Bias."""
    return y if bias is None else bias_add(y, bias)


def _bias_grad(dy2: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Σc over the rows of dy (NUMERICS.md §11): the bias family's kernel, as ops.Bias uses."""
    return bias_grad(dy2, dtype)


# ---- high precision ---------------------------------------------------------------------

def _linear_body(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = _add_bias(gemm(x.reshape(-1, x.shape[-1]), weight, out_dtype=x.dtype), bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])


_linear = torch.library.custom_op("twinengine::linear", mutates_args=())(_linear_body)
# The fake runs the same body on fake tensors: the output shape comes from the GEMM plan.
_linear.register_fake(_linear_body)


def _linear_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _linear_backward(ctx, dy):
    x, weight = (t.detach() for t in ctx.saved_tensors)  # torch.func runs backwards with grad enabled
    dy2 = dy.reshape(-1, dy.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    dx = gemm(dy2, weight, b_columnwise=True, out_dtype=x.dtype).reshape(x.shape)
    dw = gemm(dy2, x2, a_columnwise=True, b_columnwise=True, out_dtype=weight.dtype)
    db = None if ctx.bias_dtype is None else _bias_grad(dy2, ctx.bias_dtype)
    return dx, dw, db


_linear.register_autograd(_linear_backward, setup_context=_linear_setup)


class _LinearFunction(torch.autograd.Function):
    """The differentiable path of ``linear`` in high precision. An autograd.Function with
    setup_context (not the custom op's register_autograd, which torch.func rejects in torch
    2.13) over the same custom op and the same backward, so torch.func.grad / vjp /
    functional_call, eager autograd and torch.compile run one code path."""

    @staticmethod
    def forward(x, weight, bias):
        return torch.ops.twinengine.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _linear_setup(ctx, inputs, output)

    @staticmethod
    def backward(ctx, dy):
        return _linear_backward(ctx, dy)


# ---- quantized --------------------------------------------------------------------------

def _linear_quantized_body(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
    w_rowwise_data: torch.Tensor | None, w_rowwise_scale_inv: torch.Tensor | None,
    w_columnwise_data: torch.Tensor | None, w_columnwise_scale_inv: torch.Tensor | None,
    input_quantizer: Quantizer, weight_quantizer: Quantizer, grad_quantizer: Quantizer,
    fwd_scale: torch.Tensor | None, bwd_scale: torch.Tensor | None, bwd_amax_history: torch.Tensor | None,
    rng: torch.Tensor | None, margin: int, amax_compute_algo: str,
    x_amax: torch.Tensor | None = None, w_amax: torch.Tensor | None = None, amax_group: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
           torch.Tensor]:
    delayed = fwd_scale is not None
    x2 = x.reshape(-1, x.shape[-1])
    # x_amax / w_amax: the global amaxes (over amax_group) of current-scaled operands
    qx = (quantize(x2, input_quantizer, scale=fwd_scale[0:1] if delayed else None) if x_amax is None
          else quantize_with_amax(x2, input_quantizer, x_amax))
    if w_rowwise_data is None:  # quantize the weight (else: its given copies, e.g. a cached FP8 weight)
        qw = (quantize(weight, weight_quantizer, scale=fwd_scale[1:2] if delayed else None) if w_amax is None
              else quantize_with_amax(weight, weight_quantizer, w_amax))
        w_amax = qw.amax
    else:
        qw = QuantizedTensor(rowwise_data=w_rowwise_data, rowwise_scale_inv=w_rowwise_scale_inv,
                             columnwise_data=w_columnwise_data, columnwise_scale_inv=w_columnwise_scale_inv,
                             quantizer=weight_quantizer, shape=tuple(w_rowwise_data.shape))
        w_amax = None
    y = _add_bias(gemm(qx, qw, out_dtype=x.dtype), bias).reshape(*x.shape[:-1], qw.shape[0])
    zero = torch.zeros(1, dtype=torch.float32, device=x.device)
    amax = torch.cat([qx.amax if delayed else zero, w_amax if delayed and w_amax is not None else zero])
    x_col_amax = qx.columnwise_amax if qx.columnwise_amax is not None else zero.clone()
    if w_rowwise_data is not None:  # the backward reads the given copies (an op must not return its inputs)
        empty = [torch.empty(0, dtype=t.dtype, device=x.device) for t in (w_columnwise_data, w_columnwise_scale_inv)]
        return y, qx.columnwise_data, qx.columnwise_scale_inv, empty[0], empty[1], x_col_amax, zero.clone(), amax
    w_col_amax = qw.columnwise_amax if qw.columnwise_amax is not None else zero.clone()
    return (y, qx.columnwise_data, qx.columnwise_scale_inv, qw.columnwise_data, qw.columnwise_scale_inv, x_col_amax,
            w_col_amax, amax)


_linear_quantized = torch.library.custom_op("twinengine::linear_quantized", mutates_args=())(_linear_quantized_body)
# The fake runs the same body on fake tensors: every op in it has a fake impl from the core plans.
_linear_quantized.register_fake(_linear_quantized_body)


def _linear_quantized_setup(ctx, inputs, output):
    (x, weight, bias, _, _, given_w_col, given_w_col_scale, input_q, weight_q, grad_q, _, bwd_scale, bwd_history,
     rng, margin, algo, _, _, amax_group) = inputs
    _, x_col, x_col_scale, w_col, w_col_scale, x_col_amax, w_col_amax, amax = output
    ctx.mark_non_differentiable(x_col, x_col_scale, w_col, w_col_scale, x_col_amax, w_col_amax, amax)
    if given_w_col is not None:
        w_col, w_col_scale = given_w_col, given_w_col_scale
    ctx.save_for_backward(x_col, x_col_scale, w_col, w_col_scale, x_col_amax, w_col_amax, bwd_scale, bwd_history, rng)
    ctx.quantizers = (input_q, weight_q, grad_q)
    ctx.dtypes = (x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype)
    ctx.delayed = (margin, algo)
    ctx.amax_group = amax_group


def _linear_quantized_backward(ctx, dy, *unused_grads):
    x_col, x_col_scale, w_col, w_col_scale, x_col_amax, w_col_amax, bwd_scale, bwd_history, rng = ctx.saved_tensors
    input_q, weight_q, grad_q = ctx.quantizers
    x_dtype, w_dtype, b_dtype = ctx.dtypes
    margin, algo = ctx.delayed
    dy2 = dy.reshape(-1, dy.shape[-1])
    qdy = quantize_reduced(dy2, grad_q, ctx.amax_group, scale=bwd_scale, rng=rng)
    if bwd_scale is not None:
        history = record_amax(bwd_history, reduce_amax(qdy.amax, ctx.amax_group))
        new_history, new_scale = update_delayed_scaling(history, bwd_scale, grad_q.fp8_dtype, margin=margin,
                                                        amax_compute_algo=algo)
        bwd_history.copy_(new_history)
        bwd_scale.copy_(new_scale)
    qw = gemm_operand(w_col, w_col_scale, weight_q, True, w_col_amax)
    dx = gemm(qdy, qw, b_columnwise=True, out_dtype=x_dtype).reshape(*dy.shape[:-1], qw.shape[1])
    dw = None
    if w_dtype is not None:
        qx = gemm_operand(x_col, x_col_scale, input_q, True, x_col_amax)
        dw = gemm(qdy, qx, a_columnwise=True, b_columnwise=True, out_dtype=w_dtype)
    db = None if b_dtype is None else _bias_grad(dy2, b_dtype)
    return (dx, dw, db) + (None,) * 16


_linear_quantized.register_autograd(_linear_quantized_backward, setup_context=_linear_quantized_setup)


class _LinearQuantizedFunction(torch.autograd.Function):
    """The differentiable path of ``linear`` under a recipe (see ``_LinearFunction``)."""

    @staticmethod
    def forward(*inputs):
        return torch.ops.twinengine.linear_quantized(*inputs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _linear_quantized_setup(ctx, inputs, output)

    @staticmethod
    def backward(ctx, *grads):
        return _linear_quantized_backward(ctx, *grads)


@surface_errors(tensor_fallback)
def linear(x: torch.Tensor, weight: torch.Tensor | QuantizedTensor, bias: torch.Tensor | None = None, *,
           delayed_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
           rng: torch.Tensor | None = None, weight_cache: QuantizedTensor | None = None,
           amax_group: str | None = None, fwd_state_writer=None) -> torch.Tensor:
    """y = x · wᵀ (+ bias), quantized as the innermost ``twinengine.pytorch.autocast`` recipe says.

    Shapes: x (..., K); weight (N, K) (a tensor, or a QuantizedTensor with both copies); bias
        (N,); y (..., N). delayed_state (DelayedScaling only): (fwd_amax_history (L, 2),
        fwd_scale (2,), bwd_amax_history (L, 1), bwd_scale (1,)), updated in place: the forward
        slots after the forward, the grad slot during the backward (NUMERICS.md §3).
        weight_cache: the tensor weight's quantized copies (both usages, the recipe's weight
        quantizer) used instead of quantizing it — FP8 weight caching across micro-batches
        (``twinengine.pytorch.Linear(..., is_first_microbatch=...)``); `weight` still gets its
        gradient.
        amax_group: the name of a process group (``group.group_name``) over which every
        whole-tensor amax of x, w and dy is all-reduced with MAX (NUMERICS.md §12); default the
        innermost autocast region's ``amax_reduction_group``. The tensor-parallel layers pass
        their tp_group here.
        fwd_state_writer: called as ``fwd_state_writer(new_history, new_scale)`` with the updated
        forward slots instead of copying them into delayed_state's tensors (modules pass
        ``_state.state_writer`` so a compiled checkpoint region rebinds their buffers).
    Dtypes: x, weight, bias fp32 / bf16 / fp16; y has x's dtype, grads their input's dtype.
    Numerics: outside autocast the three GEMMs run in high precision (fp32 accumulation);
        inside, x and w are quantized with the recipe's input / weight quantizers and dy with
        its grad_output quantizer (NUMERICS.md §8, §9); the GEMM output is rounded to x's dtype, then
        fl(y + bias) added, and the bias gradient is the canonical column sum Σc of dy (§11). Same kernels as ``twinengine.jax.dense``: identical bytes.
    Raises:
        TypeError: unsupported recipe / quantizer combination, QuantizedTensor weight (or
            weight_cache) without a recipe or in NVFP4; ValueError: delayed state missing or of
            the wrong length, stochastic rounding without rng.
    """
    recipe = current_recipe()
    quantized_weight = isinstance(weight, QuantizedTensor)
    check_linear_shapes(x.shape, weight.shape, None if bias is None else bias.shape)
    if recipe is None:
        if quantized_weight or weight_cache is not None:
            raise TypeError("twinengine.linear: a QuantizedTensor weight needs an active "
                            "twinengine.pytorch.autocast(recipe=...) region")
        return _LinearFunction.apply(x, weight, bias)
    qs = linear_quantizers(recipe, dtype_name(x.dtype))
    check_rng(qs, rng is not None)
    if amax_group is None:
        amax_group = current_amax_group()
    copies = weight if quantized_weight else weight_cache
    if copies is not None and copies.quantizer.scaling_mode == "nvfp4":
        raise TypeError("twinengine.linear: pre-quantized NVFP4 weights are not supported; pass the high-precision "
                        "weight (it is quantized per call)")
    fwd_history = fwd_scale = bwd_history = bwd_scale = None
    if qs.delayed:
        check_delayed_state(None if delayed_state is None else delayed_state[0].shape[0], qs)
        fwd_history, fwd_scale, bwd_history, bwd_scale = delayed_state
    weight_q = qs.weight if copies is None else copies.quantizer
    # every quantize the call will run, checked here (before the autograd.Function, inside which
    # an error could not reach the user with its text under torch.compile)
    rows = 1
    for d in x.shape[:-1]:
        rows = rows * d
    name = dtype_name(x.dtype)
    scale_meta = ArrayMeta((1,), "float32") if qs.delayed else None
    rng_meta = meta(rng) if qs.needs_rng else None
    QUANTIZE.validate(ArrayMeta((rows, x.shape[-1]), name), qs.input, scale_meta, None)
    if copies is None:
        QUANTIZE.validate(meta(weight), weight_q, scale_meta, None)
    QUANTIZE.validate(ArrayMeta((rows, weight.shape[0]), name), qs.grad_output, scale_meta, rng_meta)
    if copies is not None:
        w_parts = (None if quantized_weight else weight, copies.rowwise_data, copies.rowwise_scale_inv,
                   copies.columnwise_data, copies.columnwise_scale_inv)
    else:
        w_parts = (weight, None, None, None, None)
    x_amax = w_amax = None
    if amax_group is not None and reduces_amax(qs.input):
        x_amax = group_amax(x.reshape(-1, x.shape[-1]), qs.input, amax_group)
        if copies is None:
            w_amax = group_amax(weight, qs.weight, amax_group)
    y, *_, amax = _LinearQuantizedFunction.apply(
        x, w_parts[0], bias, *w_parts[1:], qs.input, weight_q, qs.grad_output, fwd_scale, bwd_scale, bwd_history,
        rng if qs.needs_rng else None, qs.margin, qs.amax_compute_algo, x_amax, w_amax, amax_group)
    if qs.delayed:
        amax = reduce_amax(amax, amax_group)
        new_history, new_scale = update_delayed_scaling(record_amax(fwd_history, amax), fwd_scale, qs.fwd_fp8_dtype,
                                                        margin=qs.margin, amax_compute_algo=qs.amax_compute_algo)
        if fwd_state_writer is not None:
            fwd_state_writer(new_history, new_scale)
        else:
            fwd_history.copy_(new_history)
            fwd_scale.copy_(new_scale)
    return y

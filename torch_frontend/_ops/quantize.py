"""torch.ops.twinengine.quantize / dequantize / update_delayed_scaling and their Python
wrappers. Shapes, checks and errors come from core/ops/quantize.py."""

from __future__ import annotations

from typing import Sequence

import torch

from ...interop import fail_not_contiguous
from ...ops.opdef import fail
from ...ops.quantize import (DEQUANTIZE, F32_ABS_MASK, F32_INF_BITS, QUANTIZE, UPDATE_DELAYED_SCALING,
                             quantized_layout, validate_quantize_into, validate_record_amax)
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._library import (check_tensor_device, dtype_name, empty_outputs, launch, meta, packed_call, plain_eager,
                        surface_errors, tensor_fallback, torch_dtype, tuple_fallback, view_spec)


@torch.library.custom_op("twinengine::quantize", mutates_args=())
def _quantize(x: torch.Tensor, quantizer: Quantizer, scale: torch.Tensor | None = None,
              rng: torch.Tensor | None = None, amax: torch.Tensor | None = None) -> list[torch.Tensor]:
    call = QUANTIZE.cached_plan(meta(x), quantizer, meta(scale), meta(rng), meta(amax))
    arrays = {"x": x, "scale": scale, "rng": rng, "amax": amax}
    return launch(call, [arrays[name] for name in call.inputs], x.device)


@_quantize.register_fake
def _(x, quantizer, scale=None, rng=None, amax=None):
    return empty_outputs(QUANTIZE.infer(meta(x), quantizer, meta(scale), meta(rng), meta(amax)), x.device)


@torch.library.custom_op("twinengine::dequantize", mutates_args=())
def _dequantize(data: torch.Tensor, scale_inv: torch.Tensor, amax: torch.Tensor | None, quantizer: Quantizer,
                shape: Sequence[int], dtype: str, columnwise: bool) -> torch.Tensor:
    qt = _as_quantized(data, scale_inv, amax, quantizer, shape, columnwise)
    call = DEQUANTIZE.plan(qt, dtype, columnwise)
    (out,) = launch(call, [getattr(qt, name) for name in call.inputs], data.device)
    return out


@_dequantize.register_fake
def _(data, scale_inv, amax, quantizer, shape, dtype, columnwise):
    qt = _as_quantized(data, scale_inv, amax, quantizer, shape, columnwise)
    (out,) = empty_outputs(DEQUANTIZE.infer(qt, dtype, columnwise), data.device)
    return out


@torch.library.custom_op("twinengine::update_delayed_scaling", mutates_args=())
def _update_delayed_scaling(amax_history: torch.Tensor, scale: torch.Tensor, fp8_dtype: str, margin: int,
                            amax_compute_algo: str) -> tuple[torch.Tensor, torch.Tensor]:
    call = UPDATE_DELAYED_SCALING.plan(meta(amax_history), meta(scale), fp8_dtype, margin, amax_compute_algo)
    new_history, new_scale = launch(call, [amax_history, scale], amax_history.device)
    return new_history, new_scale


@_update_delayed_scaling.register_fake
def _(amax_history, scale, fp8_dtype, margin, amax_compute_algo):
    call = UPDATE_DELAYED_SCALING.infer(meta(amax_history), meta(scale), fp8_dtype, margin, amax_compute_algo)
    new_history, new_scale = empty_outputs(call, amax_history.device)
    return new_history, new_scale


def _unbatched(value, dim, index):
    """Element `index` of a vmapped argument (unchanged when not batched)."""
    return value.select(dim, index) if isinstance(dim, int) else value


def _sequential_vmap(op):
    """A vmap rule running `op` once per batch element and stacking the results along dim 0:
    under torch.func.vmap each element is quantized (or dequantized) on its own, as under
    jax.vmap, so batching never changes the bytes."""
    def rule(info, in_dims, *args):
        results = [op(*(_unbatched(a, d, i) for a, d in zip(args, in_dims))) for i in range(info.batch_size)]
        if isinstance(results[0], torch.Tensor):
            return torch.stack(results), 0
        stacked = [torch.stack(column) for column in zip(*results)]
        return stacked, [0] * len(stacked)
    return rule


torch.library.register_vmap("twinengine::quantize", _sequential_vmap(torch.ops.twinengine.quantize))
torch.library.register_vmap("twinengine::dequantize", _sequential_vmap(torch.ops.twinengine.dequantize))


def _quantized_fallback(err, x, quantizer, **kwargs) -> QuantizedTensor:
    spec = quantizer if isinstance(quantizer, Quantizer) else None
    return QuantizedTensor(rowwise_data=err, rowwise_scale_inv=err, columnwise_data=err, columnwise_scale_inv=err,
                           amax=err, columnwise_amax=err, quantizer=spec, shape=tuple(err.shape))


def _as_quantized(data, scale_inv, amax, quantizer, shape, columnwise) -> QuantizedTensor:
    prefix = "columnwise" if columnwise else "rowwise"
    fields = {f"{prefix}_data": data, f"{prefix}_scale_inv": scale_inv,
              ("columnwise_amax" if columnwise else "amax"): amax}
    return QuantizedTensor(**fields, quantizer=quantizer, shape=tuple(shape))


_EAGER_CPU: dict = {}  # (x.shape, x.dtype, quantizer) -> everything an eager CPU quantize repeats
_EAGER_CPU_LIMIT = 4096


def _quantize_eager_cpu(x: torch.Tensor, quantizer: Quantizer) -> QuantizedTensor:
    """The custom op's impl for a plain eager CPU call without scale or rng, with the plan,
    the output specs, the input view and the prepared kernel call looked up once per
    (shape, dtype, quantizer): what stays per call is allocating, launching, wrapping."""
    key = (x.shape, x.dtype, quantizer)
    entry = _EAGER_CPU.get(key)
    if entry is None:
        x_meta = meta(x)
        call = QUANTIZE.cached_plan(x_meta, quantizer, None, None)
        outs, prepared = packed_call(call, x.device)
        entry = (outs, prepared, tuple(spec.name for spec in call.outputs), view_spec(x), x_meta.shape, x_meta.dtype)
        if len(_EAGER_CPU) >= _EAGER_CPU_LIMIT:
            _EAGER_CPU.clear()
        _EAGER_CPU[key] = entry
    outs, prepared, names, x_view, shape, dtype = entry
    x = x.contiguous()
    outputs = [torch.empty(out_shape, dtype=out_dtype) for out_shape, out_dtype, _ in outs]
    prepared([(x.data_ptr(), *x_view)], [(t.data_ptr(), *view) for t, (_, _, view) in zip(outputs, outs)], 0,
             torch.get_num_threads())
    return QuantizedTensor(**dict(zip(names, outputs)), quantizer=quantizer, shape=shape, dtype=dtype)


@surface_errors(_quantized_fallback)
def quantize(x: torch.Tensor, quantizer: Quantizer, *, scale: torch.Tensor | None = None,
             rng: torch.Tensor | None = None, amax: torch.Tensor | None = None) -> QuantizedTensor:
    """Quantizes `x` as `quantizer` describes.

    Shapes: x any rank >= 1, flattened to (R, K); output layouts per NUMERICS.md §4–§7.
    Dtypes: x float32 / bfloat16 / float16 (bfloat16 for NVFP4 with_rht and columnwise usage);
        scale (delayed scaling) float32 (1,); rng (NVFP4 stochastic rounding only) the
        [seed, offset] array of shape (2,), uint32 / int32 / int64, low 32 bits used
        (``twinengine.ops.quantize.RNG_DTYPES``): the same state gives the same bytes in both
        frontends, and a new value is a new input, not a recompile; amax (NVFP4 only) float32
        (2,): given global amaxes [rowwise, columnwise (after RHT)] replacing x's own — a shard
        quantized with its group's MAX-reduced amaxes gets the whole tensor's scales
        (NUMERICS.md §7 step 1, §12).
    Numerics: bit for bit NUMERICS.md (saturating casts, NaN-skipping amax); identical bytes
        to ``twinengine.jax.quantize`` for the same input.
    Raises:
        TypeError / ValueError: from the shared core checks (dtype, rank, empty input, block
        divisibility, missing or unexpected scale / rng, unsupported device).
    """
    if scale is None and rng is None and amax is None and plain_eager(x) and x.is_cpu:
        return _quantize_eager_cpu(x, quantizer)
    source = x if torch.is_grad_enabled() and x.requires_grad else None
    x = x.detach() if source is not None else x
    for name, t in (("x", x), ("scale", scale), ("rng", rng), ("amax", amax)):
        check_tensor_device("quantize", name, t)
    eager = plain_eager(x, scale, rng, amax)
    call = (QUANTIZE.cached_plan if eager else QUANTIZE.plan)(meta(x), quantizer, meta(scale), meta(rng), meta(amax))
    if eager:  # the custom op's impl, without the dispatcher's overhead
        arrays = launch(call, [{"x": x, "scale": scale, "rng": rng, "amax": amax}[name] for name in call.inputs],
                        x.device)
    else:
        arrays = torch.ops.twinengine.quantize(x, quantizer, scale, rng, amax)
    fields = {spec.name: array for spec, array in zip(call.outputs, arrays)}
    qt = QuantizedTensor(**fields, quantizer=quantizer, shape=tuple(x.shape), dtype=dtype_name(x.dtype))
    if source is not None:
        qt.grad_source = source  # dequantize's straight-through link (not a field: never saved)
    return qt


def _straight_through_source(qt: QuantizedTensor, columnwise: bool):
    """The tensor `qt` was quantized from when dequantize may pass its gradient straight
    through to it: recorded by quantize under autograd; none for a columnwise copy made with
    RHT (it decodes to transformed values, so the identity is not its derivative)."""
    if columnwise and getattr(qt.quantizer, "with_rht", False):
        return None
    return getattr(qt, "grad_source", None)


@surface_errors(tensor_fallback)
def dequantize(qt: QuantizedTensor, dtype: torch.dtype = torch.float32, *, columnwise: bool = False) -> torch.Tensor:
    """Dequantizes the rowwise (or, with ``columnwise=True``, the columnwise) copy of `qt`.

    Shapes: returns qt.shape (transposed columnwise layouts are transposed back).
    Dtypes: float32 / bfloat16 / float16 (computed in fp32, rounded to nearest even).
    Numerics: the format's decode rule (NUMERICS.md); a columnwise NVFP4 copy made with RHT
        dequantizes to the transformed values (undoing the RHT is not dequantize's job).
    Gradient: straight through, as ``fake_quantize``: when `qt` came from ``quantize(x, ...)``
        with x requiring grad (autograd, torch.func, torch.compile), the result is
        differentiable w.r.t. x and x's gradient is the incoming gradient cast to x's dtype.
        The link lives on the Python object (``qt.grad_source``), not in its arrays, so it is
        dropped by ``state_dict`` / pickling / pytree flattening; a columnwise RHT copy has
        none (its values are transformed).
    Raises:
        ValueError: the requested copy is absent (its quantizer lacks that usage).
    """
    name = dtype_name(dtype)
    DEQUANTIZE.validate(qt, name, columnwise)
    prefix = "columnwise" if columnwise else "rowwise"
    amax = qt.columnwise_amax if columnwise else qt.amax
    out = torch.ops.twinengine.dequantize(getattr(qt, f"{prefix}_data"), getattr(qt, f"{prefix}_scale_inv"), amax,
                                          qt.quantizer, list(qt.shape), name, columnwise)
    source = _straight_through_source(qt, columnwise)
    return _StraightThrough.apply(source, out) if source is not None and torch.is_grad_enabled() else out


@surface_errors(tuple_fallback(2))
def update_delayed_scaling(amax_history: torch.Tensor, scale: torch.Tensor, fp8_dtype: str, *, margin: int = 0,
                           amax_compute_algo: str = "max") -> tuple[torch.Tensor, torch.Tensor]:
    """Delayed-scaling update (NUMERICS.md §3), functional: returns (new_amax_history, new_scale).

    Shapes: amax_history (L,) or (L, N); scale (N,) (N = 1 for a 1-D history).
    Numerics: per slot, an unused slot (H[0] == 0) is unchanged; otherwise the history rolls
        and s' = fl(M·2^-margin) / a*, keeping s for non-finite or zero a*.
    """
    UPDATE_DELAYED_SCALING.validate(meta(amax_history), meta(scale), fp8_dtype, margin, amax_compute_algo)
    return torch.ops.twinengine.update_delayed_scaling(amax_history, scale, fp8_dtype, margin, amax_compute_algo)


class _StraightThrough(torch.autograd.Function):
    """Forward: the given fake-quantized values; backward: the gradient passed to x unchanged
    (cast to x's dtype). setup_context keeps it usable under torch.func and torch.compile."""

    @staticmethod
    def forward(x, y):
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.x_dtype = inputs[0].dtype

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.x_dtype), None


@surface_errors(tensor_fallback)
def fake_quantize(x: torch.Tensor, quantizer: Quantizer, dtype: torch.dtype | None = None, *,
                  scale: torch.Tensor | None = None, rng: torch.Tensor | None = None,
                  columnwise: bool = False) -> torch.Tensor:
    """dequantize(quantize(x)) with a straight-through gradient: what fake-quant training expects.

    Shapes: as x (the rowwise, or with ``columnwise=True`` the columnwise, copy dequantized).
    Dtypes: output `dtype` (default x's); the gradient of x is the incoming gradient cast to
        x's dtype (identity, "straight through": rounding is treated as having derivative 1).
    Numerics: the forward is exactly ``dequantize(quantize(x, quantizer, ...), dtype)``, which
        is itself straight-through differentiable (see ``dequantize``); same bytes and gradient
        as ``twinengine.jax.fake_quantize``.
    Raises:
        TypeError / ValueError: as quantize / dequantize.
    """
    qt = quantize(x.detach(), quantizer, scale=scale, rng=rng)
    y = dequantize(qt, x.dtype if dtype is None else dtype, columnwise=columnwise)
    return _StraightThrough.apply(x, y)


def _order_key(bits: torch.Tensor) -> torch.Tensor:
    return torch.where(bits >= 0, bits, bits ^ F32_ABS_MASK)


@surface_errors(tensor_fallback)
def record_amax(amax_history: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """History with row 0 raised to `amax` where it is larger (NUMERICS.md §3 quantize step),
    functional.

    Shapes: amax_history (L,) or (L, N); amax N values (any shape of N elements).
    Numerics: ``twinengine.ops.quantize.RECORD_AMAX_RULE`` — computed on the fp32 bits, so
        subnormal amaxes are kept whatever the FTZ/DAZ mode; a NaN amax is skipped; identical
        bytes to ``twinengine.jax.record_amax``.
    Raises:
        TypeError / ValueError: non-float32 arrays, or an amax count that is not the slot count.
    """
    validate_record_amax(meta(amax_history), meta(amax))
    head = amax_history[:1].contiguous().view(torch.int32)
    new = amax.reshape(head.shape).contiguous().view(torch.int32)
    nan_new = (new & F32_ABS_MASK) > F32_INF_BITS
    nan_head = (head & F32_ABS_MASK) > F32_INF_BITS
    take = ~nan_new & ~nan_head & (_order_key(new) > _order_key(head))
    return torch.cat([torch.where(take, new, head).view(torch.float32), amax_history[1:]])


# ---- quantizing into caller-owned buffers -----------------------------------------------

@torch.library.custom_op("twinengine::quantize_", mutates_args=("out",))
def _quantize_(x: torch.Tensor, quantizer: Quantizer, out: list[torch.Tensor], scale: torch.Tensor | None = None,
               rng: torch.Tensor | None = None) -> None:
    call = QUANTIZE.plan(meta(x), quantizer, meta(scale), meta(rng))
    arrays = {"x": x, "scale": scale, "rng": rng}
    launch(call, [arrays[name] for name in call.inputs], x.device, outputs=list(out))


@_quantize_.register_fake
def _(x, quantizer, out, scale=None, rng=None):
    return None


def make_empty(quantizer: Quantizer, shape: Sequence[int], dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None) -> QuantizedTensor:
    """A zero-filled QuantizedTensor with the arrays ``quantize`` gives for an input of `shape`
    and `dtype` under `quantizer` (TE's ``quantizer.make_empty``): the buffers ``quantize_``
    writes into.

    Shapes / Dtypes: from the core shape function of quantize (NUMERICS.md §4–§7 layouts).
    Raises:
        TypeError / ValueError: as ``quantize`` for that input (dtype, rank, divisibility).
    """
    specs = quantized_layout(quantizer, tuple(shape), dtype_name(dtype))
    arrays = {spec.name: torch.zeros(spec.shape, dtype=torch_dtype(spec.dtype), device=device) for spec in specs}
    return QuantizedTensor(**arrays, quantizer=quantizer, shape=tuple(shape), dtype=dtype_name(dtype))


def quantize_(out: QuantizedTensor, x: torch.Tensor, *, scale: torch.Tensor | None = None,
              rng: torch.Tensor | None = None) -> QuantizedTensor:
    """Quantizes `x` into the buffers of `out` in place (TE's ``update_quantized``): data,
    scales and amaxes of every copy ``out.quantizer`` makes; returns `out`.

    A mutating custom op (``torch.ops.twinengine.quantize_``, schema ``Tensor(a!)[] out``):
    compile-clean, functionalized under torch.compile, the buffers keep their storage.
    Shapes: x of ``out.shape``; out's arrays as ``make_empty(out.quantizer, x.shape, x.dtype)``.
    Dtypes / Numerics: as ``quantize(x, out.quantizer)``, byte for byte.
    Raises:
        TypeError / ValueError: out is not a QuantizedTensor, was made for another shape or
            dtype, has missing / extra / mis-shaped arrays, an array on another device than x
            or not contiguous; plus every check of ``quantize``.
    """
    call = validate_quantize_into(out, meta(x), meta(scale), meta(rng))
    buffers = [getattr(out, spec.name) for spec in call.outputs]
    for name, t in (("x", x), ("scale", scale), ("rng", rng)):
        check_tensor_device("quantize_", name, t)
    for spec, t in zip(call.outputs, buffers):
        if t.device != x.device:
            fail("quantize_", ValueError, f"out.{spec.name} is on {t.device}, x on {x.device}")
        if not t.is_contiguous():
            fail_not_contiguous("quantize_", f"out.{spec.name}", tuple(t.shape), tuple(t.stride()))
    torch.ops.twinengine.quantize_(x, out.quantizer, buffers, scale, rng)
    return out

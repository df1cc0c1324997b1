"""torch.ops.twinengine.quantize / dequantize / update_delayed_scaling and their Python
wrappers. Shapes, checks and errors come from core/ops/quantize.py."""

from __future__ import annotations

from typing import Sequence

import torch

from ...ops.quantize import DEQUANTIZE, QUANTIZE, UPDATE_DELAYED_SCALING
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._library import (check_tensor_device, dtype_name, empty_outputs, launch, meta, packed_call, plain_eager,
                        view_spec)


@torch.library.custom_op("twinengine::quantize", mutates_args=())
def _quantize(x: torch.Tensor, quantizer: Quantizer, scale: torch.Tensor | None = None,
              rng: torch.Tensor | None = None) -> list[torch.Tensor]:
    call = QUANTIZE.cached_plan(meta(x), quantizer, meta(scale), meta(rng))
    arrays = {"x": x, "scale": scale, "rng": rng}
    return launch(call, [arrays[name] for name in call.inputs], x.device)


@_quantize.register_fake
def _(x, quantizer, scale=None, rng=None):
    return empty_outputs(QUANTIZE.infer(meta(x), quantizer, meta(scale), meta(rng)), x.device)


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


def quantize(x: torch.Tensor, quantizer: Quantizer, *, scale: torch.Tensor | None = None,
             rng: torch.Tensor | None = None) -> QuantizedTensor:
    """Quantizes `x` as `quantizer` describes.

    Shapes: x any rank >= 1, flattened to (R, K); output layouts per NUMERICS.md §4–§7.
    Dtypes: x float32 / bfloat16 / float16 (bfloat16 for NVFP4 with_rht and columnwise usage);
        scale (delayed scaling) float32 (1,); rng (NVFP4 stochastic rounding only) the
        [seed, offset] array of shape (2,), uint32 / int32 / int64, low 32 bits used
        (``twinengine.ops.quantize.RNG_DTYPES``): the same state gives the same bytes in both
        frontends, and a new value is a new input, not a recompile.
    Numerics: bit for bit NUMERICS.md (saturating casts, NaN-skipping amax); identical bytes
        to ``twinengine.jax.quantize`` for the same input.
    Raises:
        TypeError / ValueError: from the shared core checks (dtype, rank, empty input, block
        divisibility, missing or unexpected scale / rng, unsupported device).
    """
    if scale is None and rng is None and plain_eager(x) and x.is_cpu:
        return _quantize_eager_cpu(x, quantizer)
    for name, t in (("x", x), ("scale", scale), ("rng", rng)):
        check_tensor_device("quantize", name, t)
    eager = plain_eager(x, scale, rng)
    call = (QUANTIZE.cached_plan if eager else QUANTIZE.plan)(meta(x), quantizer, meta(scale), meta(rng))
    if eager:  # the custom op's impl, without the dispatcher's overhead
        arrays = launch(call, [{"x": x, "scale": scale, "rng": rng}[name] for name in call.inputs], x.device)
    else:
        arrays = torch.ops.twinengine.quantize(x, quantizer, scale, rng)
    fields = {spec.name: array for spec, array in zip(call.outputs, arrays)}
    return QuantizedTensor(**fields, quantizer=quantizer, shape=tuple(x.shape), dtype=dtype_name(x.dtype))


def dequantize(qt: QuantizedTensor, dtype: torch.dtype = torch.float32, *, columnwise: bool = False) -> torch.Tensor:
    """Dequantizes the rowwise (or, with ``columnwise=True``, the columnwise) copy of `qt`.

    Shapes: returns qt.shape (transposed columnwise layouts are transposed back).
    Dtypes: float32 / bfloat16 / float16 (computed in fp32, rounded to nearest even).
    Numerics: the format's decode rule (NUMERICS.md); a columnwise NVFP4 copy made with RHT
        dequantizes to the transformed values (undoing the RHT is not dequantize's job).
    Raises:
        ValueError: the requested copy is absent (its quantizer lacks that usage).
    """
    name = dtype_name(dtype)
    DEQUANTIZE.validate(qt, name, columnwise)
    prefix = "columnwise" if columnwise else "rowwise"
    amax = qt.columnwise_amax if columnwise else qt.amax
    return torch.ops.twinengine.dequantize(getattr(qt, f"{prefix}_data"), getattr(qt, f"{prefix}_scale_inv"), amax,
                                           qt.quantizer, list(qt.shape), name, columnwise)


def update_delayed_scaling(amax_history: torch.Tensor, scale: torch.Tensor, fp8_dtype: str, *, margin: int = 0,
                           amax_compute_algo: str = "max") -> tuple[torch.Tensor, torch.Tensor]:
    """Delayed-scaling update (NUMERICS.md §3), functional: returns (new_amax_history, new_scale).

    Shapes: amax_history (L,) or (L, N); scale (N,) (N = 1 for a 1-D history).
    Numerics: per slot, an unused slot (H[0] == 0) is unchanged; otherwise the history rolls
        and s' = fl(M·2^-margin) / a*, keeping s for non-finite or zero a*.
    """
    UPDATE_DELAYED_SCALING.validate(meta(amax_history), meta(scale), fp8_dtype, margin, amax_compute_algo)
    return torch.ops.twinengine.update_delayed_scaling(amax_history, scale, fp8_dtype, margin, amax_compute_algo)


def record_amax(amax_history: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """History with row 0 raised to max(H[0], amax) (NUMERICS.md §3 quantize step)."""
    return torch.cat([torch.maximum(amax_history[:1], amax.reshape(amax_history[:1].shape)), amax_history[1:]])

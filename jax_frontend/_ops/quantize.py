"""twinengine.jax quantize / dequantize / update_delayed_scaling over XLA FFI calls.
Shapes, checks and errors come from core/ops/quantize.py."""

from __future__ import annotations

import jax.numpy as jnp

from ...ops.quantize import DEQUANTIZE, QUANTIZE, UPDATE_DELAYED_SCALING
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._library import dtype_name, ffi, meta


def quantize(x, quantizer: Quantizer, *, scale=None, rng=None) -> QuantizedTensor:
    """Quantizes `x` as `quantizer` describes (jit-, vmap-clean).

    Shapes: x any rank >= 1, flattened to (R, K); output layouts per NUMERICS.md §4–§7.
    Dtypes: x float32 / bfloat16 / float16 (bfloat16 for NVFP4 with_rht and columnwise usage);
        scale (delayed scaling) float32 (1,); rng (NVFP4 stochastic rounding only) the
        [seed, offset] array of shape (2,), uint32 / int32 / int64, low 32 bits used
        (``twinengine.ops.quantize.RNG_DTYPES``): the same state gives the same bytes in both
        frontends, and a new value is a new input, not a recompile.
    Numerics: bit for bit NUMERICS.md; identical bytes to ``twinengine.pytorch.quantize``.
        Under vmap each batch element is quantized on its own.
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    x = jnp.asarray(x)
    call = QUANTIZE.cached_plan(meta(x), quantizer, meta(scale), meta(rng))
    arrays = {"x": x, "scale": scale, "rng": rng}
    outputs = ffi(call, [arrays[name] for name in call.inputs])
    fields = {spec.name: array for spec, array in zip(call.outputs, outputs)}
    return QuantizedTensor(**fields, quantizer=quantizer, shape=tuple(x.shape), dtype=dtype_name(x.dtype))


def dequantize(qt: QuantizedTensor, dtype=jnp.float32, *, columnwise: bool = False):
    """Dequantizes the rowwise (or columnwise) copy of `qt` to an array of qt.shape.

    Numerics: as ``twinengine.pytorch.dequantize`` (same kernel, same bytes).
    Raises:
        ValueError: the requested copy is absent (its quantizer lacks that usage).
    """
    call = DEQUANTIZE.plan(qt, dtype_name(dtype), columnwise)
    (out,) = ffi(call, [getattr(qt, name) for name in call.inputs])
    return out


def update_delayed_scaling(amax_history, scale, fp8_dtype: str, *, margin: int = 0, amax_compute_algo: str = "max"):
    """Delayed-scaling update (NUMERICS.md §3), functional: returns (new_amax_history, new_scale)."""
    call = UPDATE_DELAYED_SCALING.plan(meta(amax_history), meta(scale), fp8_dtype, margin, amax_compute_algo)
    new_history, new_scale = ffi(call, [amax_history, scale])
    return new_history, new_scale


def record_amax(amax_history, amax):
    """History with row 0 raised to max(H[0], amax) (NUMERICS.md §3 quantize step)."""
    return amax_history.at[:1].set(jnp.maximum(amax_history[:1], amax.reshape(amax_history[:1].shape)))

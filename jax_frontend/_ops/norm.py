"""twinengine.jax layernorm / rmsnorm / l2norm forward and backward over XLA FFI calls, with an
optional quantization of y fused into the forward call. Shapes, checks and errors come from
core/ops/norm.py; no custom_vjp here (the layer functions wrap these)."""

from __future__ import annotations

import jax.numpy as jnp

from ...ops.norm import (
    L2NORM_BWD,
    L2NORM_FWD,
    LAYERNORM_BWD,
    LAYERNORM_FWD,
    RMSNORM_BWD,
    RMSNORM_FWD,
    quantized_fields,
)
from ...ops.opdef import KernelCall
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._library import dtype_name, ffi, meta


def _quantized(call: KernelCall, arrays: list, num_norm_outputs: int, x, quantizer: Quantizer | None
               ) -> QuantizedTensor | None:
    """The QuantizedTensor of y (as twinengine.jax.quantize builds it), or None without a quantizer."""
    if quantizer is None:
        return None
    return QuantizedTensor(**quantized_fields(call, arrays, num_norm_outputs), quantizer=quantizer,
                           shape=tuple(x.shape), dtype=dtype_name(x.dtype))


def layernorm_fwd(x, weight, bias, eps: float, zero_centered_gamma: bool, *, quantizer: Quantizer | None = None,
                  scale=None, rng=None):
    """LayerNorm forward, optionally with y quantized in the same kernel call (jit-, vmap-clean).

    Returns (y, mu, rstd, qt).
    Shapes: x (..., K), K >= 1 (zero rows allowed without a quantizer); weight, bias (K,);
        y x's shape; mu, rstd x.shape[:-1] (one per row).
    Dtypes: x, weight, bias float32 / bfloat16 / float16, independently; y x's dtype; mu, rstd
        float32. scale / rng as ``twinengine.jax.quantize`` takes them.
    Numerics: NUMERICS.md §11; ``qt`` (None without a quantizer) is byte-identical to quantizing y
        with ``twinengine.jax.quantize``; same bytes as ``twinengine.pytorch``. Under vmap each
        batch element is its own call (the numerics are per row, so nothing changes).
    Raises:
        TypeError / ValueError: from the shared core checks (same text as the torch frontend).
    """
    x = jnp.asarray(x)
    call = LAYERNORM_FWD.plan(meta(x), meta(weight), meta(bias), eps, zero_centered_gamma, quantizer, meta(scale),
                              meta(rng))
    arrays = {"x": x, "weight": weight, "bias": bias, "scale": scale, "rng": rng}
    outputs = ffi(call, [arrays[name] for name in call.inputs])
    return outputs[0], outputs[1], outputs[2], _quantized(call, outputs, 3, x, quantizer)


def layernorm_bwd(dy, x, mu, rstd, weight, zero_centered_gamma: bool):
    """LayerNorm backward from the saved mu and rstd: (dx, dweight, dbias).

    Shapes: dy, x (..., K); mu, rstd x.shape[:-1]; weight (K,). dx in x's dtype, dweight and dbias
        (K,) in weight's dtype.
    Numerics: NUMERICS.md §11 backward; dweight = Σc over rows of fl(dy·x̂), dbias = Σc over rows of dy.
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    call = LAYERNORM_BWD.plan(meta(dy), meta(x), meta(mu), meta(rstd), meta(weight), zero_centered_gamma)
    dx, dweight, dbias = ffi(call, [dy, x, mu, rstd, weight])
    return dx, dweight, dbias


def rmsnorm_fwd(x, weight, eps: float, zero_centered_gamma: bool, *, quantizer: Quantizer | None = None, scale=None,
                rng=None):
    """RMSNorm forward: (y, rstd, qt). As ``layernorm_fwd`` without bias and mu."""
    x = jnp.asarray(x)
    call = RMSNORM_FWD.plan(meta(x), meta(weight), eps, zero_centered_gamma, quantizer, meta(scale), meta(rng))
    arrays = {"x": x, "weight": weight, "scale": scale, "rng": rng}
    outputs = ffi(call, [arrays[name] for name in call.inputs])
    return outputs[0], outputs[1], _quantized(call, outputs, 2, x, quantizer)


def rmsnorm_bwd(dy, x, rstd, weight, zero_centered_gamma: bool):
    """RMSNorm backward from the saved rstd: (dx, dweight). As ``layernorm_bwd`` without mu and dbias."""
    call = RMSNORM_BWD.plan(meta(dy), meta(x), meta(rstd), meta(weight), zero_centered_gamma)
    dx, dweight = ffi(call, [dy, x, rstd, weight])
    return dx, dweight


def l2norm_fwd(x, eps: float, *, quantizer: Quantizer | None = None, scale=None, rng=None):
    """L2Normalization forward: (y, rstd, qt), y = fl(x · rstd), rstd = 1/sqrt(Σc x² + ε) per row."""
    x = jnp.asarray(x)
    call = L2NORM_FWD.plan(meta(x), eps, quantizer, meta(scale), meta(rng))
    arrays = {"x": x, "scale": scale, "rng": rng}
    outputs = ffi(call, [arrays[name] for name in call.inputs])
    return outputs[0], outputs[1], _quantized(call, outputs, 2, x, quantizer)


def l2norm_bwd(dy, x, rstd):
    """L2Normalization backward with y = fl(x · rstd) recomputed in fp32 (NUMERICS.md §11): dx."""
    call = L2NORM_BWD.plan(meta(dy), meta(x), meta(rstd))
    (dx,) = ffi(call, [dy, x, rstd])
    return dx

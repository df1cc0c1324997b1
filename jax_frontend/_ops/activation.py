"""twinengine.jax activation forward / backward / backward + bias gradient over XLA FFI calls
(no custom_vjp: the fusible ops call them explicitly). Shapes, checks and errors come from
core/ops/activation.py; a fused quantization is the quantize family's."""

from __future__ import annotations

import jax.numpy as jnp

from ...ops.activation import ACTIVATION_BWD, ACTIVATION_BWD_DBIAS, ACTIVATION_FWD, ACTIVATIONS, GATED_ACTIVATIONS
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._library import dtype_name, ffi, meta

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "activation_fwd", "activation_bwd", "activation_bwd_dbias"]


def _run(call, arrays: dict) -> list:
    return ffi(call, [arrays[name] for name in call.inputs])


def _quantized(specs, arrays, quantizer: Quantizer, shape, dtype: str) -> QuantizedTensor:
    """The QuantizedTensor of a fused call's quantize outputs (as ``quantize`` builds it)."""
    fields = {spec.name: array for spec, array in zip(specs, arrays)}
    return QuantizedTensor(**fields, quantizer=quantizer, shape=tuple(shape), dtype=dtype)


def activation_fwd(x, kind: str, *, limit: float = 7.0, alpha: float = 1.702, quantizer: Quantizer | None = None,
                   scale=None, rng=None):
    """y = act(x), optionally also quantized: returns (y, qt) (jit-, vmap-clean).

    Shapes: x (..., K); y (..., K), or (..., K/2) for the gated kinds (K even). qt has y's shape.
    Dtypes: x float32 / bfloat16 / float16; y x's dtype; scale / rng as ``quantize``.
    Numerics: NUMERICS.md §11; identical bytes to ``twinengine.pytorch``'s activation_fwd;
        qt is byte-identical to ``quantize(y, quantizer, scale=scale, rng=rng)``.
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    x = jnp.asarray(x)
    call = ACTIVATION_FWD.plan(meta(x), kind, limit, alpha, quantizer, meta(scale), meta(rng))
    y, *q = _run(call, {"x": x, "scale": scale, "rng": rng})
    if quantizer is None:
        return y, None
    return y, _quantized(call.outputs[1:], q, quantizer, y.shape, dtype_name(x.dtype))


def activation_bwd(dy, x, kind: str, *, limit: float = 7.0, alpha: float = 1.702):
    """dx = act'(x)·dy (gated kinds: da = act'(a)·dy·b, db = dy·act(a)).

    Shapes: dy the activation output's shape; dx x's. Dtypes: dy and dx x's dtype.
    Numerics: as ``twinengine.pytorch``'s activation_bwd (same kernel, same bytes).
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    (dx,) = _run(ACTIVATION_BWD.plan(meta(dy), meta(x), kind, limit, alpha), {"dy": dy, "x": x})
    return dx


def activation_bwd_dbias(dy, x, kind: str, *, limit: float = 7.0, alpha: float = 1.702, bias_dtype=None,
                         quantizer: Quantizer | None = None, scale=None, rng=None):
    """Activation gradient fused with the bias gradient (+ quantization of the gradient):
    returns (dx, dbias, qt).

    Shapes: dx x's shape; dbias (x.shape[-1],). Dtypes: dx x's; dbias `bias_dtype` (default x's).
    Numerics: dbias = Σc over the rows of the rounded dx; byte-identical to activation_bwd,
        bias_grad and quantize run one after the other, and to ``twinengine.pytorch``.
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    bias_name = dtype_name(bias_dtype if bias_dtype is not None else x.dtype)
    call = ACTIVATION_BWD_DBIAS.plan(meta(dy), meta(x), kind, limit, alpha, bias_name, quantizer, meta(scale),
                                     meta(rng))
    dx, dbias, *q = _run(call, {"dy": dy, "x": x, "scale": scale, "rng": rng})
    if quantizer is None:
        return dx, dbias, None
    return dx, dbias, _quantized(call.outputs[2:], q, quantizer, x.shape, dtype_name(x.dtype))

"""torch.ops.twinengine.activation_* and their Python wrappers (no autograd: the fusible ops
call the forward and backward explicitly). Shapes, checks and errors come from
core/ops/activation.py; a fused quantization is the quantize family's."""

from __future__ import annotations

import torch

from ...ops.activation import ACTIVATION_BWD, ACTIVATION_BWD_DBIAS, ACTIVATION_FWD, ACTIVATIONS, GATED_ACTIVATIONS
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._library import check_tensor_device, dtype_name, empty_outputs, launch, meta, fused_quantize_fallback, surface_errors, tensor_fallback, zeros_like_args

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "activation_fwd", "activation_bwd", "activation_bwd_dbias"]


def _run(call, arrays: dict, device: torch.device) -> list[torch.Tensor]:
    return launch(call, [arrays[name] for name in call.inputs], device)


@torch.library.custom_op("twinengine::activation_fwd", mutates_args=())
def _activation_fwd(x: torch.Tensor, kind: str, limit: float, alpha: float) -> torch.Tensor:
    (y,) = _run(ACTIVATION_FWD.cached_plan(meta(x), kind, limit, alpha), {"x": x}, x.device)
    return y


@_activation_fwd.register_fake
def _(x, kind, limit, alpha):
    (y,) = empty_outputs(ACTIVATION_FWD.infer(meta(x), kind, limit, alpha), x.device)
    return y


@torch.library.custom_op("twinengine::activation_fwd_quantize", mutates_args=())
def _activation_fwd_quantize(x: torch.Tensor, kind: str, limit: float, alpha: float, quantizer: Quantizer,
                             scale: torch.Tensor | None, rng: torch.Tensor | None) -> list[torch.Tensor]:
    call = ACTIVATION_FWD.cached_plan(meta(x), kind, limit, alpha, quantizer, meta(scale), meta(rng))
    return _run(call, {"x": x, "scale": scale, "rng": rng}, x.device)


@_activation_fwd_quantize.register_fake
def _(x, kind, limit, alpha, quantizer, scale, rng):
    return empty_outputs(ACTIVATION_FWD.infer(meta(x), kind, limit, alpha, quantizer, meta(scale), meta(rng)), x.device)


@torch.library.custom_op("twinengine::activation_bwd", mutates_args=())
def _activation_bwd(dy: torch.Tensor, x: torch.Tensor, kind: str, limit: float, alpha: float) -> torch.Tensor:
    (dx,) = _run(ACTIVATION_BWD.cached_plan(meta(dy), meta(x), kind, limit, alpha), {"dy": dy, "x": x}, x.device)
    return dx


@_activation_bwd.register_fake
def _(dy, x, kind, limit, alpha):
    (dx,) = empty_outputs(ACTIVATION_BWD.infer(meta(dy), meta(x), kind, limit, alpha), x.device)
    return dx


@torch.library.custom_op("twinengine::activation_bwd_dbias", mutates_args=())
def _activation_bwd_dbias(dy: torch.Tensor, x: torch.Tensor, kind: str, limit: float, alpha: float,
                          bias_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    call = ACTIVATION_BWD_DBIAS.cached_plan(meta(dy), meta(x), kind, limit, alpha, bias_dtype)
    dx, dbias = _run(call, {"dy": dy, "x": x}, x.device)
    return dx, dbias


@_activation_bwd_dbias.register_fake
def _(dy, x, kind, limit, alpha, bias_dtype):
    dx, dbias = empty_outputs(ACTIVATION_BWD_DBIAS.infer(meta(dy), meta(x), kind, limit, alpha, bias_dtype), x.device)
    return dx, dbias


@torch.library.custom_op("twinengine::activation_bwd_dbias_quantize", mutates_args=())
def _activation_bwd_dbias_quantize(dy: torch.Tensor, x: torch.Tensor, kind: str, limit: float, alpha: float,
                                   bias_dtype: str, quantizer: Quantizer, scale: torch.Tensor | None,
                                   rng: torch.Tensor | None) -> list[torch.Tensor]:
    call = ACTIVATION_BWD_DBIAS.cached_plan(meta(dy), meta(x), kind, limit, alpha, bias_dtype, quantizer, meta(scale),
                                     meta(rng))
    return _run(call, {"dy": dy, "x": x, "scale": scale, "rng": rng}, x.device)


@_activation_bwd_dbias_quantize.register_fake
def _(dy, x, kind, limit, alpha, bias_dtype, quantizer, scale, rng):
    call = ACTIVATION_BWD_DBIAS.infer(meta(dy), meta(x), kind, limit, alpha, bias_dtype, quantizer, meta(scale),
                                      meta(rng))
    return empty_outputs(call, x.device)


def _quantized(specs, arrays, quantizer: Quantizer, shape, dtype: str) -> QuantizedTensor:
    """The QuantizedTensor of a fused call's quantize outputs (as ``quantize`` builds it)."""
    fields = {spec.name: array for spec, array in zip(specs, arrays)}
    return QuantizedTensor(**fields, quantizer=quantizer, shape=tuple(shape), dtype=dtype)


def _check_devices(op: str, **tensors) -> None:
    for name, t in tensors.items():
        check_tensor_device(op, name, t)


@surface_errors(fused_quantize_fallback(1))
def activation_fwd(x: torch.Tensor, kind: str, *, limit: float = 7.0, alpha: float = 1.702,
                   quantizer: Quantizer | None = None, scale: torch.Tensor | None = None,
                   rng: torch.Tensor | None = None) -> tuple[torch.Tensor, QuantizedTensor | None]:
    """y = act(x), optionally also quantized: returns (y, qt).

    Shapes: x (..., K); y (..., K), or (..., K/2) for the gated kinds (K even). qt has y's shape.
    Dtypes: x float32 / bfloat16 / float16; y x's dtype; scale / rng as ``quantize``.
    Numerics: NUMERICS.md §11 — fp32 math with the portable exp / tanh, RNE to x's dtype; qt is
        byte-identical to ``quantize(y, quantizer, scale=scale, rng=rng)``. limit / alpha are
        ClampedSwiGLU's (rounded to fp32). Same bytes as ``twinengine.jax`` for the same input.
    Raises:
        TypeError / ValueError: unknown kind, odd last dimension of a gated kind, bad dtype,
        scale / rng without a quantizer, and the quantize family's checks on y.
    """
    _check_devices("activation_fwd", x=x, scale=scale, rng=rng)
    if quantizer is None:
        ACTIVATION_FWD.validate(meta(x), kind, limit, alpha, None, meta(scale), meta(rng))
        return torch.ops.twinengine.activation_fwd(x, kind, float(limit), float(alpha)), None
    call = ACTIVATION_FWD.plan(meta(x), kind, limit, alpha, quantizer, meta(scale), meta(rng))
    y, *q = torch.ops.twinengine.activation_fwd_quantize(x, kind, float(limit), float(alpha), quantizer, scale, rng)
    return y, _quantized(call.outputs[1:], q, quantizer, y.shape, dtype_name(x.dtype))


@surface_errors(zeros_like_args(1))
def activation_bwd(dy: torch.Tensor, x: torch.Tensor, kind: str, *, limit: float = 7.0,
                   alpha: float = 1.702) -> torch.Tensor:
    """dx = act'(x)·dy (gated kinds: da = act'(a)·dy·b, db = dy·act(a)).

    Shapes: dy the activation output's shape; dx x's shape.
    Dtypes: dy x's dtype; dx x's dtype.
    Numerics: NUMERICS.md §11 analytic derivatives in fp32; ReLU / SReLU give 0 at x <= 0, the
        ClampedSwiGLU clamps pass the gradient at their bounds and 0 outside; NaN propagates.
    Raises:
        TypeError / ValueError: as activation_fwd, and dy of the wrong shape or dtype.
    """
    _check_devices("activation_bwd", dy=dy, x=x)
    ACTIVATION_BWD.validate(meta(dy), meta(x), kind, limit, alpha)
    return torch.ops.twinengine.activation_bwd(dy, x, kind, float(limit), float(alpha))


@surface_errors(fused_quantize_fallback(2))
def activation_bwd_dbias(dy: torch.Tensor, x: torch.Tensor, kind: str, *, limit: float = 7.0, alpha: float = 1.702,
                         bias_dtype: torch.dtype | None = None, quantizer: Quantizer | None = None,
                         scale: torch.Tensor | None = None, rng: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, QuantizedTensor | None]:
    """Activation gradient fused with the bias gradient (+ quantization of the gradient):
    returns (dx, dbias, qt).

    Shapes: dx x's shape; dbias (x.shape[-1],); qt x's shape.
    Dtypes: dx x's dtype; dbias `bias_dtype` (default x's dtype).
    Numerics: dx as activation_bwd; dbias = Σc over the rows of the rounded dx, RNE to bias_dtype
        (= bias_grad(dx)); qt = quantize(dx) — byte-identical to the three separate ops.
    Raises:
        TypeError / ValueError: as activation_bwd, a bad bias_dtype, and the quantize checks on dx.
    """
    _check_devices("activation_bwd_dbias", dy=dy, x=x, scale=scale, rng=rng)
    bias_name = dtype_name(bias_dtype if bias_dtype is not None else x.dtype)
    call = ACTIVATION_BWD_DBIAS.plan(meta(dy), meta(x), kind, limit, alpha, bias_name, quantizer, meta(scale),
                                     meta(rng))
    if quantizer is None:
        dx, dbias = torch.ops.twinengine.activation_bwd_dbias(dy, x, kind, float(limit), float(alpha), bias_name)
        return dx, dbias, None
    dx, dbias, *q = torch.ops.twinengine.activation_bwd_dbias_quantize(dy, x, kind, float(limit), float(alpha),
                                                                       bias_name, quantizer, scale, rng)
    return dx, dbias, _quantized(call.outputs[2:], q, quantizer, x.shape, dtype_name(x.dtype))

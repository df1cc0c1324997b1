"""torch.ops.twinengine layernorm / rmsnorm / l2norm forward and backward (plus ``*_fwd_quantized``
forward ops with a fused quantization of y) and their Python wrappers. Shapes, checks and errors
come from core/ops/norm.py; no autograd is registered here (modules wrap these ops)."""

from __future__ import annotations

import torch

from ...ops.norm import (
    L2NORM_BWD,
    L2NORM_FWD,
    LAYERNORM_BWD,
    LAYERNORM_FWD,
    RMSNORM_BWD,
    RMSNORM_FWD,
    quantized_fields,
)
from ...ops.opdef import KernelCall, OpDef
from ...quantized_tensor import QuantizedTensor
from ...quantizers import Quantizer
from .._library import (check_tensor_device, dtype_name, empty_outputs, fused_quantize_fallback, launch, meta,
                        norm_fallback, plain_eager, surface_errors, tensor_fallback, tuple_fallback, zeros_like_args)


def _run(opdef: OpDef, arrays: dict[str, torch.Tensor | None], *args) -> list[torch.Tensor]:
    """plan (cached per static arguments) + launch: `arrays` by input name, `args` the plan's
    arguments after the arrays' metas."""
    call = opdef.cached_plan(*args)
    return launch(call, [arrays[name] for name in call.inputs], arrays["x"].device)


def _fake(opdef: OpDef, device: torch.device, *args) -> list[torch.Tensor]:
    return empty_outputs(opdef.infer(*args), device)


# ---- forward ops (no quantization) ------------------------------------------------------

@torch.library.custom_op("twinengine::layernorm_fwd", mutates_args=())
def _layernorm_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                   zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, mu, rstd = _run(LAYERNORM_FWD, {"x": x, "weight": weight, "bias": bias},
                       meta(x), meta(weight), meta(bias), eps, zero_centered_gamma)
    return y, mu, rstd


@_layernorm_fwd.register_fake
def _(x, weight, bias, eps, zero_centered_gamma):
    y, mu, rstd = _fake(LAYERNORM_FWD, x.device, meta(x), meta(weight), meta(bias), eps, zero_centered_gamma)
    return y, mu, rstd


@torch.library.custom_op("twinengine::rmsnorm_fwd", mutates_args=())
def _rmsnorm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    y, rstd = _run(RMSNORM_FWD, {"x": x, "weight": weight}, meta(x), meta(weight), eps, zero_centered_gamma)
    return y, rstd


@_rmsnorm_fwd.register_fake
def _(x, weight, eps, zero_centered_gamma):
    y, rstd = _fake(RMSNORM_FWD, x.device, meta(x), meta(weight), eps, zero_centered_gamma)
    return y, rstd


@torch.library.custom_op("twinengine::l2norm_fwd", mutates_args=())
def _l2norm_fwd(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    y, rstd = _run(L2NORM_FWD, {"x": x}, meta(x), eps)
    return y, rstd


@_l2norm_fwd.register_fake
def _(x, eps):
    y, rstd = _fake(L2NORM_FWD, x.device, meta(x), eps)
    return y, rstd


# ---- forward ops with a fused quantization of y -----------------------------------------
# Separate ops: the quantizer is an opaque value argument, which a schema cannot make optional.

def _layernorm_fwd_quantized_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                             zero_centered_gamma: bool, quantizer: Quantizer, scale: torch.Tensor | None,
                             rng: torch.Tensor | None) -> list[torch.Tensor]:
    return _run(LAYERNORM_FWD, {"x": x, "weight": weight, "bias": bias, "scale": scale, "rng": rng},
                meta(x), meta(weight), meta(bias), eps, zero_centered_gamma, quantizer, meta(scale), meta(rng))


# The custom op's impl, which the eager API calls directly (plain_eager): same bytes, no dispatcher.
_layernorm_fwd_quantized = torch.library.custom_op("twinengine::layernorm_fwd_quantized",
                                             mutates_args=())(_layernorm_fwd_quantized_impl)


@_layernorm_fwd_quantized.register_fake
def _(x, weight, bias, eps, zero_centered_gamma, quantizer, scale, rng):
    return _fake(LAYERNORM_FWD, x.device, meta(x), meta(weight), meta(bias), eps, zero_centered_gamma, quantizer,
                 meta(scale), meta(rng))


def _rmsnorm_fwd_quantized_impl(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool,
                           quantizer: Quantizer, scale: torch.Tensor | None,
                           rng: torch.Tensor | None) -> list[torch.Tensor]:
    return _run(RMSNORM_FWD, {"x": x, "weight": weight, "scale": scale, "rng": rng},
                meta(x), meta(weight), eps, zero_centered_gamma, quantizer, meta(scale), meta(rng))


# The custom op's impl, which the eager API calls directly (plain_eager): same bytes, no dispatcher.
_rmsnorm_fwd_quantized = torch.library.custom_op("twinengine::rmsnorm_fwd_quantized",
                                             mutates_args=())(_rmsnorm_fwd_quantized_impl)


@_rmsnorm_fwd_quantized.register_fake
def _(x, weight, eps, zero_centered_gamma, quantizer, scale, rng):
    return _fake(RMSNORM_FWD, x.device, meta(x), meta(weight), eps, zero_centered_gamma, quantizer, meta(scale),
                 meta(rng))


@torch.library.custom_op("twinengine::l2norm_fwd_quantized", mutates_args=())
def _l2norm_fwd_quantized(x: torch.Tensor, eps: float, quantizer: Quantizer, scale: torch.Tensor | None,
                          rng: torch.Tensor | None) -> list[torch.Tensor]:
    return _run(L2NORM_FWD, {"x": x, "scale": scale, "rng": rng}, meta(x), eps, quantizer, meta(scale), meta(rng))


@_l2norm_fwd_quantized.register_fake
def _(x, eps, quantizer, scale, rng):
    return _fake(L2NORM_FWD, x.device, meta(x), eps, quantizer, meta(scale), meta(rng))


# ---- backward ops -----------------------------------------------------------------------

@torch.library.custom_op("twinengine::layernorm_bwd", mutates_args=())
def _layernorm_bwd(dy: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor,
                   zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dweight, dbias = _run(LAYERNORM_BWD, {"dy": dy, "x": x, "mu": mu, "rstd": rstd, "weight": weight},
                              meta(dy), meta(x), meta(mu), meta(rstd), meta(weight), zero_centered_gamma)
    return dx, dweight, dbias


@_layernorm_bwd.register_fake
def _(dy, x, mu, rstd, weight, zero_centered_gamma):
    dx, dweight, dbias = _fake(LAYERNORM_BWD, x.device, meta(dy), meta(x), meta(mu), meta(rstd), meta(weight),
                               zero_centered_gamma)
    return dx, dweight, dbias


@torch.library.custom_op("twinengine::rmsnorm_bwd", mutates_args=())
def _rmsnorm_bwd(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor,
                 zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dweight = _run(RMSNORM_BWD, {"dy": dy, "x": x, "rstd": rstd, "weight": weight},
                       meta(dy), meta(x), meta(rstd), meta(weight), zero_centered_gamma)
    return dx, dweight


@_rmsnorm_bwd.register_fake
def _(dy, x, rstd, weight, zero_centered_gamma):
    dx, dweight = _fake(RMSNORM_BWD, x.device, meta(dy), meta(x), meta(rstd), meta(weight), zero_centered_gamma)
    return dx, dweight


@torch.library.custom_op("twinengine::l2norm_bwd", mutates_args=())
def _l2norm_bwd(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    (dx,) = _run(L2NORM_BWD, {"dy": dy, "x": x, "rstd": rstd}, meta(dy), meta(x), meta(rstd))
    return dx


@_l2norm_bwd.register_fake
def _(dy, x, rstd):
    (dx,) = _fake(L2NORM_BWD, x.device, meta(dy), meta(x), meta(rstd))
    return dx


# ---- Python API -------------------------------------------------------------------------

def _check_devices(op: str, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        check_tensor_device(op, name, t)


def _quantized(call: KernelCall, arrays: list[torch.Tensor], num_norm_outputs: int, x: torch.Tensor,
               quantizer: Quantizer) -> QuantizedTensor:
    """The QuantizedTensor of y, built as twinengine.pytorch.quantize builds it."""
    return QuantizedTensor(**quantized_fields(call, arrays, num_norm_outputs), quantizer=quantizer,
                           shape=tuple(x.shape), dtype=dtype_name(x.dtype))


@surface_errors(norm_fallback(3))
def layernorm_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, zero_centered_gamma: bool,
                  *, quantizer: Quantizer | None = None, scale: torch.Tensor | None = None,
                  rng: torch.Tensor | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, QuantizedTensor | None]:
    """LayerNorm forward, optionally with y quantized in the same kernel call.

    Shapes: x (..., K), K >= 1 (zero rows allowed without a quantizer); weight, bias (K,);
        y x's shape; mu, rstd x.shape[:-1] (one per row).
    Dtypes: x, weight, bias float32 / bfloat16 / float16, independently (widened exactly);
        y x's dtype; mu, rstd float32. scale / rng as ``twinengine.pytorch.quantize`` takes them.
    Numerics: NUMERICS.md §11 (canonical 32-lane sums, ε rounded to fp32, no FMA, y rounded RNE
        to x's dtype). ``qt`` (None without a quantizer) is byte-identical to quantizing the
        returned y with ``twinengine.pytorch.quantize``; same bytes as ``twinengine.jax``.
    Raises:
        TypeError / ValueError: from the shared core checks (dtypes, rank, normalized shape,
        eps < 0 or NaN, and quantize's own checks of the quantizer against y).
    """
    _check_devices("layernorm_fwd", x=x, weight=weight, bias=bias, scale=scale, rng=rng)
    if quantizer is None:
        LAYERNORM_FWD.validate(meta(x), meta(weight), meta(bias), eps, zero_centered_gamma, None, meta(scale),
                               meta(rng))
        y, mu, rstd = torch.ops.twinengine.layernorm_fwd(x, weight, bias, float(eps), zero_centered_gamma)
        return y, mu, rstd, None
    if plain_eager(x, weight, bias, scale, rng):  # no dispatcher, the plan cached
        call = LAYERNORM_FWD.cached_plan(meta(x), meta(weight), meta(bias), eps, zero_centered_gamma, quantizer,
                                         meta(scale), meta(rng))
        arrays = _layernorm_fwd_quantized_impl(x, weight, bias, float(eps), zero_centered_gamma, quantizer, scale, rng)
    else:
        call = LAYERNORM_FWD.plan(meta(x), meta(weight), meta(bias), eps, zero_centered_gamma, quantizer, meta(scale),
                                  meta(rng))
        arrays = torch.ops.twinengine.layernorm_fwd_quantized(x, weight, bias, float(eps), zero_centered_gamma,
                                                              quantizer, scale, rng)
    return arrays[0], arrays[1], arrays[2], _quantized(call, arrays, 3, x, quantizer)


@surface_errors(zeros_like_args(1, 4, 4))
def layernorm_bwd(dy: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor,
                  zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm backward from the saved mu and rstd.

    Shapes: dy, x (..., K); mu, rstd x.shape[:-1]; weight (K,). Returns dx (x's shape and dtype),
        dweight and dbias ((K,), weight's dtype).
    Numerics: NUMERICS.md §11 backward; dweight = Σc over rows of fl(dy·x̂), dbias = Σc over rows
        of dy (zeros for zero rows).
    Raises:
        TypeError / ValueError: from the shared core checks (dy/x shapes, mu/rstd shape and dtype).
    """
    _check_devices("layernorm_bwd", dy=dy, x=x, mu=mu, rstd=rstd, weight=weight)
    LAYERNORM_BWD.validate(meta(dy), meta(x), meta(mu), meta(rstd), meta(weight), zero_centered_gamma)
    return torch.ops.twinengine.layernorm_bwd(dy, x, mu, rstd, weight, zero_centered_gamma)


@surface_errors(norm_fallback(2))
def rmsnorm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool, *,
                quantizer: Quantizer | None = None, scale: torch.Tensor | None = None,
                rng: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, QuantizedTensor | None]:
    """RMSNorm forward, optionally with y quantized in the same kernel call.

    Shapes, Dtypes, Numerics, Raises: as ``layernorm_fwd`` without bias and mu.
    """
    _check_devices("rmsnorm_fwd", x=x, weight=weight, scale=scale, rng=rng)
    if quantizer is None:
        RMSNORM_FWD.validate(meta(x), meta(weight), eps, zero_centered_gamma, None, meta(scale), meta(rng))
        y, rstd = torch.ops.twinengine.rmsnorm_fwd(x, weight, float(eps), zero_centered_gamma)
        return y, rstd, None
    if plain_eager(x, weight, scale, rng):  # no dispatcher, the plan cached
        call = RMSNORM_FWD.cached_plan(meta(x), meta(weight), eps, zero_centered_gamma, quantizer, meta(scale),
                                       meta(rng))
        arrays = _rmsnorm_fwd_quantized_impl(x, weight, float(eps), zero_centered_gamma, quantizer, scale, rng)
    else:
        call = RMSNORM_FWD.plan(meta(x), meta(weight), eps, zero_centered_gamma, quantizer, meta(scale), meta(rng))
        arrays = torch.ops.twinengine.rmsnorm_fwd_quantized(x, weight, float(eps), zero_centered_gamma, quantizer,
                                                            scale, rng)
    return arrays[0], arrays[1], _quantized(call, arrays, 2, x, quantizer)


@surface_errors(zeros_like_args(1, 3))
def rmsnorm_bwd(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor,
                zero_centered_gamma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm backward from the saved rstd: (dx, dweight). As ``layernorm_bwd`` without mu and dbias."""
    _check_devices("rmsnorm_bwd", dy=dy, x=x, rstd=rstd, weight=weight)
    RMSNORM_BWD.validate(meta(dy), meta(x), meta(rstd), meta(weight), zero_centered_gamma)
    return torch.ops.twinengine.rmsnorm_bwd(dy, x, rstd, weight, zero_centered_gamma)


@surface_errors(fused_quantize_fallback(2))
def l2norm_fwd(x: torch.Tensor, eps: float, *, quantizer: Quantizer | None = None, scale: torch.Tensor | None = None,
               rng: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, QuantizedTensor | None]:
    """L2Normalization forward: y = fl(x · rstd), rstd = 1/sqrt(Σc x² + ε) per row.

    Shapes, Dtypes, Raises: as ``rmsnorm_fwd`` without weight. Numerics: NUMERICS.md §11.
    """
    _check_devices("l2norm_fwd", x=x, scale=scale, rng=rng)
    if quantizer is None:
        L2NORM_FWD.validate(meta(x), eps, None, meta(scale), meta(rng))
        y, rstd = torch.ops.twinengine.l2norm_fwd(x, float(eps))
        return y, rstd, None
    call = L2NORM_FWD.plan(meta(x), eps, quantizer, meta(scale), meta(rng))
    arrays = torch.ops.twinengine.l2norm_fwd_quantized(x, float(eps), quantizer, scale, rng)
    return arrays[0], arrays[1], _quantized(call, arrays, 2, x, quantizer)


@surface_errors(zeros_like_args(1))
def l2norm_bwd(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """L2Normalization backward: dx = fl(rstd · fl(dy − fl(y · Σc fl(dy·y)))) with y = fl(x · rstd)
    recomputed in fp32 (NUMERICS.md §11). Shapes: dy, x (..., K); rstd x.shape[:-1]; dx x's
    shape and dtype."""
    _check_devices("l2norm_bwd", dy=dy, x=x, rstd=rstd)
    L2NORM_BWD.validate(meta(dy), meta(x), meta(rstd))
    return torch.ops.twinengine.l2norm_bwd(dy, x, rstd)

"""The norm family: LayerNorm, RMSNorm and L2Normalization forward and backward, with an optional
quantization of the forward output fused into the same kernel call.

Each op is one :class:`OpDef`; both frontends call ``OP.plan(...)`` and never restate a shape, a
check or an error text. Numerics: NUMERICS.md §11. A fused quantization's checks, outputs and
attributes are quantize's own (``core/ops/quantize.py``), applied to y's shape and dtype.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import HIGH_PRECISION
from ..quantizers import Quantizer
from .opdef import KernelCall, OpDef, TensorSpec, dims, fail
from .quantize import QUANTIZE, ArrayMeta

# Quantize kernel op -> TweNormQuantizeMode (csrc/include/twinengine/norm.h) of the fused call.
_FUSED_QUANTIZE_MODES = {
    "quantize_fp8_current": 1,
    "quantize_fp8_delayed": 2,
    "quantize_mxfp8": 3,
    "quantize_fp8_block": 4,
    "quantize_nvfp4": 5,
}

_DTYPES_TEXT = "float32, bfloat16 or float16"


def _check_x(op: str, x: ArrayMeta, name: str = "x") -> None:
    if x.dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"{name} must be {_DTYPES_TEXT}, got {x.dtype}")
    if len(x.shape) < 1:
        fail(op, ValueError, f"{name} must have rank >= 1, got a 0-d array")
    if x.shape[-1] == 0:
        fail(op, ValueError, f"{name}'s last dimension (the normalized size) must be >= 1, got shape {dims(x.shape)}")


def _check_param(op: str, name: str, p: ArrayMeta, x: ArrayMeta) -> None:
    """A (K,) parameter of any high-precision dtype matching x's normalized (last) dimension."""
    if p is None:
        fail(op, TypeError, f"{name} is required")
    if p.dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"{name} must be {_DTYPES_TEXT}, got {p.dtype}")
    if len(p.shape) != 1 or p.shape[0] != x.shape[-1]:
        fail(op, ValueError, f"{name} has shape {dims(p.shape)}, but the normalized shape must match x's last "
             f"dimension: expected ({int(x.shape[-1])},)")


def _check_eps(op: str, eps: Any) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        # float(): a constant text under torch.compile(dynamic=True), where eps is symbolic
        fail(op, ValueError, f"eps must be a float >= 0 (not NaN), got {float(eps) if isinstance(eps, float) else eps!r}")


def _check_flag(op: str, zero_centered_gamma: Any) -> None:
    if not isinstance(zero_centered_gamma, bool):
        fail(op, TypeError, f"zero_centered_gamma must be a bool, got {type(zero_centered_gamma).__name__}")


def _check_row_stat(op: str, name: str, v: ArrayMeta, x: ArrayMeta) -> None:
    """mu / rstd: float32 with shape x.shape[:-1] (one per row)."""
    if v is None:
        fail(op, TypeError, f"{name} is required")
    if v.dtype != "float32":
        fail(op, TypeError, f"{name} must be float32, got {v.dtype}")
    if tuple(v.shape) != tuple(x.shape[:-1]):
        fail(op, ValueError, f"{name} must have shape x.shape[:-1] = {dims(x.shape[:-1])} (one value per row), "
             f"got {dims(v.shape)}")


def _check_dy(op: str, dy: ArrayMeta, x: ArrayMeta) -> None:
    if dy.dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"dy must be {_DTYPES_TEXT}, got {dy.dtype}")
    if tuple(dy.shape) != tuple(x.shape):
        fail(op, ValueError, f"dy must have x's shape {dims(x.shape)}, got {dims(dy.shape)}")


def _row_shape(x: ArrayMeta) -> tuple[Any, ...]:
    return tuple(x.shape[:-1])


def _fused_quantize(x: ArrayMeta, quantizer: Quantizer | None, scale: ArrayMeta | None, rng: ArrayMeta | None,
                    ) -> tuple[tuple[str, ...], tuple[TensorSpec, ...], tuple[tuple[str, int | float], ...]]:
    """(extra inputs, quantized outputs, attrs) of the fused quantization of y (x's shape and dtype)."""
    if quantizer is None:
        return (), (), (("quantize", 0),)
    q = QUANTIZE.infer(x, quantizer, scale, rng)
    extra_inputs = tuple(name for name in q.inputs if name != "x")
    return extra_inputs, q.outputs, (("quantize", _FUSED_QUANTIZE_MODES[q.op]),) + q.attrs


def _validate_fused_quantize(op: str, x: ArrayMeta, quantizer: Quantizer | None, scale: ArrayMeta | None,
                             rng: ArrayMeta | None) -> None:
    """Quantize's own checks on y's meta (same text as twinengine.quantize); without a quantizer,
    scale= and rng= are rejected."""
    if quantizer is None:
        if scale is not None or rng is not None:
            fail(op, ValueError, "scale= and rng= are only used with quantizer=")
        return
    QUANTIZE.validate(x, quantizer, scale, rng)


# ---- LayerNorm --------------------------------------------------------------------------

def _validate_layernorm_fwd(x: ArrayMeta, weight: ArrayMeta, bias: ArrayMeta, eps: float, zero_centered_gamma: bool,
                            quantizer: Quantizer | None = None, scale: ArrayMeta | None = None,
                            rng: ArrayMeta | None = None) -> None:
    op = "layernorm_fwd"
    _check_x(op, x)
    _check_param(op, "weight", weight, x)
    _check_param(op, "bias", bias, x)
    _check_eps(op, eps)
    _check_flag(op, zero_centered_gamma)
    _validate_fused_quantize(op, x, quantizer, scale, rng)


def _infer_layernorm_fwd(x: ArrayMeta, weight: ArrayMeta, bias: ArrayMeta, eps: float, zero_centered_gamma: bool,
                         quantizer: Quantizer | None = None, scale: ArrayMeta | None = None,
                         rng: ArrayMeta | None = None) -> KernelCall:
    extra, q_outputs, q_attrs = _fused_quantize(x, quantizer, scale, rng)
    rows = _row_shape(x)
    return KernelCall(
        op="layernorm_fwd",
        inputs=("x", "weight", "bias") + extra,
        outputs=(TensorSpec("y", tuple(x.shape), x.dtype), TensorSpec("mu", rows, "float32"),
                 TensorSpec("rstd", rows, "float32")) + q_outputs,
        attrs=(("eps", float(eps)), ("zero_centered_gamma", int(zero_centered_gamma))) + q_attrs,
    )


LAYERNORM_FWD = OpDef(
    name="layernorm_fwd",
    args=("x", "weight", "bias", "scale", "rng"),
    attrs=("eps", "zero_centered_gamma", "quantizer"),
    validate=_validate_layernorm_fwd,
    infer=_infer_layernorm_fwd,
)
"""layernorm_fwd(x, weight, bias, eps, zero_centered_gamma, quantizer=None, scale=None, rng=None)
-> y, mu, rstd (, quantized y fields in quantize's order).

Shapes: x (..., K), K >= 1; weight, bias (K,); y x's shape; mu, rstd x.shape[:-1].
Dtypes: x, weight, bias float32 / bfloat16 / float16 (independently); y x's dtype; mu, rstd float32.
"""


def _validate_layernorm_bwd(dy: ArrayMeta, x: ArrayMeta, mu: ArrayMeta, rstd: ArrayMeta, weight: ArrayMeta,
                            zero_centered_gamma: bool) -> None:
    op = "layernorm_bwd"
    _check_x(op, x)
    _check_dy(op, dy, x)
    _check_row_stat(op, "mu", mu, x)
    _check_row_stat(op, "rstd", rstd, x)
    _check_param(op, "weight", weight, x)
    _check_flag(op, zero_centered_gamma)


def _infer_layernorm_bwd(dy: ArrayMeta, x: ArrayMeta, mu: ArrayMeta, rstd: ArrayMeta, weight: ArrayMeta,
                         zero_centered_gamma: bool) -> KernelCall:
    return KernelCall(
        op="layernorm_bwd",
        inputs=("dy", "x", "mu", "rstd", "weight"),
        outputs=(TensorSpec("dx", tuple(x.shape), x.dtype), TensorSpec("dweight", tuple(weight.shape), weight.dtype),
                 TensorSpec("dbias", tuple(weight.shape), weight.dtype)),
        attrs=(("zero_centered_gamma", int(zero_centered_gamma)),),
    )


LAYERNORM_BWD = OpDef(
    name="layernorm_bwd",
    args=("dy", "x", "mu", "rstd", "weight"),
    attrs=("zero_centered_gamma",),
    validate=_validate_layernorm_bwd,
    infer=_infer_layernorm_bwd,
)
"""layernorm_bwd(dy, x, mu, rstd, weight, zero_centered_gamma) -> dx, dweight, dbias.

Shapes: dy, x (..., K); mu, rstd x.shape[:-1]; weight (K,). Dtypes: dx x's; dweight, dbias weight's.
"""


# ---- RMSNorm ----------------------------------------------------------------------------

def _validate_rmsnorm_fwd(x: ArrayMeta, weight: ArrayMeta, eps: float, zero_centered_gamma: bool,
                          quantizer: Quantizer | None = None, scale: ArrayMeta | None = None,
                          rng: ArrayMeta | None = None) -> None:
    op = "rmsnorm_fwd"
    _check_x(op, x)
    _check_param(op, "weight", weight, x)
    _check_eps(op, eps)
    _check_flag(op, zero_centered_gamma)
    _validate_fused_quantize(op, x, quantizer, scale, rng)


def _infer_rmsnorm_fwd(x: ArrayMeta, weight: ArrayMeta, eps: float, zero_centered_gamma: bool,
                       quantizer: Quantizer | None = None, scale: ArrayMeta | None = None,
                       rng: ArrayMeta | None = None) -> KernelCall:
    extra, q_outputs, q_attrs = _fused_quantize(x, quantizer, scale, rng)
    return KernelCall(
        op="rmsnorm_fwd",
        inputs=("x", "weight") + extra,
        outputs=(TensorSpec("y", tuple(x.shape), x.dtype), TensorSpec("rstd", _row_shape(x), "float32")) + q_outputs,
        attrs=(("eps", float(eps)), ("zero_centered_gamma", int(zero_centered_gamma))) + q_attrs,
    )


RMSNORM_FWD = OpDef(
    name="rmsnorm_fwd",
    args=("x", "weight", "scale", "rng"),
    attrs=("eps", "zero_centered_gamma", "quantizer"),
    validate=_validate_rmsnorm_fwd,
    infer=_infer_rmsnorm_fwd,
)
"""rmsnorm_fwd(x, weight, eps, zero_centered_gamma, quantizer=None, scale=None, rng=None)
-> y, rstd (, quantized y fields). Shapes and dtypes as LAYERNORM_FWD without bias and mu."""


def _validate_rmsnorm_bwd(dy: ArrayMeta, x: ArrayMeta, rstd: ArrayMeta, weight: ArrayMeta,
                          zero_centered_gamma: bool) -> None:
    op = "rmsnorm_bwd"
    _check_x(op, x)
    _check_dy(op, dy, x)
    _check_row_stat(op, "rstd", rstd, x)
    _check_param(op, "weight", weight, x)
    _check_flag(op, zero_centered_gamma)


def _infer_rmsnorm_bwd(dy: ArrayMeta, x: ArrayMeta, rstd: ArrayMeta, weight: ArrayMeta,
                       zero_centered_gamma: bool) -> KernelCall:
    return KernelCall(
        op="rmsnorm_bwd",
        inputs=("dy", "x", "rstd", "weight"),
        outputs=(TensorSpec("dx", tuple(x.shape), x.dtype), TensorSpec("dweight", tuple(weight.shape), weight.dtype)),
        attrs=(("zero_centered_gamma", int(zero_centered_gamma)),),
    )


RMSNORM_BWD = OpDef(
    name="rmsnorm_bwd",
    args=("dy", "x", "rstd", "weight"),
    attrs=("zero_centered_gamma",),
    validate=_validate_rmsnorm_bwd,
    infer=_infer_rmsnorm_bwd,
)
"""rmsnorm_bwd(dy, x, rstd, weight, zero_centered_gamma) -> dx, dweight."""


# ---- L2Normalization --------------------------------------------------------------------

def _validate_l2norm_fwd(x: ArrayMeta, eps: float, quantizer: Quantizer | None = None,
                         scale: ArrayMeta | None = None, rng: ArrayMeta | None = None) -> None:
    op = "l2norm_fwd"
    _check_x(op, x)
    _check_eps(op, eps)
    _validate_fused_quantize(op, x, quantizer, scale, rng)


def _infer_l2norm_fwd(x: ArrayMeta, eps: float, quantizer: Quantizer | None = None, scale: ArrayMeta | None = None,
                      rng: ArrayMeta | None = None) -> KernelCall:
    extra, q_outputs, q_attrs = _fused_quantize(x, quantizer, scale, rng)
    return KernelCall(
        op="l2norm_fwd",
        inputs=("x",) + extra,
        outputs=(TensorSpec("y", tuple(x.shape), x.dtype), TensorSpec("rstd", _row_shape(x), "float32")) + q_outputs,
        attrs=(("eps", float(eps)),) + q_attrs,
    )


L2NORM_FWD = OpDef(
    name="l2norm_fwd",
    args=("x", "scale", "rng"),
    attrs=("eps", "quantizer"),
    validate=_validate_l2norm_fwd,
    infer=_infer_l2norm_fwd,
)
"""l2norm_fwd(x, eps, quantizer=None, scale=None, rng=None) -> y, rstd (, quantized y fields)."""


def _validate_l2norm_bwd(dy: ArrayMeta, x: ArrayMeta, rstd: ArrayMeta) -> None:
    op = "l2norm_bwd"
    _check_x(op, x)
    _check_dy(op, dy, x)
    _check_row_stat(op, "rstd", rstd, x)


def _infer_l2norm_bwd(dy: ArrayMeta, x: ArrayMeta, rstd: ArrayMeta) -> KernelCall:
    return KernelCall(op="l2norm_bwd", inputs=("dy", "x", "rstd"),
                      outputs=(TensorSpec("dx", tuple(x.shape), x.dtype),), attrs=())


L2NORM_BWD = OpDef(
    name="l2norm_bwd",
    args=("dy", "x", "rstd"),
    attrs=(),
    validate=_validate_l2norm_bwd,
    infer=_infer_l2norm_bwd,
)
"""l2norm_bwd(dy, x, rstd) -> dx (y = fl(x · rstd) recomputed in fp32)."""


def quantized_fields(call: KernelCall, arrays: list[Any], num_norm_outputs: int) -> dict[str, Any]:
    """The QuantizedTensor fields among a forward call's outputs (those after the norm's own)."""
    return {spec.name: array for spec, array in zip(call.outputs[num_norm_outputs:], arrays[num_norm_outputs:])}


__all__ = ["LAYERNORM_FWD", "LAYERNORM_BWD", "RMSNORM_FWD", "RMSNORM_BWD", "L2NORM_FWD", "L2NORM_BWD",
           "quantized_fields"]

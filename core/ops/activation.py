"""The activation family: GELU, QGELU, ReLU, SReLU, SiLU, their gated forms and ClampedSwiGLU
(NUMERICS.md §11), forward, backward and the backward fusion with the bias gradient, each
optionally followed by a quantization of its output.

Each op is one :class:`OpDef`; both frontends call ``OP.plan(...)``. A fused quantization
reuses the quantize family's OpDef (same checks, output specs and attributes): it is exactly
"activation, then ``quantize`` of the result" (NUMERICS.md §11 "Fused … quantize").
"""

from __future__ import annotations

from typing import Any

from ..dtypes import HIGH_PRECISION
from ..quantizers import Quantizer
from .opdef import KernelCall, OpDef, TensorSpec, dims, fail
from .quantize import QUANTIZE, SCALING_MODE_CODES, ArrayMeta

ACTIVATION_KINDS: tuple[tuple[str, bool], ...] = (
    ("gelu", False),
    ("geglu", True),
    ("qgelu", False),
    ("qgeglu", True),
    ("relu", False),
    ("reglu", True),
    ("srelu", False),
    ("sreglu", True),
    ("silu", False),
    ("swiglu", True),
    ("clamped_swiglu", True),
)
"""(kind, gated) of every activation, in the order of the kernel's Activation enum
(csrc/include/twinengine/numerics.h). Gated kinds split the last dimension into [a | b] and
give act(a)·b (ClampedSwiGLU: a'·σ(alpha·a')·(b' + 1))."""

ACTIVATIONS: tuple[str, ...] = tuple(name for name, _ in ACTIVATION_KINDS)
"""Names of every activation kind."""

GATED_ACTIVATIONS: frozenset[str] = frozenset(name for name, gated in ACTIVATION_KINDS if gated)
"""The gated kinds (output last dimension K/2)."""

KIND_CODES = {name: code for code, (name, _) in enumerate(ACTIVATION_KINDS)}


def _check_kind(op: str, kind: Any) -> None:
    if kind not in KIND_CODES:
        fail(op, ValueError, f"unknown activation {kind!r}; expected one of {', '.join(ACTIVATIONS)}")


def _check_float(op: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(op, TypeError, f"{name} must be a real number, got {value!r}")
    if value != value:  # NaN (math.isnan does not trace under torch.compile)
        fail(op, ValueError, f"{name} must not be NaN")


def _check_x(op: str, x: ArrayMeta, kind: str, name: str = "x") -> None:
    if x.dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if len(x.shape) < 1:
        fail(op, ValueError, f"{name} must have rank >= 1, got a 0-d array")
    if kind in GATED_ACTIVATIONS and x.shape[-1] % 2 != 0:
        fail(op, ValueError, f"gated activation {kind!r} splits the last dimension into two halves, "
             f"so it must be even; got {name} of shape {dims(x.shape)}")


def _check_params(op: str, kind: Any, limit: Any, alpha: Any) -> None:
    _check_kind(op, kind)
    _check_float(op, "limit", limit)
    _check_float(op, "alpha", alpha)
    if limit < 0:
        fail(op, ValueError, f"limit must be >= 0, got {limit!r}")


def output_shape(x_shape: tuple[Any, ...], kind: str) -> tuple[Any, ...]:
    """Shape of act(x): x's, with the last dimension halved for gated kinds."""
    if kind in GATED_ACTIVATIONS:
        return tuple(x_shape[:-1]) + (x_shape[-1] // 2,)
    return tuple(x_shape)


def _act_attrs(kind: str, limit: float, alpha: float) -> tuple[tuple[str, int | float], ...]:
    return (("kind", KIND_CODES[kind]), ("limit", float(limit)), ("alpha", float(alpha)))


def _check_quantize_args(op: str, out: ArrayMeta, quantizer: Quantizer | None, scale: ArrayMeta | None,
                         rng: ArrayMeta | None, what: str) -> None:
    """No quantizer: scale / rng must be absent; else the quantize family's checks on `out`."""
    if quantizer is None:
        if scale is not None or rng is not None:
            fail(op, ValueError, "scale= and rng= belong to the fused quantization and need quantizer=")
        return
    if not isinstance(quantizer, Quantizer):
        fail(op, TypeError, f"quantizer must be a twinengine Quantizer or None, got {type(quantizer).__name__}")
    if len(out.shape) >= 1 and any(d == 0 for d in out.shape):
        fail(op, ValueError, f"cannot quantize an empty {what} (shape {dims(out.shape)}); pass quantizer=None")
    QUANTIZE.validate(out, quantizer, scale, rng)


def _fused(call: KernelCall, base_inputs: tuple[str, ...], out: ArrayMeta, quantizer: Quantizer,
           scale: ArrayMeta | None, rng: ArrayMeta | None) -> KernelCall:
    """`call` followed by the quantize kernel on its first output: inputs gain the quantize
    inputs after the data (scale, rng), outputs and attrs the quantize ones."""
    qcall = QUANTIZE.infer(out, quantizer, scale, rng)
    return KernelCall(op=call.op + "_quantize", inputs=base_inputs + qcall.inputs[1:],
                      outputs=call.outputs + qcall.outputs,
                      attrs=call.attrs + qcall.attrs + (("scaling_mode", SCALING_MODE_CODES[quantizer.scaling_mode]),))


# ---- forward ----------------------------------------------------------------------------

def _validate_fwd(x: ArrayMeta, kind: str, limit: float = 7.0, alpha: float = 1.702,
                  quantizer: Quantizer | None = None, scale: ArrayMeta | None = None,
                  rng: ArrayMeta | None = None) -> None:
    op = "activation_fwd"
    _check_params(op, kind, limit, alpha)
    _check_x(op, x, kind)
    _check_quantize_args(op, ArrayMeta(output_shape(x.shape, kind), x.dtype), quantizer, scale, rng, "activation output")


def _infer_fwd(x: ArrayMeta, kind: str, limit: float = 7.0, alpha: float = 1.702,
               quantizer: Quantizer | None = None, scale: ArrayMeta | None = None,
               rng: ArrayMeta | None = None) -> KernelCall:
    y = ArrayMeta(output_shape(x.shape, kind), x.dtype)
    call = KernelCall("activation_fwd", ("x",), (TensorSpec("y", y.shape, y.dtype),), _act_attrs(kind, limit, alpha))
    return call if quantizer is None else _fused(call, ("x",), y, quantizer, scale, rng)


ACTIVATION_FWD = OpDef(
    name="activation_fwd",
    args=("x", "scale", "rng"),
    attrs=("kind", "limit", "alpha", "quantizer"),
    validate=_validate_fwd,
    infer=_infer_fwd,
)
"""activation_fwd(x, kind, limit, alpha, quantizer=None, scale=None, rng=None) -> y [+ quantized y].

Shapes: x (..., K); y (..., K), or (..., K/2) for gated kinds (K even).
Dtypes: x float32 / bfloat16 / float16; y x's dtype. Quantized outputs as ``quantize``.
Numerics: NUMERICS.md §11; the quantization reads y rounded to x's dtype.
"""


# ---- backward ---------------------------------------------------------------------------

def _check_dy(op: str, dy: ArrayMeta, x: ArrayMeta, kind: str) -> None:
    expect = output_shape(x.shape, kind)
    if dy.dtype != x.dtype:
        fail(op, TypeError, f"dy must have the dtype of x ({x.dtype}), got {dy.dtype}")
    if tuple(dy.shape) != tuple(expect):
        fail(op, ValueError, f"dy must have the shape of the activation output {dims(expect)} "
             f"(x of shape {dims(x.shape)}, kind {kind!r}), got {dims(dy.shape)}")


def _validate_bwd(dy: ArrayMeta, x: ArrayMeta, kind: str, limit: float = 7.0, alpha: float = 1.702) -> None:
    op = "activation_bwd"
    _check_params(op, kind, limit, alpha)
    _check_x(op, x, kind)
    _check_dy(op, dy, x, kind)


def _infer_bwd(dy: ArrayMeta, x: ArrayMeta, kind: str, limit: float = 7.0, alpha: float = 1.702) -> KernelCall:
    return KernelCall("activation_bwd", ("dy", "x"), (TensorSpec("dx", tuple(x.shape), x.dtype),),
                      _act_attrs(kind, limit, alpha))


ACTIVATION_BWD = OpDef(
    name="activation_bwd",
    args=("dy", "x"),
    attrs=("kind", "limit", "alpha"),
    validate=_validate_bwd,
    infer=_infer_bwd,
)
"""activation_bwd(dy, x, kind, limit, alpha) -> dx.

Shapes: dy the activation output's shape; dx x's. Dtypes: dy must be x's dtype; dx x's.
Numerics: analytic derivatives in fp32 (NUMERICS.md §11), rounded to x's dtype.
"""


def _validate_bwd_dbias(dy: ArrayMeta, x: ArrayMeta, kind: str, limit: float = 7.0, alpha: float = 1.702,
                        bias_dtype: str | None = None, quantizer: Quantizer | None = None,
                        scale: ArrayMeta | None = None, rng: ArrayMeta | None = None) -> None:
    op = "activation_bwd_dbias"
    _check_params(op, kind, limit, alpha)
    _check_x(op, x, kind)
    _check_dy(op, dy, x, kind)
    if bias_dtype is not None and bias_dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"bias_dtype must be float32, bfloat16 or float16, got {bias_dtype}")
    _check_quantize_args(op, ArrayMeta(tuple(x.shape), x.dtype), quantizer, scale, rng, "gradient")


def _infer_bwd_dbias(dy: ArrayMeta, x: ArrayMeta, kind: str, limit: float = 7.0, alpha: float = 1.702,
                     bias_dtype: str | None = None, quantizer: Quantizer | None = None,
                     scale: ArrayMeta | None = None, rng: ArrayMeta | None = None) -> KernelCall:
    dx = ArrayMeta(tuple(x.shape), x.dtype)
    outputs = (TensorSpec("dx", dx.shape, dx.dtype), TensorSpec("dbias", (x.shape[-1],), bias_dtype or x.dtype))
    call = KernelCall("activation_bwd_dbias", ("dy", "x"), outputs, _act_attrs(kind, limit, alpha))
    return call if quantizer is None else _fused(call, ("dy", "x"), dx, quantizer, scale, rng)


ACTIVATION_BWD_DBIAS = OpDef(
    name="activation_bwd_dbias",
    args=("dy", "x", "scale", "rng"),
    attrs=("kind", "limit", "alpha", "bias_dtype", "quantizer"),
    validate=_validate_bwd_dbias,
    infer=_infer_bwd_dbias,
)
"""activation_bwd_dbias(dy, x, kind, limit, alpha, bias_dtype, quantizer=None, scale=None, rng=None)
-> dx, dbias [+ quantized dx].

Shapes: dx x's shape; dbias (K,) with K = x.shape[-1].
Dtypes: dx x's dtype; dbias bias_dtype (default x's dtype).
Numerics: dx as activation_bwd; dbias = Σc over rows of dx (its rounded values, widened), then
    RNE to bias_dtype; the quantization reads the rounded dx — byte-identical to
    activation_bwd, bias_grad and quantize run one after the other.
"""

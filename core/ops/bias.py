"""The bias family (NUMERICS.md §11): bias add, residual add, constant scale and the bias
gradient (the canonical 32-lane column sum).

Each op is one :class:`OpDef`; both frontends call ``OP.plan(...)``.
"""

from __future__ import annotations

from ..dtypes import HIGH_PRECISION
from .opdef import KernelCall, OpDef, TensorSpec, dims, fail
from .quantize import ArrayMeta


def _check_data(op: str, name: str, x: ArrayMeta) -> None:
    if x.dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if len(x.shape) < 1:
        fail(op, ValueError, f"{name} must have rank >= 1, got a 0-d array")


def _validate_bias_add(x: ArrayMeta, bias: ArrayMeta) -> None:
    op = "bias_add"
    _check_data(op, "x", x)
    _check_data(op, "bias", bias)
    if len(bias.shape) != 1 or bias.shape[0] != x.shape[-1]:
        fail(op, ValueError, f"bias must have shape ({x.shape[-1]},) (the last dimension of x, shape "
             f"{dims(x.shape)}), got {dims(bias.shape)}")


def _infer_bias_add(x: ArrayMeta, bias: ArrayMeta) -> KernelCall:
    return KernelCall("bias_add", ("x", "bias"), (TensorSpec("y", tuple(x.shape), x.dtype),), ())


BIAS_ADD = OpDef(name="bias_add", args=("x", "bias"), attrs=(), validate=_validate_bias_add, infer=_infer_bias_add)
"""bias_add(x, bias) -> y = fl(x + bias) broadcast over rows, RNE to x's dtype.

Shapes: x (..., K), bias (K,). Dtypes: float32 / bfloat16 / float16 each (widened exactly).
"""


def _validate_add(x: ArrayMeta, y: ArrayMeta) -> None:
    op = "add"
    _check_data(op, "x", x)
    _check_data(op, "y", y)
    if tuple(x.shape) != tuple(y.shape):
        fail(op, ValueError, f"x and y must have the same shape, got {dims(x.shape)} and {dims(y.shape)}")


def _infer_add(x: ArrayMeta, y: ArrayMeta) -> KernelCall:
    return KernelCall("add", ("x", "y"), (TensorSpec("z", tuple(x.shape), x.dtype),), ())


ADD = OpDef(name="add", args=("x", "y"), attrs=(), validate=_validate_add, infer=_infer_add)
"""add(x, y) -> z = fl(x + y), RNE to x's dtype. Shapes: equal. Dtypes: any high precision each."""


def _validate_scale(x: ArrayMeta, c: float) -> None:
    op = "scale"
    _check_data(op, "x", x)
    if isinstance(c, bool) or not isinstance(c, (int, float)):
        fail(op, TypeError, f"c must be a real number, got {c!r}")


def _infer_scale(x: ArrayMeta, c: float) -> KernelCall:
    return KernelCall("scale", ("x",), (TensorSpec("y", tuple(x.shape), x.dtype),), (("c", float(c)),))


SCALE = OpDef(name="scale", args=("x",), attrs=("c",), validate=_validate_scale, infer=_infer_scale)
"""scale(x, c) -> y = fl(x · c) with c rounded to fp32 first, RNE to x's dtype."""


def _validate_bias_grad(dy: ArrayMeta, dtype: str) -> None:
    op = "bias_grad"
    _check_data(op, "dy", dy)
    if dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"dtype must be float32, bfloat16 or float16, got {dtype}")


def _infer_bias_grad(dy: ArrayMeta, dtype: str) -> KernelCall:
    return KernelCall("bias_grad", ("dy",), (TensorSpec("dbias", (dy.shape[-1],), dtype),), ())


BIAS_GRAD = OpDef(name="bias_grad", args=("dy",), attrs=("dtype",), validate=_validate_bias_grad,
                  infer=_infer_bias_grad)
"""bias_grad(dy, dtype) -> db = Σc over the rows of dy (NUMERICS.md §11), RNE to `dtype`.

Shapes: dy (..., K) flattened to (R, K); db (K,) (zeros for R = 0).
"""


def _validate_bias_grad_grouped(dy: ArrayMeta, m_splits: ArrayMeta, dtype: str) -> None:
    op = "bias_grad_grouped"
    _check_data(op, "dy", dy)
    if m_splits.dtype != "int32" or len(m_splits.shape) != 1:
        fail(op, TypeError, f"m_splits must be a 1-D int32 array, got {m_splits.dtype} of shape {dims(m_splits.shape)}")
    if dtype not in HIGH_PRECISION:
        fail(op, TypeError, f"dtype must be float32, bfloat16 or float16, got {dtype}")


def _infer_bias_grad_grouped(dy: ArrayMeta, m_splits: ArrayMeta, dtype: str) -> KernelCall:
    return KernelCall("bias_grad_grouped", ("dy", "m_splits"),
                      (TensorSpec("dbias", (m_splits.shape[0], dy.shape[-1]), dtype),), ())


BIAS_GRAD_GROUPED = OpDef(name="bias_grad_grouped", args=("dy", "m_splits"), attrs=("dtype",),
                          validate=_validate_bias_grad_grouped, infer=_infer_bias_grad_grouped)
"""bias_grad_grouped(dy, m_splits, dtype) -> db (G, K): row g is Σc over the rows of group g (the
consecutive row blocks of sizes max(m_splits[g], 0), clipped to R; lanes by the row index within the
group) — exactly bias_grad of each group's rows, as per-expert Linears compute it (NUMERICS.md §11).
"""

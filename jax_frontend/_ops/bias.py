"""twinengine.jax bias_add / add / scale / bias_grad over XLA FFI calls (no custom_vjp).
Shapes, checks and errors come from core/ops/bias.py."""

from __future__ import annotations

from ...ops.bias import ADD, BIAS_ADD, BIAS_GRAD, BIAS_GRAD_GROUPED, SCALE
from .._library import dtype_name, ffi, meta

__all__ = ["bias_add", "add", "scale", "bias_grad"]


def bias_add(x, bias):
    """y = fl(x + bias), bias (K,) broadcast over the rows, RNE to x's dtype (NUMERICS.md §11).

    Raises:
        TypeError / ValueError: bad dtypes, bias length != x.shape[-1].
    """
    (y,) = ffi(BIAS_ADD.plan(meta(x), meta(bias)), [x, bias])
    return y


def add(x, y):
    """z = fl(x + y) (residual add), RNE to x's dtype.

    Raises:
        TypeError / ValueError: bad dtypes, different shapes.
    """
    (z,) = ffi(ADD.plan(meta(x), meta(y)), [x, y])
    return z


def scale(x, c: float):
    """y = fl(x · c), c rounded to fp32 first, RNE to x's dtype (ConstantScale).

    Raises:
        TypeError: bad dtype, non-numeric c.
    """
    (y,) = ffi(SCALE.plan(meta(x), c), [x])
    return y


def bias_grad(dy, dtype):
    """db = Σc over the rows of dy (NUMERICS.md §11), RNE to `dtype`; shape (K,), zeros for R = 0.

    Raises:
        TypeError: bad dtypes.
    """
    (db,) = ffi(BIAS_GRAD.plan(meta(dy), dtype_name(dtype)), [dy])
    return db


def bias_grad_grouped(dy, m_splits, dtype):
    """db (G, K): row g = Σc over the rows of group g of dy (as twinengine.pytorch's, same kernel)."""
    (db,) = ffi(BIAS_GRAD_GROUPED.plan(meta(dy), meta(m_splits), dtype_name(dtype)), [dy, m_splits])
    return db

"""twinengine.jax bias_add / add / scale / bias_grad over XLA FFI calls (no custom_vjp).
Shapes, checks and errors come from core/ops/bias.py."""

from __future__ import annotations

from ...ops.bias import ADD, BIAS_ADD, BIAS_GRAD, BIAS_GRAD_GROUPED, SCALE
from .._library import dtype_name, ffi, jax_dtype, meta
from ..partitioning import Rule, factor_sizes, partitioned, plain_dims

__all__ = ["bias_add", "add", "scale", "bias_grad"]


def bias_add(x, bias):
    """y = fl(x + bias), bias (K,) broadcast over the rows, RNE to x's dtype (NUMERICS.md §11).
    Sharded jit: elementwise, every dimension local (so are add and scale).

    Raises:
        TypeError / ValueError: bad dtypes, bias length != x.shape[-1].
    """
    BIAS_ADD.plan(meta(x), meta(bias))  # the shared checks, before the rule reads the shapes
    dims = plain_dims("x", x.shape)
    (y,) = _elementwise_op(_rule("bias_add", x, (("x", dims), ("bias", dims[-1:]))), ("bias_add", None), x, bias)
    return y


def _rule(op: str, x, inputs) -> Rule:
    """Elementwise: every dimension of x shards locally."""
    dims = plain_dims("x", x.shape)
    return Rule(op, inputs, (dims,), factor_sizes([(dims, x.shape)]), local=frozenset(f for d in dims for f in d))


def _elementwise_shard(static, sizes, *arrays):
    op, c = static
    metas = [meta(a) for a in arrays]
    call = {"bias_add": BIAS_ADD, "add": ADD}[op].plan(*metas) if c is None else SCALE.plan(*metas, c)
    return ffi(call, list(arrays))


_elementwise_op = partitioned(_elementwise_shard)


def add(x, y):
    """z = fl(x + y) (residual add), RNE to x's dtype.

    Raises:
        TypeError / ValueError: bad dtypes, different shapes.
    """
    dims = plain_dims("x", x.shape)
    ADD.plan(meta(x), meta(y))
    (z,) = _elementwise_op(_rule("add", x, (("x", dims), ("y", dims))), ("add", None), x, y)
    return z


def scale(x, c: float):
    """y = fl(x · c), c rounded to fp32 first, RNE to x's dtype (ConstantScale).

    Raises:
        TypeError: bad dtype, non-numeric c.
    """
    SCALE.plan(meta(x), c)
    (y,) = _elementwise_op(_rule("scale", x, (("x", plain_dims("x", x.shape)),)), ("scale", c), x)
    return y


def bias_grad(dy, dtype):
    """db = Σc over the rows of dy (NUMERICS.md §11), RNE to `dtype`; shape (K,), zeros for R = 0.
    Sharded jit: K local; sharded rows give fp32 partial sums, psum-ed, then rounded (the
    unsharded db within another fp32 summation order's tolerance, NUMERICS.md §12).

    Raises:
        TypeError: bad dtypes.
    """
    BIAS_GRAD.plan(meta(dy), dtype_name(dtype))
    dims = plain_dims("x", dy.shape)
    rows = frozenset(f for d in dims[:-1] for f in d)
    rule = Rule("bias_grad", (("dy", dims),), (dims[-1:],), factor_sizes([(dims, dy.shape)]), local=frozenset(dims[-1]),
                reduce=rows, partial=(0,))
    (db,) = _bias_grad_op(rule, dtype_name(dtype), dy)
    return db


def _bias_grad_shard(dtype: str, sizes, dy):
    return ffi(BIAS_GRAD.plan(meta(dy), dtype), [dy])


def _bias_grad_partial(dtype: str, sizes, dy):
    """A row shard's fp32 column sums; their psum rounded to `dtype`."""
    return _bias_grad_shard("float32", sizes, dy), lambda sums: (sums[0].astype(jax_dtype(dtype)),)


_bias_grad_op = partitioned(_bias_grad_shard, _bias_grad_partial)


def bias_grad_grouped(dy, m_splits, dtype):
    """db (G, K): row g = Σc over the rows of group g of dy (as twinengine.pytorch's, same kernel)."""
    (db,) = ffi(BIAS_GRAD_GROUPED.plan(meta(dy), meta(m_splits), dtype_name(dtype)), [dy, m_splits])
    return db

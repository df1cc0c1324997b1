"""torch.ops.twinengine.bias_add / add / scale / bias_grad and their Python wrappers (no
autograd). Shapes, checks and errors come from core/ops/bias.py."""

from __future__ import annotations

import torch

from ...ops.bias import ADD, BIAS_ADD, BIAS_GRAD, BIAS_GRAD_GROUPED, SCALE
from .._library import check_tensor_device, dtype_name, empty_outputs, launch, meta, surface_errors, tensor_fallback

__all__ = ["bias_add", "add", "scale", "bias_grad"]


@torch.library.custom_op("twinengine::bias_add", mutates_args=())
def _bias_add(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    (y,) = launch(BIAS_ADD.cached_plan(meta(x), meta(bias)), [x, bias], x.device)
    return y


@_bias_add.register_fake
def _(x, bias):
    (y,) = empty_outputs(BIAS_ADD.infer(meta(x), meta(bias)), x.device)
    return y


@torch.library.custom_op("twinengine::add", mutates_args=())
def _add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    (z,) = launch(ADD.cached_plan(meta(x), meta(y)), [x, y], x.device)
    return z


@_add.register_fake
def _(x, y):
    (z,) = empty_outputs(ADD.infer(meta(x), meta(y)), x.device)
    return z


@torch.library.custom_op("twinengine::scale", mutates_args=())
def _scale(x: torch.Tensor, c: float) -> torch.Tensor:
    (y,) = launch(SCALE.cached_plan(meta(x), c), [x], x.device)
    return y


@_scale.register_fake
def _(x, c):
    (y,) = empty_outputs(SCALE.infer(meta(x), c), x.device)
    return y


@torch.library.custom_op("twinengine::bias_grad", mutates_args=())
def _bias_grad(dy: torch.Tensor, dtype: str) -> torch.Tensor:
    (db,) = launch(BIAS_GRAD.cached_plan(meta(dy), dtype), [dy], dy.device)
    return db


@_bias_grad.register_fake
def _(dy, dtype):
    (db,) = empty_outputs(BIAS_GRAD.infer(meta(dy), dtype), dy.device)
    return db


@torch.library.custom_op("twinengine::bias_grad_grouped", mutates_args=())
def _bias_grad_grouped(dy: torch.Tensor, m_splits: torch.Tensor, dtype: str) -> torch.Tensor:
    (db,) = launch(BIAS_GRAD_GROUPED.cached_plan(meta(dy), meta(m_splits), dtype), [dy, m_splits], dy.device)
    return db


@_bias_grad_grouped.register_fake
def _(dy, m_splits, dtype):
    (db,) = empty_outputs(BIAS_GRAD_GROUPED.infer(meta(dy), meta(m_splits), dtype), dy.device)
    return db


def _check_devices(op: str, **tensors) -> None:
    for name, t in tensors.items():
        check_tensor_device(op, name, t)


@surface_errors(tensor_fallback)
def bias_add(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """y = fl(x + bias), bias broadcast over the rows, RNE to x's dtype.

    Shapes: x (..., K), bias (K,). Dtypes: float32 / bfloat16 / float16 each (widened exactly).
    Numerics: NUMERICS.md §11 bias add; same bytes as ``twinengine.jax``.
    Raises:
        TypeError / ValueError: bad dtypes, bias length != x.shape[-1].
    """
    _check_devices("bias_add", x=x, bias=bias)
    BIAS_ADD.validate(meta(x), meta(bias))
    return torch.ops.twinengine.bias_add(x, bias)


@surface_errors(tensor_fallback)
def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """z = fl(x + y) (residual add), RNE to x's dtype.

    Shapes: x and y equal. Dtypes: float32 / bfloat16 / float16 each.
    Raises:
        TypeError / ValueError: bad dtypes, different shapes.
    """
    _check_devices("add", x=x, y=y)
    ADD.validate(meta(x), meta(y))
    return torch.ops.twinengine.add(x, y)


@surface_errors(tensor_fallback)
def scale(x: torch.Tensor, c: float) -> torch.Tensor:
    """y = fl(x · c), c rounded to fp32 first, RNE to x's dtype (ConstantScale).

    Raises:
        TypeError: bad dtype, non-numeric c.
    """
    _check_devices("scale", x=x)
    SCALE.validate(meta(x), c)
    return torch.ops.twinengine.scale(x, float(c))


@surface_errors(tensor_fallback)
def bias_grad(dy: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """db = Σc over the rows of dy (the canonical 32-lane sum, NUMERICS.md §11), RNE to `dtype`.

    Shapes: dy (..., K) flattened to (R, K); db (K,), zeros when R = 0.
    Raises:
        TypeError: bad dtypes.
    """
    _check_devices("bias_grad", dy=dy)
    name = dtype_name(dtype)
    BIAS_GRAD.validate(meta(dy), name)
    return torch.ops.twinengine.bias_grad(dy, name)


@surface_errors(tensor_fallback)
def bias_grad_grouped(dy: torch.Tensor, m_splits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """db (G, K): row g = Σc over the rows of group g of dy (NUMERICS.md §11) — each expert's bias
    gradient as its own Linear computes it. m_splits int32 (G,) on the CPU (read by the kernel)."""
    _check_devices("bias_grad_grouped", dy=dy, m_splits=m_splits)
    name = dtype_name(dtype)
    BIAS_GRAD_GROUPED.validate(meta(dy), meta(m_splits), name)
    return torch.ops.twinengine.bias_grad_grouped(dy, m_splits, name)

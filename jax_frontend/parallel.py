"""twinengine.jax.parallel: tensor-parallel dense and layernorm_mlp, called inside
``jax.shard_map`` on local shards (the JAX twins of tep.Linear's ``parallel_mode``).

- ``parallel_mode="column"``: the kernel is sharded on its output features (kernel (K, N/tp),
  bias (N/tp,)); x is whole along K. Shard-local; the output is the matching column slice of
  the unsharded output, byte for byte (NUMERICS.md §8 batch invariance, §12).
- ``parallel_mode="row"``: the kernel is sharded on its input features (kernel (K/tp, N)),
  x on its last dimension (..., K/tp). Each shard forms fp32 partial outputs, ``psum``-ed over
  `tp_axis`, then cast to x's dtype and the bias added: equal to the unsharded output within
  the tolerance of a different fp32 summation order (the one exception of NUMERICS.md §12).
  Operands in bf16 / fp16 are cast to fp32 for the partial GEMM (exact products).

Per-tensor amaxes are ``pmax``-ed over `tp_axis` and over the axes of any enclosing
``twinengine.jax.sharding.amax_reduction`` (put the data-parallel axes there), so every
quantized shard has the unsharded scale. Gradients flow through ``jax.grad`` of the
``shard_map`` (the psum's transpose broadcasts the output gradient).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
from jax import lax

from .blocks import layernorm_dense
from ._ops.dense import dense as _dense
from .ops import run_ops
from .ops.activation import activation_op
from .sharding import amax_axes, amax_reduction

_MODES = ("column", "row")


def _check_mode(op: str, parallel_mode: str, tp_axis) -> None:
    if parallel_mode not in _MODES:
        raise ValueError(f"{op}: parallel_mode must be 'column' or 'row', got {parallel_mode!r}")
    if not tp_axis:
        raise ValueError(f"{op}: tp_axis (the mesh axis name of the tensor-parallel group) is required")


def _reduction(tp_axis: str) -> amax_reduction:
    return amax_reduction(tuple(dict.fromkeys(amax_axes() + (tp_axis,))))


def _row(x, kernel, bias, tp_axis: str, recipe, state, rng):
    partial = _dense(x.astype(jnp.float32), kernel.astype(jnp.float32), None, recipe=recipe, state=state, rng=rng)
    partial, new_state = partial if state is not None else (partial, None)
    y = lax.psum(partial, tp_axis).astype(x.dtype)
    y = y if bias is None else y + bias.astype(y.dtype)  # fl(y + b), as bias_add; differentiable
    return y if state is None else (y, new_state)


def dense(x, kernel, bias=None, *, parallel_mode: str, tp_axis: str, recipe=None, state=None, rng=None):
    """``twinengine.jax.dense`` on tensor-parallel shards (see the module docstring); call it
    inside ``jax.shard_map`` whose mesh has `tp_axis`.

    Shapes (local): column: x (..., K), kernel (K, N/tp), bias (N/tp,), y (..., N/tp);
        row: x (..., K/tp), kernel (K/tp, N), bias (N,) (replicated), y (..., N).
    Returns / state / rng: as ``twinengine.jax.dense``.
    Raises:
        ValueError: an unknown parallel_mode or no tp_axis; the checks of ``dense``.
    """
    _check_mode("parallel.dense", parallel_mode, tp_axis)
    with _reduction(tp_axis):
        if parallel_mode == "column":
            return _dense(x, kernel, bias, recipe=recipe, state=state, rng=rng)
        return _row(x, kernel, bias, tp_axis, recipe, state, rng)


def gated_fc1_for_tp(fc1, tp: int):
    """The unsharded gated FC1 weight (2·F, H) or bias (2·F,) with rows reordered so that `tp`
    equal row shards each hold their [gate | linear] halves (rows i·F/tp .. (i+1)·F/tp of both):
    shard the result with ``P(tp_axis, ...)``. Pure reordering, bytes unchanged.

    Raises:
        ValueError: F not divisible by `tp`.
    """
    rows = fc1.shape[0]
    if rows % (2 * tp):
        raise ValueError(f"gated_fc1_for_tp: FC1 rows {rows} are not 2 x a multiple of tp={tp}")
    halves = fc1.reshape(2, tp, rows // (2 * tp), *fc1.shape[1:])
    return jnp.swapaxes(halves, 0, 1).reshape(fc1.shape)


def layernorm_mlp(x, params: Mapping[str, Any], *, tp_axis: str, normalization: str = "LayerNorm",
                  activation: str = "gelu", eps: float = 1e-5, zero_centered_gamma: bool = False, recipe=None):
    """``twinengine.jax.layernorm_mlp`` with FC1 column-parallel and FC2 row-parallel (TE's
    tensor-parallel LayerNormMLP); call it inside ``jax.shard_map``.

    Params (local): the norm's weight/bias whole; ``fc1_weight`` (F/tp, H), ``fc1_bias``
        (F/tp,) — for a gated activation (F = 2·ffn) each shard must hold its [gate | linear]
        rows: shard ``gated_fc1_for_tp(fc1, tp)`` of the unsharded FC1 weight / bias; ``fc2_weight`` (H, F/tp), ``fc2_bias`` (H,) whole. Torch layout, as
        ``layernorm_mlp``. No DelayedScaling state.
    Numerics: norm, FC1, bias and activation shard-local and exact; FC2 as a row-parallel
        ``dense`` (fp32 psum of partials).
    Raises:
        ValueError: no tp_axis.
    """
    _check_mode("parallel.layernorm_mlp", "row", tp_axis)
    act = activation_op(activation)
    fc1 = {"weight": params["fc1_weight"], "bias": params.get("fc1_bias")}
    fc1.update({k: params[k] for k in ("layer_norm_weight", "layer_norm_bias") if k in params})
    with _reduction(tp_axis):
        h = layernorm_dense(x, fc1, normalization=normalization, eps=eps, zero_centered_gamma=zero_centered_gamma,
                            recipe=recipe)
        h = run_ops([act], [()], h, recipe=recipe)
        fc2_bias = params.get("fc2_bias")
        return _row(h, params["fc2_weight"].T, fc2_bias, tp_axis, recipe, None, None)

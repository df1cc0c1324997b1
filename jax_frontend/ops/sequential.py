"""twinengine.jax.ops.Sequential: the core fusion plan of a list of basic ops as one ``custom_vjp``.

The same plan as ``twinengine.pytorch.ops.Sequential`` (core/fusion/planner.py) runs the same
kernels in the same order, so outputs and gradients are bit-identical to PyTorch's for the same
parameters (torch layout: a Linear's weight is (out_features, in_features)).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ...fusion import (KernelGroup, check_extra_inputs, check_sequential, plan, quantization_source, reject_member,
                       reject_quantized_output)
from ...quantized_tensor import QuantizedTensor
from .._ops.activation import activation_bwd_dbias
from ..autocast import current_recipe
from .._library import varying_together
from ..sharding import amax_axes, amax_reduction
from .linear import Linear
from .op import BasicOperation, OpContext


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray))


@jax.tree_util.register_pytree_node_class
class _Static:
    """A non-array value saved by an op (a dtype, a flag, a size): a pytree node with no children,
    so it travels in the custom_vjp residuals' tree structure rather than as a residual array."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def tree_flatten(self):
        return (), self.value

    @classmethod
    def tree_unflatten(cls, value, children):
        return cls(value)


def _wrap_static(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda leaf: leaf if _is_array(leaf) else _Static(leaf), tree)


def _unwrap_static(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda leaf: leaf.value if isinstance(leaf, _Static) else leaf, tree,
                                  is_leaf=lambda leaf: isinstance(leaf, _Static))


def _zero_cotangent(x: Any) -> Any:
    """A zero cotangent for a primal leaf (float0 for integer arrays)."""
    dtype = np.dtype(x.dtype)
    if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
        return np.zeros(np.shape(x), dtype=jax.dtypes.float0)
    return jnp.zeros(np.shape(x), dtype)


def _cotangent_like(primal: Any, value: Any) -> Any:
    if value is None:
        return jax.tree_util.tree_map(_zero_cotangent, primal)
    return value


def run_ops(ops: Sequence[BasicOperation], params: Sequence[tuple], x: Any, extra_inputs: Sequence[Any] = (), *,
            state: Sequence[Any] | None = None, rngs: Sequence[Any] | None = None, recipe: Any = None,
            fuse: bool = True, training: bool = True) -> Any:
    """Runs basic ops with explicit parameters under `recipe` (default: the innermost
    ``twinengine.jax.autocast`` region).

    Args:
        ops, params: the ops and one tuple of arrays per op.
        state: one state pytree per op (DelayedScaling: ``delayed_scaling_state`` for each
            BasicLinear), or None.
        rngs: one [seed, offset] array per op that draws random bits (BasicLinear with a
            stochastic-rounding recipe, Dropout when training), else None entries.
    Returns:
        out = y, or (y, *extra_outputs); with ``state`` given, (out, new_state) where new_state
        holds each op's state after the forward (DelayedScaling: the gradient with respect to
        ``state`` is the next state, as ``twinengine.jax.dense``).
    """
    ops = list(ops)
    check_sequential(len(ops))
    if recipe is None:
        recipe = current_recipe()
    n = len(ops)
    states = tuple(state) if state is not None else (None,) * n
    rng_list = tuple(rngs) if rngs is not None else (None,) * n
    descs = [op.describe() for op in ops]
    groups = plan(descs, recipe is not None, fuse)
    sources = [quantization_source(descs, i, recipe is not None) for i in range(n)]
    calls = [op.op_call(recipe, states[i], rng_list[i], training) for i, op in enumerate(ops)]
    statics = [c[0] for c in calls]
    arrays = tuple(c[1] for c in calls)
    check_extra_inputs(sum(op.num_extra_inputs for op in ops), len(extra_inputs))

    def quantize_kwargs(group: KernelGroup, i: int, call_arrays: Sequence[dict], h: Any) -> dict:
        """As the torch runner: the emitter writes the quantized input of the group's target (whose
        quantization core's quantization_source names); a Quantize op before a Linear uses the
        Linear's; empty inputs are never quantized."""
        if not isinstance(h, QuantizedTensor) and np.size(h) == 0:
            return {}
        target = group.quantize_for if i == group.emitter else (i if sources[i] != i else None)
        if target is None:
            return {}
        j = sources[target]
        return ops[j].op_input_quantization(statics[j], call_arrays[j]) or {}

    def forward(x, params, call_arrays, extra):
        extra = list(extra)
        ctxs, extras_out, state_out = [], [], [None] * n
        h = x
        for group in groups:
            for i in group.ops:
                op = ops[i]
                kwargs = {**statics[i], **call_arrays[i], **quantize_kwargs(group, i, call_arrays, h)}
                if op.num_extra_inputs:
                    kwargs["extra_inputs"] = tuple(extra[:op.num_extra_inputs])
                    extra = extra[op.num_extra_inputs:]
                ctx = OpContext(statics[i])
                if op._legacy_forward:
                    h = op.op_forward(ctx, h, params[i], **kwargs)
                else:
                    h, saved = op.op_forward_compute(h, params[i], **kwargs)
                    op.op_forward_save_ctx(ctx, saved)
                    state_out[i] = op.op_forward_state(saved)
                if op.num_extra_outputs:
                    h, extras = h
                    extras_out.extend(extras)
                ctxs.append(ctx)
        if isinstance(h, QuantizedTensor):
            reject_quantized_output()
        saved = [_wrap_static((ctx.saved, {k: v for k, v in vars(ctx).items() if k not in ("saved", "static")}))
                 for ctx in ctxs]
        out = (h, tuple(extras_out), tuple(state_out))
        return out, (saved, params, call_arrays)

    def backward(res, cotangents):
        saved, params, call_arrays = res
        dy, d_extras, _ = cotangents
        ctxs = []
        for i, payload in enumerate(saved):
            ctx = OpContext(statics[i])
            ctx.saved, extras = _unwrap_static(payload)
            for name, value in extras.items():  # attributes a user op set on its context
                setattr(ctx, name, value)
            ctxs.append(ctx)
        extra_grads = list(d_extras)
        dparams: list = [None] * n
        extra_input_grads: list = [[] for _ in ops]

        def backward_op(i: int, h: Any) -> Any:
            op = ops[i]
            if op.num_extra_outputs:
                h = (h, tuple(extra_grads[len(extra_grads) - op.num_extra_outputs:]))
                del extra_grads[len(extra_grads) - op.num_extra_outputs:]
            dx, dp = op.op_backward(ctxs[i], h)
            if op.num_extra_inputs:
                dx, d_extra = dx
                extra_input_grads[i] = list(d_extra)
            dparams[i] = tuple(dp)
            return dx

        h = dy
        for group in reversed(groups):
            for step in group.backward_steps():
                if len(step) == 1:
                    h = backward_op(step[0], h)
                    continue
                bias_i, act_i = step
                act = ops[act_i]
                (z,) = ctxs[act_i].saved
                quantization = {}
                if group.quantize_grad_for is not None and np.size(h) != 0:
                    q = group.quantize_grad_for
                    quantization = ops[q].op_grad_quantization(ctxs[q]) or {}
                dz, dbias, qdz = activation_bwd_dbias(h, z, act.activation, limit=act.limit, alpha=act.alpha,
                                                      bias_dtype=params[bias_i][0].dtype, **quantization)
                dparams[bias_i], dparams[act_i] = (dbias,), ()
                h = qdz if qdz is not None else dz
        d_params = tuple(tuple(_cotangent_like(p, g) for p, g in zip(params[i], _pad(dparams[i], len(params[i]))))
                         for i in range(n))
        d_arrays = []
        for i in range(n):
            cot = {}
            for key, value in call_arrays[i].items():
                cot[key] = _cotangent_like(value, ops[i].op_state_cotangent(ctxs[i]) if key == "state" else None)
            d_arrays.append(cot)
        d_extra = tuple(g for grads in extra_input_grads for g in grads)
        return h, d_params, tuple(d_arrays), d_extra

    @jax.custom_vjp
    def run(x, params, call_arrays, extra):
        return forward(x, params, call_arrays, extra)[0]

    axes = amax_axes()

    def backward_in_region(*args):
        # traced after the caller's amax_reduction region has closed: re-enter it
        with amax_reduction(axes):
            return backward(*args)

    run.defvjp(forward, backward_in_region)
    params = tuple(tuple(p) for p in params)
    x, params = varying_together(x, params)
    y, extras, state_out = run(x, params, arrays, tuple(extra_inputs))
    out = (y, *extras) if extras else y
    if state is None:
        return out
    return out, tuple(s if new is None else new for s, new in zip(states, state_out))


def _pad(grads: tuple | None, count: int) -> tuple:
    grads = tuple(grads or ())
    return grads + (None,) * (count - len(grads))


def _flatten_ops(ops: Sequence[Any]) -> list[BasicOperation]:
    out: list[BasicOperation] = []
    for op in ops:
        if isinstance(op, BasicOperation):
            out.append(op)
        elif isinstance(op, (Sequential, Linear)):
            out.extend(op.basic_ops)
        else:
            reject_member(type(op).__name__)
    return out


class Sequential:
    """A sequence of basic ops run as one fused plan (``twinengine.pytorch.ops.Sequential``'s twin).

    ``Sequential(*ops, fuse=True)``; ``init(key, dtype)`` gives the parameters (one tuple per op,
    torch layout); ``init_state(recipe)`` the per-op state; ``seq(x, params, *extra_inputs,
    state=None, rngs=None, recipe=None, training=True)`` runs it (see ``run_ops``); ``plan()``
    lists the kernel groups.

    Numerics: NUMERICS.md §11: the fused plan is byte-identical to ``fuse=False``, and to the
    torch Sequential of the same ops and parameters.
    Raises:
        ValueError: an empty Sequential; TypeError: something that is not a basic op.
    """

    def __init__(self, *ops: BasicOperation, fuse: bool = True) -> None:
        self.basic_ops = tuple(_flatten_ops(ops))
        check_sequential(len(self.basic_ops))
        self.fuse = fuse

    def init(self, key: Any, dtype: Any = jnp.float32) -> tuple:
        keys = jax.random.split(key, len(self.basic_ops))
        return tuple(op.init_params(k, dtype) for op, k in zip(self.basic_ops, keys))

    def init_state(self, recipe: Any = None) -> tuple:
        return tuple(op.init_state(recipe) for op in self.basic_ops)

    def plan(self, recipe: Any = None) -> list[str]:
        descs = [op.describe() for op in self.basic_ops]
        quantized = (recipe if recipe is not None else current_recipe()) is not None
        return [g.describe(descs) for g in plan(descs, quantized, self.fuse)]

    def __call__(self, x: Any, params: Sequence[tuple], *extra_inputs: Any, state: Sequence[Any] | None = None,
                 rngs: Sequence[Any] | None = None, recipe: Any = None, training: bool = True) -> Any:
        return run_ops(self.basic_ops, params, x, extra_inputs, state=state, rngs=rngs, recipe=recipe,
                       fuse=self.fuse, training=training)

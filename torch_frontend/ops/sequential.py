"""twinengine.pytorch.ops.Sequential: runs the core fusion plan of a list of basic ops.

The whole plan is one ``torch.autograd.Function``: its forward runs each kernel group's
members (``op_forward_compute`` then ``op_forward_save_ctx``), handing a norm's or an
activation's quantized output straight to the next Linear, and its backward runs the groups
in reverse (``op_backward``, or the fused activation-grad + bias-grad (+ quantize) kernel where
the plan says so). One function for the whole plan lets a QuantizedTensor pass between
groups without leaving autograd. Module state (delayed-scaling histories, rng offsets) is read
and advanced outside the function (``op_call`` / ``op_update_state``), so the traced forward
is pure and the graph is the same eager and under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from ...fusion import KernelGroup, check_sequential, plan
from ...quantized_tensor import QuantizedTensor
from .._ops.activation import activation_bwd_dbias
from ..autocast import current_recipe
from .op import BasicOperation, OpContext


@dataclasses.dataclass(frozen=True)
class _Run:
    """Everything static about one Sequential call (what the plan and op_call decided)."""

    ops: tuple[BasicOperation, ...]
    groups: tuple[KernelGroup, ...]
    static: tuple[dict, ...]           # per op: static compute kwargs
    tensor_keys: tuple[tuple[str, ...], ...]  # per op: names of its tensor compute kwargs
    param_counts: tuple[int, ...]
    num_extra_inputs: int

    def split(self, flat: Sequence[Any]) -> tuple[list, list, list]:
        flat = list(flat)
        params, tensors = [], []
        for count in self.param_counts:
            params.append(tuple(flat[:count]))
            flat = flat[count:]
        for keys in self.tensor_keys:
            tensors.append(dict(zip(keys, flat[:len(keys)])))
            flat = flat[len(keys):]
        return params, tensors, flat

    def handoff(self, target: int, tensors: list[dict]) -> dict:
        """Quantization kwargs an emitter uses to write op `target`'s quantized input."""
        return self.ops[target].op_input_quantization(self.static[target], tensors[target]) or {}


def _emitter_kwargs(run: _Run, group: KernelGroup, i: int, tensors: list[dict]) -> dict:
    """The hand-off kwargs of op i: set on the member right before the group's quantize target."""
    if group.quantize_for is None or i != group.quantize_for - 1:
        return {}
    return run.handoff(group.quantize_for, tensors)


class _SequentialFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run: _Run, x: torch.Tensor, *flat: Any):
        params, tensors, extra_inputs = run.split(flat)
        extra_inputs = list(extra_inputs)
        op_ctxs, extra_outputs, state_outputs = [], [], []
        h: Any = x
        for group in run.groups:
            for i in group.ops:
                op = run.ops[i]
                kwargs = {**run.static[i], **tensors[i], **_emitter_kwargs(run, group, i, tensors)}
                if op.num_extra_inputs:
                    kwargs["extra_inputs"] = tuple(extra_inputs[:op.num_extra_inputs])
                    extra_inputs = extra_inputs[op.num_extra_inputs:]
                op_ctx = OpContext()
                if op._legacy_forward:
                    h = op.op_forward(op_ctx, h, params[i], **kwargs)
                else:
                    h, saved = op.op_forward_compute(h, params[i], **kwargs)
                    op.op_forward_save_ctx(op_ctx, saved)
                    state_outputs.extend(op.op_forward_state(saved))
                if op.num_extra_outputs:
                    h, extras = h
                    extra_outputs.extend(extras)
                op_ctxs.append(op_ctx)
        ctx.save_for_backward(*[t for op_ctx in op_ctxs for t in op_ctx._tensors()])
        ctx.op_ctxs = op_ctxs
        ctx.run = run
        ctx.num_extra_outputs = len(extra_outputs)
        ctx.mark_non_differentiable(*state_outputs)
        if isinstance(h, QuantizedTensor):
            raise TypeError("twinengine.Sequential: the last op returns a QuantizedTensor (a Quantize op at the end); "
                            "quantized data carries no gradient, so keep the Linear that consumes it in the same "
                            "Sequential")
        return (h, *extra_outputs, *state_outputs)

    @staticmethod
    def backward(ctx, *grads: Any):
        run: _Run = ctx.run
        saved = list(ctx.saved_tensors)
        op_ctxs = []
        for op_ctx in ctx.op_ctxs:
            count = len(op_ctx._tensor_slots)
            op_ctxs.append(op_ctx._for_backward(saved[:count]))
            saved = saved[count:]
        dy = grads[0]
        extra_grads = list(grads[1:1 + ctx.num_extra_outputs])
        dparams: list[tuple] = [()] * len(run.ops)
        extra_input_grads: list[list] = [[] for _ in run.ops]

        def backward_op(i: int, h: Any) -> Any:
            op = run.ops[i]
            if op.num_extra_outputs:
                h = (h, tuple(extra_grads[len(extra_grads) - op.num_extra_outputs:]))
                del extra_grads[len(extra_grads) - op.num_extra_outputs:]
            dx, dp = op.op_backward(op_ctxs[i], h)
            if op.num_extra_inputs:
                dx, d_extra = dx
                extra_input_grads[i] = list(d_extra)
            dparams[i] = tuple(dp)
            return dx

        h: Any = dy
        for group in reversed(run.groups):
            members = list(group.ops)
            if group.dact_dbias is None:
                for i in reversed(members):
                    h = backward_op(i, h)
                continue
            bias_i, act_i = members[group.dact_dbias], members[group.dact_dbias + 1]
            for i in reversed(members[group.dact_dbias + 2:]):
                h = backward_op(i, h)
            h = _fused_dact_dbias(run, op_ctxs, group, bias_i, act_i, h, dparams)
            for i in reversed(members[:group.dact_dbias]):
                h = backward_op(i, h)
        flat_grads = [g for dp, count in zip(dparams, run.param_counts) for g in _pad(dp, count)]
        flat_grads += [None] * sum(len(keys) for keys in run.tensor_keys)
        flat_grads += [g for grads_i in extra_input_grads for g in grads_i]
        return (None, h, *flat_grads)


def _pad(grads: tuple, count: int) -> tuple:
    return tuple(grads) + (None,) * (count - len(grads))


def _fused_dact_dbias(run: _Run, op_ctxs: list, group: KernelGroup, bias_i: int, act_i: int, dy: Any,
                      dparams: list) -> Any:
    """Backward of Bias -> activation as one kernel: dz = act'(z)·dy, dbias = Σc_rows dz, and (when
    the plan says so) dz quantized as the grad_output of the BasicLinear before the Bias."""
    act = run.ops[act_i]
    (z,) = op_ctxs[act_i].saved
    bias_dtype = op_ctxs[bias_i].saved
    quantization = {}
    if group.quantize_grad_for is not None:
        linear = run.ops[group.quantize_grad_for]
        quantization = linear.op_grad_quantization(op_ctxs[group.quantize_grad_for]) or {}
    dz, dbias, qdz = activation_bwd_dbias(dy, z, act.activation, limit=act.limit, alpha=act.alpha,
                                          bias_dtype=bias_dtype, **quantization)
    dparams[bias_i] = (dbias,)
    dparams[act_i] = ()
    return qdz if qdz is not None else dz


def _flatten_ops(ops: Sequence[BasicOperation]) -> list[BasicOperation]:
    out: list[BasicOperation] = []
    for op in ops:
        if isinstance(op, BasicOperation):
            out.append(op)
        elif isinstance(getattr(op, "basic_ops", None), torch.nn.ModuleList):  # Sequential, ops.Linear
            out.extend(op.basic_ops)
        else:
            raise TypeError(f"twinengine.Sequential: ops must be twinengine basic operations (or Sequentials of "
                            f"them), got {type(op).__name__}")
    return out


def run_ops(ops: Sequence[BasicOperation], params: Sequence[tuple], x: torch.Tensor,
            extra_inputs: Sequence[torch.Tensor] = (), *, fuse: bool = True) -> Any:
    """Runs basic ops with explicit parameters (one tuple per op) under the current autocast recipe.

    Returns the output, or (output, *extra_outputs) when ops make extra outputs. Modules built on
    basic ops (LayerNormLinear, LayerNormMLP, ...) call this with their own parameters.
    """
    check_sequential(len(ops))
    recipe = current_recipe()
    groups = plan([op.describe() for op in ops], recipe is not None, fuse)
    calls = [op.op_call(recipe) for op in ops]
    run = _Run(ops=tuple(ops), groups=groups, static=tuple(c[0] for c in calls),
               tensor_keys=tuple(tuple(c[1]) for c in calls), param_counts=tuple(len(p) for p in params),
               num_extra_inputs=len(extra_inputs))
    expected = sum(op.num_extra_inputs for op in ops)
    if len(extra_inputs) != expected:
        raise ValueError(f"twinengine.Sequential: the ops take {expected} extra input(s) (AddExtraInput), got "
                         f"{len(extra_inputs)}")
    # One tensor may feed several ops (m_splits of two GroupedLinears): autograd.Function.apply
    # under Dynamo rejects a repeated input, so repeats enter as views (same values and gradient).
    extra_inputs = [t.view_as(t) if any(t is u for u in extra_inputs[:i]) else t for i, t in enumerate(extra_inputs)]
    flat = [p for ps in params for p in ps] + [t for c in calls for t in c[1].values()] + list(extra_inputs)
    outputs = _SequentialFunction.apply(run, x, *flat)
    num_extra = sum(op.num_extra_outputs for op in ops)
    y, extras, state = outputs[0], outputs[1:1 + num_extra], outputs[1 + num_extra:]
    for i, op in enumerate(ops):
        count = op.op_state_count(run.static[i])
        if count:
            op.op_update_state(run.static[i], tuple(state[:count]))
            state = state[count:]
    return (y, *extras) if num_extra else y


class Sequential(torch.nn.Module):
    """A sequence of basic ops run as one fused plan (TE's ``te.ops.Sequential``).

    ``Sequential(*ops, fuse=True)``: nested Sequentials are flattened. ``forward(x, *extra_inputs)``
    returns the output, or ``(output, *extra_outputs)`` when ops make extra outputs
    (MakeExtraOutput); AddExtraInput ops consume the extra inputs in order.
    ``fuse=False`` runs op by op (same bytes). ``plan()`` lists the kernel groups under the
    current autocast recipe.

    Numerics: NUMERICS.md §11 "Fusion never changes bytes": the fused plan is byte-identical to
    the unfused one; eager and ``torch.compile(fullgraph=True)`` give the same bytes.
    Raises:
        ValueError: an empty Sequential; TypeError: something that is not a basic op.
    """

    def __init__(self, *ops: BasicOperation, fuse: bool = True) -> None:
        super().__init__()
        flat = _flatten_ops(ops)
        check_sequential(len(flat))
        self.basic_ops = torch.nn.ModuleList(flat)
        self.fuse = fuse

    def plan(self) -> list[str]:
        """The kernel groups of the next call (under the current autocast recipe), one line each."""
        descs = [op.describe() for op in self.basic_ops]
        return [g.describe(descs) for g in plan(descs, current_recipe() is not None, self.fuse)]

    def forward(self, x: torch.Tensor, *extra_inputs: torch.Tensor) -> Any:
        ops = list(self.basic_ops)
        return run_ops(ops, [op.op_params() for op in ops], x, extra_inputs, fuse=self.fuse)

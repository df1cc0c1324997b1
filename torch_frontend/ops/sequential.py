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

from ...fusion import (KernelGroup, check_extra_inputs, check_sequential, plan, quantization_source, reject_member,
                       reject_quantized_output)
from ...quantized_tensor import QuantizedTensor
from .._ops.activation import activation_bwd_dbias
from ..autocast import current_recipe, replay_region
from .linear import Linear
from .op import BasicOperation, OpContext


@dataclasses.dataclass(frozen=True)
class _Run:
    """Everything static about one Sequential call (what the plan and op_call decided)."""

    ops: tuple[BasicOperation, ...]
    groups: tuple[KernelGroup, ...]
    sources: tuple[int, ...]           # per op: whose input quantization its quantized output uses
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
        """Quantization kwargs that write op `target`'s quantized input (core quantization_source
        decides whose quantization that is)."""
        source = self.sources[target]
        return self.ops[source].op_input_quantization(self.static[source], tensors[source]) or {}


def _quantize_kwargs(run: _Run, group: KernelGroup, i: int, tensors: list[dict], h: Any) -> dict:
    """The quantization kwargs of op i: the emitter right before the group's quantize target writes
    its quantized input; a Quantize op before a Linear uses the Linear's. Empty inputs (zero rows)
    are never quantized: they pass on empty, and the Linear then has nothing to multiply."""
    if isinstance(h, torch.Tensor) and h.numel() == 0:
        return {}
    if i == group.emitter:
        return run.handoff(group.quantize_for, tensors)
    if run.sources[i] != i:
        return run.handoff(i, tensors)
    return {}


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
                kwargs = {**run.static[i], **tensors[i], **_quantize_kwargs(run, group, i, tensors, h)}
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
        for op_ctx in op_ctxs:
            op_ctx._drop_tensors()  # held only through save_for_backward (saved-tensor hooks see every one)
        ctx.op_ctxs = op_ctxs
        ctx.x_is_tensor = isinstance(x, torch.Tensor)
        ctx.run = run
        ctx.num_extra_outputs = len(extra_outputs)
        ctx.mark_non_differentiable(*state_outputs)
        if isinstance(h, QuantizedTensor):
            reject_quantized_output()
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
            for step in group.backward_steps():
                if len(step) == 1:
                    h = backward_op(step[0], h)
                else:
                    h = _fused_dact_dbias(run, op_ctxs, group, *step, h, dparams)
        flat_grads = [g for dp, count in zip(dparams, run.param_counts) for g in _pad(dp, count)]
        flat_grads += [None] * sum(len(keys) for keys in run.tensor_keys)
        flat_grads += [g for grads_i in extra_input_grads for g in grads_i]
        return (None, h if ctx.x_is_tensor else None, *flat_grads)


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
    if group.quantize_grad_for is not None and dy.numel() != 0:
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
        elif isinstance(op, (Sequential, Linear)):
            out.extend(op.basic_ops)
        else:
            reject_member(type(op).__name__)
    return out


def run_ops(ops: Sequence[BasicOperation], params: Sequence[tuple], x: torch.Tensor,
            extra_inputs: Sequence[torch.Tensor] = (), *, fuse: bool = True) -> Any:
    """Runs basic ops with explicit parameters (one tuple per op) under the current autocast recipe.

    Returns the output, or (output, *extra_outputs) when ops make extra outputs. Modules built on
    basic ops (LayerNormLinear, LayerNormMLP, ...) call this with their own parameters.
    """
    check_sequential(len(ops))
    check_extra_inputs(sum(op.num_extra_inputs for op in ops), len(extra_inputs))
    recording = False
    if not torch.compiler.is_compiling():
        if torch._C._current_graph_task_id() != -1:
            return _replay(ops, params, x, extra_inputs, fuse)  # a checkpoint recompute in the backward
        recording = (not torch.is_grad_enabled()
                     or torch._C._autograd._top_saved_tensors_default_hooks(False) is not None)
    recipe = current_recipe()
    calls = [op.op_call(recipe) for op in ops]
    if recording:
        _record(ops, x, extra_inputs, recipe, calls)
    outputs = _apply(ops, params, x, extra_inputs, recipe, calls, fuse)
    num_extra = sum(op.num_extra_outputs for op in ops)
    y, extras, state = outputs[0], outputs[1:1 + num_extra], outputs[1 + num_extra:]
    for i, op in enumerate(ops):
        count = op.op_state_count(calls[i][0])
        if count:
            op.op_update_state(calls[i][0], tuple(state[:count]))
            state = state[count:]
    return (y, *extras) if num_extra else y


def _apply(ops, params, x, extra_inputs, recipe, calls, fuse) -> tuple:
    """One _SequentialFunction call for the given per-op call arguments."""
    descs = [op.describe() for op in ops]
    groups = plan(descs, recipe is not None, fuse)
    sources = tuple(quantization_source(descs, i, recipe is not None) for i in range(len(ops)))
    run = _Run(ops=tuple(ops), groups=groups, sources=sources, static=tuple(c[0] for c in calls),
               tensor_keys=tuple(tuple(c[1]) for c in calls), param_counts=tuple(len(p) for p in params),
               num_extra_inputs=len(extra_inputs))
    # One tensor may feed several ops (m_splits of two GroupedLinears): autograd.Function.apply
    # under Dynamo rejects a repeated input, so repeats enter as views (same values and gradient).
    extra_inputs = [t.view_as(t) if any(t is u for u in extra_inputs[:i]) else t for i, t in enumerate(extra_inputs)]
    flat = [p for ps in params for p in ps] + [t for c in calls for t in c[1].values()] + list(extra_inputs)
    return _SequentialFunction.apply(run, x, *flat)


# ---- activation checkpointing (eager) -----------------------------------------------------
# torch.utils.checkpoint re-runs the forward inside the backward pass, where no autocast region
# is active and module state (delayed-scaling scales, rng offsets) has moved on. A forward that
# checkpointing may recompute (grad disabled: the reentrant first pass; saved-tensor hooks
# active: the non-reentrant one) records the recipe and the per-op call arguments it used (the
# state an op reads is snapshotted: BasicOperation.replay_snapshot) with a hash of its inputs; the
# recompute replays exactly that call and updates no state, so checkpointed and plain runs give
# the same bytes (tep.Linear does the same). Compiled code needs none of this: AOTAutograd
# recomputes inside the graph from the same values, and the ops write their state with
# _state.write_state / draw_rng (applied once).

_MAX_RECORDS = 4096


def _inputs_key(x, extra_inputs) -> tuple:
    tensors = [x] + [e for e in extra_inputs]
    meta = tuple((tuple(t.shape), t.dtype, t.device) if isinstance(t, torch.Tensor) else type(t) for t in tensors)
    hashes = [torch.hash_tensor(t.detach()) for t in tensors if isinstance(t, torch.Tensor) and t.numel()]
    return meta, hashes


def _record(ops, x, extra_inputs, recipe, calls) -> None:
    snapshot = []
    for op, (static, tensors) in zip(ops, calls):
        keep = {k: (v.detach().clone() if k in op.replay_snapshot and v is not None else v) for k, v in tensors.items()}
        snapshot.append((static, keep))
    records = ops[0].__dict__.setdefault("_checkpoint_records", [])
    records.append((tuple(id(op) for op in ops), *_inputs_key(x, extra_inputs), recipe, snapshot))
    if len(records) > _MAX_RECORDS:  # forwards never recomputed (evaluation): drop the oldest
        del records[0]


def _replay(ops, params, x, extra_inputs, fuse) -> Any:
    records = ops[0].__dict__.get("_checkpoint_records", [])
    ids = tuple(id(op) for op in ops)
    meta, hashes = _inputs_key(x, extra_inputs)
    for i, record in enumerate(records):
        if record[0] == ids and record[1] == meta and all(torch.equal(a, b) for a, b in zip(record[2], hashes)):
            _, _, _, recipe, calls = records.pop(i)
            break
    else:
        raise RuntimeError(
            "twinengine.Sequential: a forward ran inside a backward pass (activation checkpointing recompute) with "
            "inputs these ops did not see in a checkpointed forward; the recomputed forward must be deterministic "
            "and see the same inputs")
    with replay_region(recipe):
        outputs = _apply(ops, params, x, extra_inputs, recipe,
                         [(static, {k: (v.clone() if isinstance(v, torch.Tensor) and k in op.replay_snapshot else v)
                                    for k, v in tensors.items()}) for op, (static, tensors) in zip(ops, calls)],
                         fuse)
    num_extra = sum(op.num_extra_outputs for op in ops)
    return (outputs[0], *outputs[1:1 + num_extra]) if num_extra else outputs[0]


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

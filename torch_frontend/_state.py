"""Module state written so that activation checkpointing replays it exactly, eager and compiled.

Modules keep state that every training forward advances: DelayedScaling amax histories and
scales, and the [seed, offset] rng buffers of stochastic rounding and dropout.
``torch.utils.checkpoint`` runs the forward a second time during the backward; that recompute
must see the values of the first run and must not advance the state again.

- Eager: modules record what a checkpointable forward used (the modules' ``_record`` /
  ``_recompute``; ``record_call`` / ``replayed_call`` here for the others) and replay it.
- Compiled (Dynamo traces the checkpointed region into one higher-order op whose recompute is
  the traced graph itself): the state is read as graph inputs, so the recompute sees the
  first run's values by construction; the writes must happen once, after the region. Inside a
  traced checkpoint region ``write_state`` / ``draw_rng`` therefore *rebind* the buffer
  attribute to the new tensor (a Python side effect) instead of copying into it (a graph
  mutation the recompute would repeat). Dynamo applies such side effects once when
  ``torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True``; without that
  flag Dynamo would refuse them: with ``fullgraph=True`` the traced graph instead raises our
  RuntimeError naming the flag (``refuse_unapplied_side_effect``) when it runs, and with
  ``fullgraph=False`` Dynamo graph-breaks to eager checkpointing, which replays exactly. Never a
  silently different gradient.
"""

from __future__ import annotations

from typing import Any

import torch


@torch.compiler.assume_constant_result
def _tracing_checkpoint_region() -> bool:
    """Whether Dynamo is tracing inside a ``torch.utils.checkpoint`` region right now.

    Evaluated by Dynamo at trace time (assume_constant_result): walks the chain of subgraph
    tracers looking for the activation-checkpoint higher-order op.
    """
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
    except Exception:  # not tracing
        return False
    tracer = getattr(getattr(tx, "output", None), "current_tracer", None)
    while tracer is not None:
        if "tag_activation_checkpoint" in str(getattr(tracer, "source_target", None)):
            return True
        tracer = getattr(tracer, "parent", None)
    return False


@torch.compiler.assume_constant_result
def _fullgraph_without_side_effect_flag() -> bool:
    """At trace time: fullgraph=True (no graph break allowed) and Dynamo's
    ``skip_fwd_side_effects_in_bwd_under_checkpoint`` flag off."""
    import torch._dynamo

    if torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint:
        return False
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
    except Exception:  # not tracing
        return False
    while tx is not None:
        if getattr(tx, "one_graph", False) or getattr(tx, "error_on_graph_break", False):
            return True
        tx = getattr(tx, "parent", None)
    return False


STATE_WRITE = ("this module writes its state (DelayedScaling amax history / scales, or the rng offset of "
               "stochastic rounding or dropout)")

UNAPPLIED_SIDE_EFFECT = (
    "{owner}: {what} inside an activation-checkpoint region compiled with "
    "torch.compile(fullgraph=True); Dynamo applies such writes exactly once only with "
    "torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True. Set that flag (the bytes then "
    "equal the run without checkpointing), or compile without fullgraph=True (the region then runs as eager "
    "checkpointing, also exact)")


def refuse_unapplied_side_effect(owner: str, anchor: torch.Tensor | None, what: str = STATE_WRITE) -> bool:
    """Inside a compiled checkpoint region under fullgraph=True without Dynamo's side-effect
    flag: puts ``twinengine::raise_error`` (RuntimeError, ``UNAPPLIED_SIDE_EFFECT``) into the
    graph — it raises when the compiled code runs, before anything else of the region is
    returned — and returns True (the caller then skips its side effect, which Dynamo would
    refuse with its own error). Otherwise returns False."""
    if not _fullgraph_without_side_effect_flag():
        return False
    if anchor is None:
        anchor = torch.zeros(())
    torch.ops.twinengine.raise_error(anchor, "RuntimeError", UNAPPLIED_SIDE_EFFECT.format(owner=owner, what=what))
    return True


def in_compiled_checkpoint() -> bool:
    """True while torch.compile traces the inside of an activation-checkpoint region."""
    return torch.compiler.is_compiling() and _tracing_checkpoint_region()


def write_state(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Sets buffer ``name`` of ``module`` to ``value`` (same shape and dtype).

    Outside a compiled checkpoint region: an in-place copy (the buffer keeps its identity).
    Inside one: the attribute is rebound to ``value`` (see the module docstring)."""
    if in_compiled_checkpoint():
        if not refuse_unapplied_side_effect(_owner(module), value):
            setattr(module, name, value)
        return
    with torch.no_grad():
        getattr(module, name).copy_(value)


def state_writer(module: torch.nn.Module, *names: str):
    """A callable ``write(*values)`` that ``write_state``s each of ``names`` in order."""
    def write(*values: torch.Tensor) -> None:
        for name, value in zip(names, values):
            write_state(module, name, value)
    return write


def draw_rng(module: torch.nn.Module, name: str = "rng_state") -> torch.Tensor:
    """Returns the module's current [seed, offset] (int64 (2,)) and advances the offset by one.

    Outside a compiled checkpoint region this is the ``twinengine::rng_advance`` op (its output
    is saved, never recomputed, so the compiled backward sees the offset the forward used);
    inside one the buffer is rebound to the advanced state and the graph input is returned."""
    from ._ops.rng import rng_advance

    state = getattr(module, name)
    if in_compiled_checkpoint():
        if not refuse_unapplied_side_effect(_owner(module), state):
            setattr(module, name, state + torch.tensor([0, 1], dtype=state.dtype, device=state.device))
        return state
    return rng_advance(state)


def advance_rng(module: torch.nn.Module, count: int = 1, name: str = "rng_state") -> torch.Tensor:
    """Returns the module's current [seed, offset] (int64 (2,)) and advances the offset by
    ``count`` — in plain aten ops, so ``torch.func`` transforms the caller (a mutating custom op
    would not); inside a compiled checkpoint region the buffer is rebound instead.

    The value returned is computed from the advanced state (advanced − step), not a clone of
    the buffer: inductor may elide a plain clone and read the buffer after its update."""
    state = getattr(module, name)
    step = torch.tensor([0, count], dtype=state.dtype, device=state.device)
    if in_compiled_checkpoint():
        if not refuse_unapplied_side_effect(_owner(module), state):
            setattr(module, name, state + step)
        return state
    advanced = state + step
    with torch.no_grad():
        state.copy_(advanced)
    return advanced - step


def _owner(module: torch.nn.Module) -> str:
    return f"twinengine.pytorch.{type(module).__name__}"


def may_be_recomputed() -> bool:
    """Eager only: whether the running forward is one activation checkpointing may recompute
    (grad disabled: reentrant checkpoint's first pass; saved-tensor hooks active: the
    non-reentrant one)."""
    return not torch.is_grad_enabled() or torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def is_recompute() -> bool:
    """Eager only: whether the running forward was started by the backward pass (a checkpoint
    recompute)."""
    return torch._C._current_graph_task_id() != -1


_MAX_RECORDS = 4096


def _input_key(inputs: tuple[torch.Tensor, ...]) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)


def record_call(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], values: Any) -> None:
    """Eager checkpointing, first run: remember ``values`` (what this call used — recipe, scales,
    rng) keyed by the inputs' shapes and a hash of their bytes (kept as tensors: no device
    sync in the forward). At most 4096 records are kept (forwards never recomputed, e.g.
    evaluation under no_grad, age out)."""
    records = module.__dict__.setdefault("_checkpoint_records", [])
    records.append((_input_key(inputs), [torch.hash_tensor(t.detach()) for t in inputs], values))
    if len(records) > _MAX_RECORDS:
        del records[0]


def replayed_call(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    """Eager checkpointing, the recompute: the values of the newest recorded call whose inputs
    match (newest first: an older no-grad forward of the same input must not shadow the
    checkpointed call); the record is consumed.

    Raises:
        RuntimeError: no recorded call has these inputs.
    """
    records = module.__dict__.get("_checkpoint_records", [])
    key = _input_key(inputs)
    digests = [torch.hash_tensor(t.detach()) for t in inputs]
    for i in range(len(records) - 1, -1, -1):
        rec_key, rec_digests, values = records[i]
        if rec_key == key and all(torch.equal(a, b) for a, b in zip(rec_digests, digests)):
            del records[i]
            return values
    raise RuntimeError(
        f"twinengine.pytorch.{type(module).__name__}: a forward ran inside a backward pass (activation "
        "checkpointing recompute) with inputs this module did not see in a checkpointed forward; the "
        "recomputed forward must be deterministic and see the same inputs")

"""The basic-operation API of twinengine.pytorch.ops (seed 003's split forward).

A basic op is three pure pieces:

- ``op_forward_compute(x, params, **kwargs) -> (y, saved)``: math only; ``saved`` is any
  pytree (tensors, QuantizedTensors, None, small Python values);
- ``op_forward_save_ctx(ctx, saved)``: puts ``saved`` on the context (default: ``ctx.save(saved)``);
  it never re-queries global state or repeats a decision made in compute;
- ``op_backward(ctx, dy) -> (dx, dparams)``: ``dparams`` one gradient (or None) per parameter.

A user op may instead define the legacy single ``op_forward(ctx, x, params, **kwargs) -> y``.
Defining both forward APIs, or neither, is a TypeError at class creation (core/fusion/ops.py).
Such an op works inside ``Sequential``, eager and under ``torch.compile(fullgraph=True)``, with
no other registration.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from ...fusion.ops import OpDesc, check_op_api


class OpContext:
    """Per-op autograd context inside a Sequential.

    ``save(saved)`` keeps any pytree: its tensors go through the Sequential's one
    ``ctx.save_for_backward`` (so activation checkpointing and saved-tensor hooks see them),
    everything else is kept as is. In the backward, ``ctx.saved`` is the same pytree.
    Other attributes set on the context are kept too.
    """

    def __init__(self) -> None:
        self._leaves: list[Any] = []
        self._spec = None
        self._tensor_slots: list[int] = []
        self.saved: Any = None

    def save(self, saved: Any) -> None:
        leaves, self._spec = pytree.tree_flatten(saved)
        self._tensor_slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self._leaves = leaves
        self.saved = saved

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        """torch.autograd.Function-style alias: ``ctx.saved_tensors`` gives them back."""
        self.save(tuple(tensors))

    @property
    def saved_tensors(self) -> tuple:
        return tuple(self.saved)

    def _tensors(self) -> list[torch.Tensor]:
        return [self._leaves[i] for i in self._tensor_slots]

    def _drop_tensors(self) -> None:
        """Forgets the tensors once they are in save_for_backward (the backward rebuilds ``saved``)."""
        self._leaves = [None if i in set(self._tensor_slots) else leaf for i, leaf in enumerate(self._leaves)]
        self.saved = None

    def _for_backward(self, tensors: list[torch.Tensor]) -> "_BackwardContext":
        """The context the backward sees: ``saved`` rebuilt around the saved tensors (a new object:
        the traced backward must not mutate objects of the forward)."""
        leaves = list(self._leaves)
        for slot, tensor in zip(self._tensor_slots, tensors):
            leaves[slot] = tensor
        saved = None if self._spec is None else pytree.tree_unflatten(leaves, self._spec)
        return _BackwardContext(self, saved)


class _BackwardContext:
    """An OpContext as the backward sees it: ``saved`` restored, other attributes read through."""

    def __init__(self, forward: OpContext, saved: Any) -> None:
        self._forward = forward
        self.saved = saved

    @property
    def saved_tensors(self) -> tuple:
        return tuple(self.saved)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._forward, name)


class BasicOperation(torch.nn.Module):
    """Base of every basic op (built-in and user-defined).

    Subclasses set ``param_names`` (attribute names of their parameters, in the order
    ``params`` is passed to compute and ``dparams`` returned by backward) and may override
    ``describe`` (what the fusion planner knows; default: a user op, never fused).
    """

    param_names: tuple[str, ...] = ()
    replay_snapshot: tuple[str, ...] = ()
    """Tensor kwargs of ``op_call`` holding module state that later calls change (scales, rng
    values): a checkpoint recompute replays copies of them."""
    num_extra_inputs: int = 0
    num_extra_outputs: int = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_abstract_op", False):
            return
        has_legacy = _defines(cls, "op_forward")
        has_split = _defines(cls, "op_forward_compute")
        check_op_api(cls.__name__, has_legacy, has_split, _defines(cls, "op_backward"))
        cls._legacy_forward = has_legacy

    _abstract_op = True
    _legacy_forward = False

    def describe(self) -> OpDesc:
        return OpDesc("user", type(self).__name__)

    def op_params(self) -> tuple[torch.Tensor | None, ...]:
        """The op's own parameters, in ``param_names`` order."""
        return tuple(getattr(self, name) for name in self.param_names)

    def op_call(self, recipe: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor | None]]:
        """Per-call arguments of compute: (static kwargs, tensor kwargs). Called once per forward,
        outside the autograd function (may advance module state such as an rng offset: use
        ``twinengine.pytorch.ops.draw_rng`` / ``write_state`` for that, so activation
        checkpointing — eager and compiled — replays the call without advancing it twice)."""
        return {}, {}

    def op_input_quantization(self, static: dict, tensors: dict) -> dict | None:
        """How this op wants its input quantized in this call ({"quantizer", "scale"}), so the
        op before it can write that quantized input with its fused kernel; None: not quantized."""
        return None

    def op_grad_quantization(self, ctx: OpContext) -> dict | None:
        """How this op quantizes the gradient of its output ({"quantizer", "scale", "rng"}), so a
        fused backward kernel after it can write it; None: not quantized."""
        return None

    def op_state_count(self, static: dict) -> int:
        """Number of tensors ``op_forward_state`` returns for a call with these static kwargs."""
        return 0

    def op_forward_state(self, saved: Any) -> tuple[torch.Tensor, ...]:
        """Tensors the forward hands back to ``op_update_state`` (e.g. delayed-scaling amaxes)."""
        return ()

    def op_update_state(self, static: dict, values: tuple[torch.Tensor, ...]) -> None:
        """Applies ``op_forward_state``'s tensors to module state after the forward (write buffers
        with ``twinengine.pytorch.ops.write_state``, not ``copy_``: see ``op_call``)."""

    def op_forward_save_ctx(self, ctx: OpContext, saved: Any) -> None:
        ctx.save(saved)

    def forward(self, x: torch.Tensor, *extra_inputs: torch.Tensor) -> Any:
        """Runs this op alone as a one-op Sequential."""
        from .sequential import run_ops

        return run_ops([self], [self.op_params()], x, extra_inputs, fuse=False)


def _defines(cls: type, name: str) -> bool:
    """Whether a class below BasicOperation (user or built-in) defines `name`."""
    for klass in cls.__mro__:
        if klass is BasicOperation:
            return False
        if name in klass.__dict__:
            return True
    return False

"""twinengine.pytorch.autocast: the recipe in force for twinengine layers, usable inside
torch.compile(fullgraph=True) code.

The state is a stack held in plain instance attributes of one module-level object (never
class attributes), so Dynamo traces entering and leaving regions as ordinary side effects.
Layers read the innermost region's recipe when they are called; the backward pass uses the
quantizers chosen in the forward, so nested regions route each layer's own recipe to both.
"""

from __future__ import annotations

from ..linear import check_autocast_recipe
from ..recipe import Recipe
from ._state import in_compiled_checkpoint, refuse_unapplied_side_effect


class _AutocastState:
    """The stack of active regions: each entry is a Recipe, or None for a disabled region."""

    def __init__(self) -> None:
        self.stack: list[Recipe | None] = []
        self.groups: list[str | None] = []  # amax_reduction_group names of the autocast regions


_STATE = _AutocastState()


def current_recipe() -> Recipe | None:
    """The innermost active region's recipe, or None (high precision) outside any region or in
    a disabled one."""
    return _STATE.stack[-1] if _STATE.stack else None


def current_amax_group() -> str | None:
    """The name of the innermost autocast region's amax_reduction_group, or None."""
    return _STATE.groups[-1] if _STATE.groups else None


class autocast:
    """Context manager: twinengine layers called inside quantize with `recipe`
    (``autocast(recipe)`` or ``autocast(recipe=recipe)``, the same signature as
    ``twinengine.jax.autocast``).

    ``autocast(enabled=False)`` runs them in high precision (also inside an enabled region).
    Regions nest; the innermost wins.

    ``amax_reduction_group`` (a ``torch.distributed`` ProcessGroup): every whole-tensor amax
    the layers take — per-tensor current scaling, NVFP4's global amaxes, the delayed-scaling
    history update — is
    all-reduced with MAX over it before the scale is formed (NUMERICS.md §12, TE's
    ``reduce_amax``), through functional collectives that ``torch.compile(fullgraph=True)``
    traces. With data parallelism this keeps DelayedScaling histories identical on all ranks;
    with tensor-parallel layers it must contain their tp_group (TE's convention), which they
    then reduce over instead of the tp_group alone.

    Raises:
        TypeError: enabled without a twinengine Recipe (a TransformerEngine recipe is converted
            field by field, ``twinengine.te_migration.convert_te_recipe``).
    """

    def __init__(self, recipe: Recipe | None = None, *, enabled: bool = True, amax_reduction_group=None) -> None:
        self.enabled = enabled
        self.recipe = check_autocast_recipe(enabled, recipe)
        self.group = None if amax_reduction_group is None else amax_reduction_group.group_name

    def __enter__(self) -> "autocast":
        # Entering a region is a side effect on the recipe stack: inside a compiled checkpoint
        # region under fullgraph=True without Dynamo's side-effect flag the graph raises our
        # error instead (_state.refuse_unapplied_side_effect).
        self._entered = not (in_compiled_checkpoint() and refuse_unapplied_side_effect(
            "twinengine.pytorch.autocast", None, "an autocast region is entered (a side effect on the recipe stack)"))
        if self._entered:
            _STATE.stack.append(self.recipe if self.enabled else None)
            _STATE.groups.append(self.group)
        return self

    def __exit__(self, *exc_info: object) -> bool:
        if self._entered:
            _STATE.stack.pop()
            _STATE.groups.pop()
        return False


class replay_region:
    """Internal: runs a replayed call (an activation-checkpointing recompute) under exactly the
    recipe its original call saw (None: high precision), whatever regions are active now."""

    def __init__(self, recipe: Recipe | None) -> None:
        self.recipe = recipe

    def __enter__(self) -> None:
        _STATE.stack.append(self.recipe)

    def __exit__(self, *exc_info: object) -> bool:
        _STATE.stack.pop()
        return False

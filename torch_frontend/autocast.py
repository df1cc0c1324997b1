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


class _AutocastState:
    """The stack of active regions: each entry is a Recipe, or None for a disabled region."""

    def __init__(self) -> None:
        self.stack: list[Recipe | None] = []


_STATE = _AutocastState()


def current_recipe() -> Recipe | None:
    """The innermost active region's recipe, or None (high precision) outside any region or in
    a disabled one."""
    return _STATE.stack[-1] if _STATE.stack else None


class autocast:
    """Context manager: twinengine layers called inside quantize with `recipe`
    (``autocast(recipe)`` or ``autocast(recipe=recipe)``, the same signature as
    ``twinengine.jax.autocast``).

    ``autocast(enabled=False)`` runs them in high precision (also inside an enabled region).
    Regions nest; the innermost wins.

    Raises:
        TypeError: enabled without a twinengine Recipe (a TransformerEngine recipe is converted
            field by field, ``twinengine.te_migration.convert_te_recipe``).
    """

    def __init__(self, recipe: Recipe | None = None, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.recipe = check_autocast_recipe(enabled, recipe)

    def __enter__(self) -> "autocast":
        _STATE.stack.append(self.recipe if self.enabled else None)
        return self

    def __exit__(self, *exc_info: object) -> bool:
        _STATE.stack.pop()
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

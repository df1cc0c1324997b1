"""twinengine.jax.autocast: the recipe in force for ``twinengine.jax.dense`` (and the Flax
modules over it).

How the recipe enters a trace: ``dense`` reads the innermost region's recipe at trace time,
so the recipe becomes a constant of the traced program. The region is a JAX *user context*
(``jax.make_user_context``): its value is part of every JAX tracing and compilation cache key
(``jax.jit``, nested jits, ``lax.scan`` / ``cond`` / ``while_loop`` / ``fori_loop`` bodies,
``jax.checkpoint``, Flax's ``nn.scan`` / ``nn.remat``, ...). So

- the recipe flows into every transformation traced inside the region, and
- a cached program is never reused under another recipe: calling a jitted function under a
  different region (or none) re-traces it — entering the region inside or around ``jax.jit``
  both give the recipe in force at the call.

Passing ``recipe=`` to ``dense`` explicitly bypasses the regions. Recipes are hashable frozen
values; a new recipe value is a new trace, an equal one hits the cache.
"""

from __future__ import annotations

import jax

from ..linear import check_autocast_recipe
from ..recipe import Recipe

_REGION = jax.make_user_context(None)
"""The innermost region's recipe (None outside any region and in a disabled region)."""


def current_recipe() -> Recipe | None:
    """The innermost region's recipe (None outside any region or in a disabled one)."""
    return _REGION.value


class autocast:
    """Context manager: ``twinengine.jax.dense`` calls inside quantize with `recipe`
    (``enabled=False``: high precision). Regions nest; the innermost wins. It may be entered
    inside or around jitted functions and transformations (see the module docstring).

    Raises:
        TypeError: enabled without a twinengine Recipe (a TransformerEngine recipe is converted
            field by field, ``twinengine.te_migration.convert_te_recipe``).
    """

    def __init__(self, recipe: Recipe | None = None, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.recipe = check_autocast_recipe(enabled, recipe)
        self._contexts: list = []

    def __enter__(self) -> "autocast":
        context = _REGION(self.recipe if self.enabled else None)
        context.__enter__()
        self._contexts.append(context)
        return self

    def __exit__(self, *exc_info: object) -> bool:
        self._contexts.pop().__exit__(*exc_info)
        return False

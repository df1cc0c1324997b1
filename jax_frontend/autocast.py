"""twinengine.jax.autocast: the recipe in force for ``twinengine.jax.dense``, for use inside
jitted code.

How the recipe enters a trace: ``dense`` reads the innermost region's recipe at trace time,
so the recipe becomes a constant of the traced program. That is only safe when the region is
entered inside the same staged function (the same ``jax.jit``, ``lax.scan`` body, …) that
calls ``dense``: otherwise ``jax.jit`` would reuse the cached program, with the recipe of the
first trace, when called later under another region. Each region therefore records the JAX
trace it was entered under, and ``dense`` raises when a staging boundary (a jaxpr trace) lies
between that trace and its own: a jitted function never silently keeps a stale recipe.
Transformations that re-trace on every call (``jax.grad``, ``jax.vmap`` outside jit) are fine.
Passing ``recipe=`` to ``dense`` explicitly bypasses the regions.

The state is a stack in plain instance attributes of one module-level object.
"""

from __future__ import annotations

from typing import Any

# JAX's trace context, as Flax uses it to detect transformation boundaries.
from jax._src import core as _jax_core
from jax._src.interpreters.partial_eval import DynamicJaxprTrace

from ..linear import check_autocast_recipe
from ..recipe import Recipe


def _current_trace() -> Any:
    return _jax_core.trace_ctx.trace


class _AutocastState:
    """The stack of active regions: (recipe or None, trace entered under)."""

    def __init__(self) -> None:
        self.stack: list[tuple[Recipe | None, Any]] = []


_STATE = _AutocastState()


def current_recipe() -> Recipe | None:
    """The innermost region's recipe (None outside any region or in a disabled one).

    Raises:
        RuntimeError: the innermost region was entered outside a staged function (jit, scan
            body, …) that the caller is being traced in, so its recipe would be baked into a
            cached program and silently reused under other regions.
    """
    if not _STATE.stack:
        return None
    recipe, entered = _STATE.stack[-1]
    trace = _current_trace()
    while trace is not None and trace is not entered:
        if isinstance(trace, DynamicJaxprTrace):
            break
        trace = getattr(trace, "parent_trace", None)
    if trace is not entered:
        raise RuntimeError(
            "twinengine.jax.autocast: this region was entered outside the jitted (staged) function that calls "
            "twinengine.jax.dense, so its recipe would be baked into the cached compiled program and silently kept "
            "for later calls under other recipes; enter autocast inside the jitted function, or pass recipe= to "
            "dense (or make the recipe a static argument)")
    return recipe


class autocast:
    """Context manager: ``twinengine.jax.dense`` calls inside quantize with `recipe`
    (``enabled=False``: high precision). Regions nest; the innermost wins. Enter it inside
    the jitted function (see the module docstring).

    Raises:
        TypeError: enabled without a twinengine Recipe.
    """

    def __init__(self, recipe: Recipe | None = None, *, enabled: bool = True) -> None:
        check_autocast_recipe(enabled, recipe)
        self.enabled = enabled
        self.recipe = recipe

    def __enter__(self) -> "autocast":
        _STATE.stack.append((self.recipe if self.enabled else None, _current_trace()))
        return self

    def __exit__(self, *exc_info: object) -> bool:
        _STATE.stack.pop()
        return False

"""The basic-operation API of twinengine.jax.ops (the same three pieces as twinengine.pytorch.ops).

- ``op_forward_compute(x, params, **kwargs) -> (y, saved)``: math only; ``saved`` any pytree;
- ``op_forward_save_ctx(ctx, saved)``: puts ``saved`` on the context (default ``ctx.save(saved)``);
- ``op_backward(ctx, dy) -> (dx, dparams)``.

A user op may instead define ``op_forward(ctx, x, params, **kwargs) -> y``. Both, or neither, is
a TypeError at class creation (the same core check and text as the torch frontend). Params are
explicit tuples of arrays; ops hold only static configuration, so a ``Sequential`` is a
``custom_vjp`` over the plan and works under ``jax.jit``, ``jax.grad`` and ``jax.vmap``.
"""

from __future__ import annotations

from typing import Any

from ...fusion.ops import OpDesc, check_op_api


class OpContext:
    """Per-op context of one Sequential call: ``save(saved)`` keeps any pytree (its arrays become
    custom_vjp residuals, other leaves stay Python values); ``saved`` gives it back in the
    backward; ``static`` holds the call's static kwargs."""

    def __init__(self, static: dict | None = None) -> None:
        self.saved: Any = None
        self.static = static or {}

    def save(self, saved: Any) -> None:
        self.saved = saved

    def save_for_backward(self, *arrays: Any) -> None:
        self.saved = tuple(arrays)

    @property
    def saved_tensors(self) -> tuple:
        return tuple(self.saved)


class BasicOperation:
    """Base of every JAX basic op (built-in and user-defined).

    Subclasses may override ``describe`` (default: a user op, never fused), ``init_params``
    (default: no parameters) and the call hooks below.
    """

    num_extra_inputs: int = 0
    num_extra_outputs: int = 0
    _abstract_op = True
    _legacy_forward = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_abstract_op", False):
            return
        has_legacy = _defines(cls, "op_forward")
        has_split = _defines(cls, "op_forward_compute")
        check_op_api(cls.__name__, has_legacy, has_split, _defines(cls, "op_backward"))
        cls._legacy_forward = has_legacy

    def describe(self) -> OpDesc:
        return OpDesc("user", type(self).__name__)

    def init_params(self, key: Any, dtype: Any) -> tuple:
        """Initial parameters (a tuple of arrays); none by default."""
        return ()

    def init_state(self, recipe: Any = None) -> Any:
        """Initial per-op state for `recipe` (a pytree or None)."""
        return None

    def op_call(self, recipe: Any, state: Any, rng: Any, training: bool) -> tuple[dict, dict]:
        """Per-call (static kwargs, array kwargs) of compute."""
        return {}, {}

    def op_input_quantization(self, static: dict, arrays: dict) -> dict | None:
        """How this op wants its input quantized in this call ({"quantizer", "scale"}), or None."""
        return None

    def op_grad_quantization(self, ctx: OpContext) -> dict | None:
        """How this op quantizes the gradient of its output ({"quantizer", "scale", "rng"}), or None."""
        return None

    def op_forward_state(self, saved: Any) -> Any:
        """The op's state after the forward (e.g. delayed-scaling histories), or None."""
        return None

    def op_forward_save_ctx(self, ctx: OpContext, saved: Any) -> None:
        ctx.save(saved)

    def op_state_cotangent(self, ctx: OpContext) -> Any:
        """The cotangent handed back for the op's ``state`` input: by the delayed-scaling
        contract, the next state (None: zeros)."""
        return None


def _defines(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        if klass is BasicOperation:
            return False
        if name in klass.__dict__:
            return True
    return False

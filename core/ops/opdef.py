"""OpDef: the single description of an op that both frontends are generated from.

``OpDef.plan(...)`` validates arguments (raising the error text both frontends show) and
returns a :class:`KernelCall`: which registered kernel op to run (torch calls it by name
through ``twinengine._C.call``; JAX calls the FFI target ``twinengine_<op>``), the order of
its inputs, the shapes/dtypes of its outputs, and its attributes. The torch fake impl, the
torch real impl's allocation and JAX's ``result_shape_dtypes`` all come from that one plan.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

Shape = tuple[Any, ...]  # ints, or torch SymInts while tracing with dynamic shapes


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One output of a kernel call: its name (a QuantizedTensor field or a plain name),
    shape and canonical dtype name."""

    name: str
    shape: Shape
    dtype: str


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """A planned call of one registered kernel op (see csrc/ops/<family>.cc).

    Attributes:
        op: registered op name; the FFI target is ``"twinengine_" + op``.
        inputs: names of the input arrays, in the order the kernel takes them.
        outputs: the output specs, in the order the kernel writes them.
        attrs: (name, value) pairs; ints are passed as int64, floats as float32.
    """

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[TensorSpec, ...]
    attrs: tuple[tuple[str, int | float], ...]

    @property
    def ffi_target(self) -> str:
        return "twinengine_" + self.op

    def attr_dict(self) -> dict[str, int | float]:
        return dict(self.attrs)

    @functools.cached_property
    def memo(self) -> dict[Any, Any]:
        """Scratch a frontend may fill with data derived from this (immutable) call, such as its
        packed output views; plans of static arguments are cached, so this lives as long."""
        return {}


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One op of a family.

    Attributes:
        name: public op name (``torch.ops.twinengine.<name>``, ``twinengine.jax.<name>``).
        args: names of the array arguments.
        attrs: names of the static (non-array) arguments.
        validate: raises TypeError/ValueError with the shared message for bad arguments.
        infer: returns the KernelCall for valid arguments.
    """

    name: str
    args: tuple[str, ...]
    attrs: tuple[str, ...]
    validate: Callable[..., None]
    infer: Callable[..., KernelCall]

    def plan(self, *args: Any, **kwargs: Any) -> KernelCall:
        """validate(...) then infer(...) on the same arguments."""
        self.validate(*args, **kwargs)
        return self.infer(*args, **kwargs)

    def cached_plan(self, *args: Any, **kwargs: Any) -> KernelCall:
        """plan(...), cached for static arguments (ArrayMetas of int shapes, quantizers, plain
        values): an eager call repeating a shape and a quantizer validates and packs once, and
        returns the same KernelCall (whose ``memo`` then keeps the frontend's packed call).
        Arguments holding arrays or symbolic shapes are planned afresh every time. For eager
        paths and real kernel impls; code that torch.compile traces calls ``plan``."""
        key = _static_key(args + (tuple(sorted(kwargs.items())) if kwargs else ()))
        key = None if key is None else (self.name, key)
        if key is not None:
            call = _PLAN_CACHE.get(key)
            if call is not None:
                return call
        self.validate(*args, **kwargs)
        call = self.infer(*args, **kwargs)
        if key is not None:
            if len(_PLAN_CACHE) >= _PLAN_CACHE_LIMIT:
                _PLAN_CACHE.clear()
            _PLAN_CACHE[key] = call
        return call


_PLAN_CACHE: dict[Any, KernelCall] = {}
_PLAN_CACHE_LIMIT = 4096
_PLAIN = (type(None), bool, int, float, str)


def _static_key(value: Any) -> Any:
    """A hashable key equal only for equal static values (plain scalars tagged with their type,
    so True and 1 differ; types with a ``plan_key()`` method, e.g. quantizers and ArrayMetas of
    int shapes), or None when `value` holds anything else (arrays, SymInts, QuantizedTensors)."""
    t = type(value)
    if t in _PLAIN:
        return (t, value)
    plan_key = getattr(t, "plan_key", None)
    if plan_key is not None:
        return plan_key(value)
    if t is tuple or t is list:
        items = []
        for v in value:
            k = _static_key(v)
            if k is None:
                return None
            items.append(k)
        return (t, tuple(items))
    return None


def dims(shape: Sequence[Any]) -> str:
    """A shape as text for error messages, "(2, 3)" / "(5,)" (call it on the failure path only).

    Built from ``f"{int(d)}"`` pieces so that under ``torch.compile`` with symbolic sizes the text
    is a constant (Dynamo specializes ``int(d)`` but cannot turn a formatted tuple of sizes into
    a string), and our error can reach the user with its text.
    """
    parts = [f"{int(d)}" for d in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def fail(op: str, exc_type: type[Exception], message: str) -> None:
    """Raises ``exc_type("twinengine.<op>: <message>")`` — the one error format of every op."""
    raise exc_type(f"twinengine.{op}: {message}")


def flatten_2d(shape: Sequence[Any]) -> tuple[Any, Any]:
    """(R, K) of a shape flattened to 2-D: R = prod(shape[:-1]), K = shape[-1]."""
    rows = 1
    for dim in shape[:-1]:
        rows = rows * dim
    return rows, shape[-1]


def round_up(value: Any, multiple: int) -> Any:
    return (value + multiple - 1) // multiple * multiple


def ceil_div(value: Any, divisor: int) -> Any:
    return (value + divisor - 1) // divisor


def check_array(op: str, name: str, shape: Sequence[Any], dtype: str, *, expect_shape: Sequence[Any] | None = None,
                expect_dtypes: Sequence[str] | None = None) -> None:
    """Shared dtype/shape check of one array argument."""
    if expect_dtypes is not None and dtype not in expect_dtypes:
        fail(op, TypeError, f"{name} must have dtype {' or '.join(expect_dtypes)}, got {dtype}")
    if expect_shape is not None and tuple(shape) != tuple(expect_shape):
        fail(op, ValueError, f"{name} must have shape {dims(expect_shape)}, got {dims(shape)}")


def check_device(op: str, name: str, device_type: str, supported: Sequence[str]) -> None:
    """Shared device check: device_type is "cpu", "cuda", ... as the frontend reports it."""
    if device_type not in supported:
        fail(op, ValueError, f"{name} is on device '{device_type}', but this build supports "
             f"{' and '.join(repr(s) for s in supported)}")

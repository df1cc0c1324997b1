"""Handing arrays and QuantizedTensors from one framework to the other without copying.

The frontends supply how one array crosses (DLPack); this module applies it to a plain array or
to every present array of a QuantizedTensor, keeps the quantizer, shape and dtype, and checks
what both directions must refuse with the same text.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .ops.opdef import fail
from .quantized_tensor import ARRAY_FIELDS, QuantizedTensor


def hand_over(op: str, value: Any, convert: Callable[[str, Any], Any], device_of: Callable[[Any], str]) -> Any:
    """``convert(name, array)`` applied to `value` (a plain array) or to each present array field
    of a QuantizedTensor (name = field name); quantizer, shape and dtype are kept.

    Raises:
        ValueError: the arrays of one QuantizedTensor live on different devices.
    """
    if not isinstance(value, QuantizedTensor):
        return convert("x", value)
    present = {name: getattr(value, name) for name in ARRAY_FIELDS if getattr(value, name) is not None}
    devices = {name: device_of(array) for name, array in present.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {device}" for name, device in devices.items())
        fail(op, ValueError, f"the QuantizedTensor's arrays live on different devices ({listing}); "
             "move them to one device first")
    return dataclasses.replace(value, **{name: convert(name, array) for name, array in present.items()})


def fail_not_contiguous(op: str, name: str, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    fail(op, ValueError, f"{name} is not contiguous (shape {shape}, strides {strides}); DLPack hands over "
         "dense row-major buffers only, so call .contiguous() (a copy) first")


def fail_no_device(op: str, name: str, device: str, target: str, available: str) -> None:
    fail(op, ValueError, f"{name} lives on {device}, but {target} has no device of that kind (it has {available}); "
         "move the array to a device both frameworks see first")


def fail_dtype(op: str, name: str, dtype: str, reason: str) -> None:
    fail(op, TypeError, f"{name} has dtype {dtype}, which cannot be handed over without a copy: {reason}")

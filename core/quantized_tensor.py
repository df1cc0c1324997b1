"""QuantizedTensor: the arrays of one quantized tensor plus the spec that made them.

A plain dataclass — not a tensor subclass — registered as a pytree by each frontend, so
Dynamo, AOTAutograd, ``torch.export`` and ``jax.jit`` see only plain arrays. The array
fields hold framework arrays (torch tensors or jax arrays); unused fields are None.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from . import quantizers as _quantizers
from .quantizers import Quantizer

ARRAY_FIELDS = (
    "rowwise_data",
    "rowwise_scale_inv",
    "columnwise_data",
    "columnwise_scale_inv",
    "amax",
    "columnwise_amax",
)
"""Names of the array-valued fields, in pytree-children order."""

PICKLE_CODECS: list[tuple[Callable[[Any], bool], Callable[[Any], Any], Callable[[Any], Any]]] = []
"""(matches(array), encode(array) -> picklable, decode(picklable) -> array) per frontend: torch
registers one for float8 tensors, which plain pickle cannot serialize (an upstream torch limit:
``pickle.dumps`` of a float8 tensor fails in UntypedStorage; ``torch.save`` works)."""


def _quantizer_state(q: Quantizer | None) -> dict[str, Any] | None:
    if q is None:
        return None
    return {"type": type(q).__name__, **{f.name: getattr(q, f.name) for f in dataclasses.fields(q)}}


def _quantizer_from_state(state: dict[str, Any] | None) -> Quantizer | None:
    if state is None:
        return None
    fields = dict(state)
    cls = getattr(_quantizers, str(fields.pop("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, Quantizer)):
        raise ValueError(f"twinengine.QuantizedTensor: {state['type']!r} is not a quantizer type")
    return cls(**fields)


@dataclasses.dataclass
class QuantizedTensor:
    """A quantized tensor (NUMERICS.md layouts).

    Attributes:
        rowwise_data / rowwise_scale_inv: the rowwise copy and its decode scales.
        columnwise_data / columnwise_scale_inv: the columnwise copy and its decode scales.
        amax: fp32 (1,) amax of the input (per-tensor formats) or the NVFP4 rowwise global amax.
        columnwise_amax: fp32 (1,) NVFP4 global amax of the columnwise copy.
        quantizer: the spec that produced it.
        shape: the logical (high-precision) shape.
        dtype: canonical name of the high-precision dtype it was quantized from.
    """

    rowwise_data: Any = None
    rowwise_scale_inv: Any = None
    columnwise_data: Any = None
    columnwise_scale_inv: Any = None
    amax: Any = None
    columnwise_amax: Any = None
    quantizer: Quantizer | None = None
    shape: tuple[int, ...] = ()
    dtype: str = "float32"

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Quantizer | None, tuple[int, ...], str]]:
        """(children, aux): the array fields in ARRAY_FIELDS order, then (quantizer, shape, dtype)."""
        return tuple(getattr(self, name) for name in ARRAY_FIELDS), (self.quantizer, self.shape, self.dtype)

    def state_dict(self) -> dict[str, Any]:
        """A plain dict — arrays, str, int, bool, float, lists — for ``torch.save`` (loadable with
        ``torch.load(weights_only=True)``), ``np.savez`` or any checkpointing library: the
        present array fields under their names, ``"quantizer"`` as a dict of its fields,
        ``"shape"`` and ``"dtype"``. ``QuantizedTensor.from_state_dict`` inverts it."""
        state: dict[str, Any] = {name: getattr(self, name) for name in ARRAY_FIELDS if getattr(self, name) is not None}
        state.update(quantizer=_quantizer_state(self.quantizer), shape=[int(d) for d in self.shape], dtype=self.dtype)
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "QuantizedTensor":
        """The QuantizedTensor a ``state_dict()`` describes (arrays used as given)."""
        arrays = {name: state.get(name) for name in ARRAY_FIELDS}
        return cls(**arrays, quantizer=_quantizer_from_state(state.get("quantizer")), shape=tuple(state["shape"]),
                   dtype=state["dtype"])

    def __getstate__(self) -> dict[str, Any]:
        state = self.state_dict()
        for name in ARRAY_FIELDS:
            for index, (matches, encode, _) in enumerate(PICKLE_CODECS):
                if name in state and matches(state[name]):
                    state[name] = ("twinengine-codec", index, encode(state[name]))
                    break
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        for name in ARRAY_FIELDS:
            value = state.get(name)
            if isinstance(value, tuple) and len(value) == 3 and value[0] == "twinengine-codec":
                state[name] = PICKLE_CODECS[value[1]][2](value[2])
        restored = QuantizedTensor.from_state_dict(state)
        self.__dict__.update(restored.__dict__)

    @classmethod
    def tree_unflatten(cls, aux: tuple[Quantizer | None, tuple[int, ...], str], children: Any) -> "QuantizedTensor":
        quantizer, shape, dtype = aux
        return cls(**dict(zip(ARRAY_FIELDS, children)), quantizer=quantizer, shape=shape, dtype=dtype)

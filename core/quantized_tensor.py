"""QuantizedTensor: the arrays of one quantized tensor plus the spec that made them.

A plain dataclass — not a tensor subclass — registered as a pytree by each frontend, so
Dynamo, AOTAutograd, ``torch.export`` and ``jax.jit`` see only plain arrays. The array
fields hold framework arrays (torch tensors or jax arrays); unused fields are None.
"""

from __future__ import annotations

import dataclasses
from typing import Any

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

    @classmethod
    def tree_unflatten(cls, aux: tuple[Quantizer | None, tuple[int, ...], str], children: Any) -> "QuantizedTensor":
        quantizer, shape, dtype = aux
        return cls(**dict(zip(ARRAY_FIELDS, children)), quantizer=quantizer, shape=shape, dtype=dtype)

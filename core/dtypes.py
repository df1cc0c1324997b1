"""Element types by canonical name, shared by both frontends.

Core never imports torch or jax: dtypes are their canonical NumPy/ml_dtypes names
("float32", "bfloat16", "float8_e4m3fn", ...). Each frontend maps names to its own dtype
objects and codes them for the C ABI with :data:`ABI_CODES`.
"""

from __future__ import annotations

HIGH_PRECISION = ("float32", "bfloat16", "float16")
"""Input / output dtypes of quantize and dequantize (NUMERICS.md §1)."""

FP8_DTYPES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
"""FP8 element format -> dtype name of its data."""

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
"""Largest finite value of each FP8 format."""

ABI_CODES = {
    "float32": 0,
    "bfloat16": 1,
    "float16": 2,
    "float8_e4m3fn": 3,
    "float8_e5m2": 4,
    "uint8": 5,
    "int32": 6,
    "int64": 7,
    "uint32": 8,
}
"""Canonical dtype name -> TweDType value of csrc/include/twinengine/common.h."""


def canonical_dtype(dtype: object) -> str:
    """Framework-neutral name of a dtype given as a string, torch.dtype, NumPy or JAX dtype
    ("torch.bfloat16" -> "bfloat16", np.dtype("float32") / jnp.float32 -> "float32").

    Unknown dtypes keep their normalized name, so the op's own check can reject them with
    the same text in both frontends.
    """
    import numpy as np

    if not isinstance(dtype, str) and type(dtype).__module__ != "torch":
        try:
            return np.dtype(dtype).name  # NumPy dtypes and scalar types, JAX / ml_dtypes types
        except TypeError:
            pass
    return str(dtype).removeprefix("torch.")

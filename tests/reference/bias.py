"""Independent NumPy reference of bias add, residual add, constant scale and the bias gradient
(NUMERICS.md §11). Written from the spec only; never imports twinengine's kernels or frontends, torch
or jax (it builds on the independent twinengine.testing.reference)."""

from __future__ import annotations

import numpy as np

from twinengine.testing.reference import round_to_dtype_ref, to_fp32
from .sums import canonical_sum_ref


def bias_add_ref(x, bias, out_dtype: str) -> np.ndarray:
    """fl(x + bias) (bias broadcast over the rows), RNE to `out_dtype`."""
    with np.errstate(all="ignore"):
        return round_to_dtype_ref(to_fp32(x) + to_fp32(bias), out_dtype)


def add_ref(x, y, out_dtype: str) -> np.ndarray:
    """fl(x + y), RNE to `out_dtype`."""
    with np.errstate(all="ignore"):
        return round_to_dtype_ref(to_fp32(x) + to_fp32(y), out_dtype)


def scale_ref(x, c: float, out_dtype: str) -> np.ndarray:
    """fl(x · fl32(c)), RNE to `out_dtype`."""
    with np.errstate(all="ignore"):
        return round_to_dtype_ref(to_fp32(x) * np.float32(c), out_dtype)


def bias_grad_ref(dy, out_dtype: str) -> np.ndarray:
    """Σc over the rows of dy flattened to (R, K), RNE to `out_dtype`; zeros for R = 0."""
    dy = to_fp32(dy)
    k = dy.shape[-1]
    rows = dy.reshape(-1, k)
    with np.errstate(all="ignore"):
        return round_to_dtype_ref(canonical_sum_ref(rows, axis=0), out_dtype)

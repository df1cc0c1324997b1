"""Independent NumPy reference of the canonical 32-lane sum (NUMERICS.md §11).

Written from the spec only; never imports twinengine, torch or jax.
"""

from __future__ import annotations

import numpy as np

LANES = 32


def canonical_sum_ref(v: np.ndarray, axis: int = -1) -> np.ndarray:
    """Σc of float32 `v` along `axis`: lane l (0..31) adds v[l], v[l+32], ... sequentially in
    fp32 from +0 (an empty lane is 0), then the 32 partials are folded by halves
    (p_l = fl(p_l + p_{l+16}) for l < 16, then +8, +4, +2, +1) and p_0 is the result.

    Shapes: v (..., n, ...) -> v with `axis` removed. Dtypes: float32 in and out.
    """
    v = np.moveaxis(np.asarray(v, dtype=np.float32), axis, -1)
    n = v.shape[-1]
    partials = np.zeros(v.shape[:-1] + (LANES,), np.float32)
    for i in range(n):  # sequential per lane, in index order
        partials[..., i % LANES] = partials[..., i % LANES] + v[..., i]
    half = LANES // 2
    while half > 0:
        partials[..., :half] = partials[..., :half] + partials[..., half:2 * half]
        half //= 2
    return partials[..., 0].copy()

"""The CPU GEMM's documented accumulation order (NUMERICS.md §8), in NumPy, independent of the library.

Every output element is one fp32 FMA chain over K in increasing order, started at +0:
``c = +0; for k: c = fma(a[i, k], b[j, k], c)`` with a single rounding per step. The fp32 FMA is
emulated exactly in float64: the product of two fp32 values is exact there, the sum is rounded
once to float64 with its exact error (TwoSum), and the one case where that double rounding can
differ from a single rounding (the float64 sum lands exactly on an fp32 midpoint) is resolved by
the sign of the error.
"""

import numpy as np


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fl32(a · b + c) with one rounding (round to nearest even), elementwise, fp32 inputs."""
    p = a.astype(np.float64) * b.astype(np.float64)  # exact: 24 + 24 significant bits
    c64 = c.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)  # TwoSum: p + c == s + err exactly (finite values)
        r = s.astype(np.float32)
        d = s - r.astype(np.float64)
        neighbor = np.nextafter(r, np.where(d > 0, np.float32(np.inf), np.float32(-np.inf)))
        midpoint = (d != 0) & (s == (r.astype(np.float64) + neighbor.astype(np.float64)) / 2)
        # At a midpoint the float64 rounding hid which side the exact value lies on: err says.
        away = midpoint & np.isfinite(err) & (err != 0) & (np.sign(err) == np.sign(d))
        toward = midpoint & np.isfinite(err) & (err != 0) & (np.sign(err) != np.sign(d))
    out = np.where(away, neighbor, r)
    return np.where(toward, r, out).astype(np.float32)


def chain_dot_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(M, N) fp32: element (i, j) = the FMA chain over k of a[i, k] · b[j, k] from +0 (a (M, K), b (N, K))."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    c = np.zeros((a.shape[0], b.shape[0]), np.float32)
    for k in range(a.shape[1]):
        c = fma_f32(a[:, k:k + 1], b[None, :, k], c)
    return c

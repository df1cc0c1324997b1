"""Independent NumPy reference of dropout (NUMERICS.md §11). Written from the spec only;
never imports twinengine's kernels or frontends, torch
or jax (it builds on the independent twinengine.testing.reference)."""

from __future__ import annotations

import numpy as np

from twinengine.testing.reference import philox4x32_10_ref, round_to_dtype_ref, to_fp32

DROP_TAG = 0x44524F50  # "DROP", the fourth counter word


def dropout_keep_ref(n: int, p: float, seed: int, offset: int) -> np.ndarray:
    """bool (n,): element i kept iff word x_{i mod 4} of Philox4x32-10 under key (seed, 0) and
    counter (floor(i/4) mod 2^32, floor(i/2^34), offset, 0x44524F50) is >= floor(p·2^32), p the
    fp32 value."""
    p32 = float(np.float32(p))
    threshold = int(p32 * 2**32)  # exact: p32 has 24 bits, floor by int()
    j = np.arange((n + 3) // 4, dtype=np.uint64)
    c0 = (j & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    c1 = (j >> np.uint64(32)).astype(np.uint32)
    c2 = np.full(j.shape, offset & 0xFFFFFFFF, np.uint32)
    c3 = np.full(j.shape, DROP_TAG, np.uint32)
    words = np.stack(philox4x32_10_ref((c0, c1, c2, c3), (np.uint32(seed & 0xFFFFFFFF), np.uint32(0))), axis=1)
    return words.reshape(-1)[:n].astype(np.uint64) >= np.uint64(threshold)


def pack_mask_ref(keep: np.ndarray) -> np.ndarray:
    """uint8 (ceil(n/8),): bit i % 8 of byte i // 8 = keep[i]; padding bits 0."""
    return np.packbits(keep.astype(np.uint8), bitorder="little")


def dropout_scale_ref(p: float) -> np.float32:
    """fl(1 / fl(1 − p)) with p the fp32 value."""
    p32 = np.float32(p)
    return np.float32(np.float32(1) / (np.float32(1) - p32))


def dropout_fwd_ref(x, p: float, seed: int, offset: int, out_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(y, mask): kept values fl(x·fl(1/fl(1−p))) RNE to out_dtype, dropped +0.0."""
    x32 = to_fp32(x)
    keep = dropout_keep_ref(x32.size, p, seed, offset).reshape(x32.shape)
    with np.errstate(all="ignore"):
        y = np.where(keep, x32 * dropout_scale_ref(p), np.float32(0)).astype(np.float32)
    return round_to_dtype_ref(y, out_dtype), pack_mask_ref(keep.reshape(-1))


def dropout_bwd_ref(dy, mask: np.ndarray, p: float, out_dtype: str) -> np.ndarray:
    """fl(dy·fl(1/fl(1−p))) where the mask bit is set, +0.0 elsewhere."""
    dy32 = to_fp32(dy)
    keep = np.unpackbits(mask, bitorder="little")[: dy32.size].astype(bool).reshape(dy32.shape)
    with np.errstate(all="ignore"):
        return round_to_dtype_ref(np.where(keep, dy32 * dropout_scale_ref(p), np.float32(0)), out_dtype)

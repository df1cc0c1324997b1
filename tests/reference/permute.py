"""Independent NumPy reference for MoE token permutation (docs/NUMERICS.md §10).

Written from the spec only; it never imports twinengine, torch or jax. Loops are plain Python
over tokens and slots (test sizes are small); row copies and sums are NumPy.

Conventions
-----------
* ``x`` arrays are float32, ml_dtypes.bfloat16 or float16 (or raw uint8 bytes for permute,
  which only moves rows). Sums are float32, started from +0 and accumulated in ascending
  k / expert / hidden order with the product rounded before each add, then rounded once (RNE)
  to the output dtype.
* index map: ``routing_map`` int (T, topK) expert ids; ``row_id_map`` int32 (topK·T,) laid out
  [k][t]. mask map: ``routing_map`` (T, E) 0/1; ``row_id_map`` int32 (T, 2E+1): the kept
  destination rows in ascending expert order, then their expert ids, −1 padding, then n.
* "kept" pairs are routed pairs whose destination row is < num_out_tokens; rows nobody fills
  are zero.
"""

from __future__ import annotations

import numpy as np

from .sums import canonical_sum_ref

__all__ = [
    "row_id_map_index_ref",
    "row_id_map_mask_ref",
    "kept_pairs_ref",
    "permute_ref",
    "permute_bwd_ref",
    "unpermute_ref",
    "unpermute_bwd_ref",
    "sort_chunks_ref",
    "chunk_row_id_map_ref",
    "padded_rows_ref",
    "pad_offsets_ref",
    "permute_and_pad_ref",
    "pad_row_id_map_ref",
    "pad_splits_ref",
]


def row_id_map_index_ref(routing_map: np.ndarray, num_out_tokens: int) -> np.ndarray:
    """Index map: pairs sorted by expert id, stable in flattened (t, k) order; negative ids
    and positions >= num_out_tokens are −1."""
    T, K = routing_map.shape
    ids = routing_map.reshape(-1).astype(np.int64)
    flat = np.arange(T * K)
    valid = flat[ids >= 0]
    order = valid[np.argsort(ids[valid], kind="stable")]
    out = np.full(K * T, -1, dtype=np.int32)
    for p, f in enumerate(order):
        if p < num_out_tokens:
            t, k = divmod(int(f), K)
            out[k * T + t] = p
    return out


def row_id_map_mask_ref(routing_map: np.ndarray, num_out_tokens: int) -> np.ndarray:
    """Mask map: expert-major destination rows (expert 0's tokens in token order, then 1, ...)."""
    T, E = routing_map.shape
    routed = routing_map != 0
    dest = np.full((T, E), -1, dtype=np.int64)
    row = 0
    for e in range(E):
        for t in range(T):
            if routed[t, e]:
                if row < num_out_tokens:
                    dest[t, e] = row
                row += 1
    out = np.full((T, 2 * E + 1), -1, dtype=np.int32)
    for t in range(T):
        experts = [e for e in range(E) if dest[t, e] >= 0]
        n = len(experts)
        out[t, :n] = [dest[t, e] for e in experts]
        out[t, E:E + n] = experts
        out[t, 2 * E] = n
    return out


def kept_pairs_ref(row_id_map: np.ndarray, map_type: str, num_tokens: int) -> list[list[tuple[int, int]]]:
    """Per token, its kept (destination row, probs column) pairs in ascending slot order."""
    pairs: list[list[tuple[int, int]]] = [[] for _ in range(num_tokens)]
    if map_type == "index":
        K = row_id_map.size // num_tokens
        for t in range(num_tokens):
            for k in range(K):
                row = int(row_id_map[k * num_tokens + t])
                if row >= 0:
                    pairs[t].append((row, k))
    else:
        E = (row_id_map.shape[1] - 1) // 2
        for t in range(num_tokens):
            n = int(row_id_map[t, 2 * E])
            pairs[t] = [(int(row_id_map[t, i]), int(row_id_map[t, E + i])) for i in range(n)]
    return pairs


def _round(acc: np.ndarray, dtype) -> np.ndarray:
    return acc.astype(np.float32).astype(dtype)


def permute_ref(x: np.ndarray, row_id_map: np.ndarray, map_type: str, num_out_tokens: int,
                probs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(output (num_out_tokens, H) rows moved unchanged, permuted_probs (num_out_tokens,))."""
    T = x.shape[0]
    out = np.zeros((num_out_tokens,) + x.shape[1:], dtype=x.dtype)
    pp = None if probs is None else np.zeros(num_out_tokens, dtype=probs.dtype)
    for t, pairs in enumerate(kept_pairs_ref(row_id_map, map_type, T)):
        for row, col in pairs:
            out[row] = x[t]
            if pp is not None:
                pp[row] = probs[t, col]
    return out, pp


def unpermute_ref(y: np.ndarray, row_id_map: np.ndarray, map_type: str, num_tokens: int,
                  merging_probs: np.ndarray | None = None) -> np.ndarray:
    """out[t] = Σ fl(y[row] · p) in fp32 from +0, ascending slot order, rounded once."""
    out = np.zeros((num_tokens, y.shape[1]), dtype=np.float32)
    for t, pairs in enumerate(kept_pairs_ref(row_id_map, map_type, num_tokens)):
        acc = np.zeros(y.shape[1], dtype=np.float32)
        for row, col in pairs:
            w = np.float32(1.0) if merging_probs is None else np.float32(merging_probs[t, col])
            acc = acc + y[row].astype(np.float32) * w
        out[t] = acc
    return _round(out, y.dtype)


def permute_bwd_ref(grad_out: np.ndarray, row_id_map: np.ndarray, map_type: str, num_tokens: int,
                    grad_pp: np.ndarray | None, num_slots: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(grad_inp = unpermute without probs, grad_probs[t, col] = grad_pp[row] for kept pairs)."""
    grad_inp = unpermute_ref(grad_out, row_id_map, map_type, num_tokens)
    grad_probs = None
    if grad_pp is not None:
        grad_probs = np.zeros((num_tokens, num_slots), dtype=grad_pp.dtype)
        for t, pairs in enumerate(kept_pairs_ref(row_id_map, map_type, num_tokens)):
            for row, col in pairs:
                grad_probs[t, col] = grad_pp[row]
    return grad_inp, grad_probs


def unpermute_bwd_ref(grad_out: np.ndarray, y: np.ndarray, row_id_map: np.ndarray, map_type: str,
                      merging_probs: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """grad_y[row] = fl(grad_out[t] · p); grad_probs[t, col] = Σc_h fl(grad_out[t,h] · y[row,h])
    (the canonical 32-lane sum, §11)."""
    T = grad_out.shape[0]
    grad_y = np.zeros(y.shape, dtype=y.dtype)
    grad_probs = None if merging_probs is None else np.zeros(merging_probs.shape, dtype=merging_probs.dtype)
    for t, pairs in enumerate(kept_pairs_ref(row_id_map, map_type, T)):
        g = grad_out[t].astype(np.float32)
        for row, col in pairs:
            if merging_probs is None:
                grad_y[row] = grad_out[t]
                continue
            grad_y[row] = _round(g * np.float32(merging_probs[t, col]), y.dtype)
            acc = canonical_sum_ref(g * y[row].astype(np.float32))
            grad_probs[t, col] = _round(np.array(acc), merging_probs.dtype)
    return grad_y, grad_probs


def chunk_row_id_map_ref(split_sizes, sorted_index, num_rows: int) -> np.ndarray:
    """Destination row of every input row when the chunks are concatenated in sorted_index order."""
    starts = np.concatenate([[0], np.cumsum(split_sizes)])
    out = np.full(num_rows, -1, dtype=np.int32)
    dst = 0
    for c in sorted_index:
        for r in range(starts[c], starts[c + 1]):
            out[r] = dst
            dst += 1
    return out


def sort_chunks_ref(x: np.ndarray, split_sizes, sorted_index) -> np.ndarray:
    """Concatenation of the row chunks of x in sorted_index order."""
    starts = np.concatenate([[0], np.cumsum(split_sizes)])
    return np.concatenate([x[starts[c]:starts[c + 1]] for c in sorted_index], axis=0)


# ---- padding of expert blocks (fused permute-and-pad, Fp8Padding) ------------------------------
# Each expert's (or split's) block of rows is padded with zero rows to a multiple of `align`;
# the padded tensor has the static worst-case row count (N + min(E, N)·(align − 1)) rounded
# down to a multiple of align; rows past the padded blocks are zero too.

def padded_rows_ref(num_rows: int, num_blocks: int, align: int) -> int:
    return (num_rows + min(num_blocks, num_rows) * (align - 1)) // align * align


def pad_offsets_ref(counts, align: int) -> tuple[np.ndarray, np.ndarray]:
    """(pad_offsets, padded_counts) int32 (E,): padded[e] = roundup(c, align);
    pad_offsets[e] = Σ_{j<e} (padded[j] − c_j)."""
    counts = [max(int(c), 0) for c in counts]
    padded = [-(-c // align) * align for c in counts]
    offsets = [sum(p - c for p, c in zip(padded[:e], counts[:e])) for e in range(len(counts))]
    return np.array(offsets, dtype=np.int32), np.array(padded, dtype=np.int32)


def permute_and_pad_ref(x: np.ndarray, probs: np.ndarray, mask: np.ndarray, align: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(output, permuted_probs, pad_offsets, padded_counts) built straight from the mask: expert
    by expert, its tokens in token order, then zero rows up to the block's padded size."""
    T, E = mask.shape
    counts = mask.astype(np.int64).sum(axis=0)
    rows = padded_rows_ref(int(counts.sum()), E, align)
    offsets, padded = pad_offsets_ref(counts, align)
    out = np.zeros((rows,) + x.shape[1:], dtype=x.dtype)
    pp = np.zeros(rows, dtype=probs.dtype)
    start = 0
    for e in range(E):
        tokens = [t for t in range(T) if mask[t, e]]
        for i, t in enumerate(tokens):
            out[start + i] = x[t]
            pp[start + i] = probs[t, e]
        start += int(padded[e])
    return out, pp, offsets, padded


def pad_row_id_map_ref(row_id_map: np.ndarray, pad_offsets: np.ndarray) -> np.ndarray:
    """A mask-map row_id_map with each kept row shifted by its expert's pad offset."""
    out = row_id_map.copy()
    E = (row_id_map.shape[1] - 1) // 2
    for t in range(row_id_map.shape[0]):
        for i in range(int(row_id_map[t, 2 * E])):
            out[t, i] = row_id_map[t, i] + pad_offsets[row_id_map[t, E + i]]
    return out


def pad_splits_ref(x: np.ndarray, splits, align: int) -> tuple[np.ndarray, np.ndarray]:
    """(padded (R, H), padded_splits) of consecutive row blocks of `splits` rows each."""
    rows = padded_rows_ref(x.shape[0], len(splits), align)
    _, padded = pad_offsets_ref(splits, align)
    out = np.zeros((rows,) + x.shape[1:], dtype=x.dtype)
    src = dst = 0
    for size, block in zip(splits, padded):
        out[dst:dst + size] = x[src:src + size]
        src += size
        dst += int(block)
    return out, padded

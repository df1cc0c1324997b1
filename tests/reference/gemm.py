"""Independent NumPy reference for the GEMM (NUMERICS.md §8), from the stored bytes.

Never imports twinengine's kernels or frontends (builds on twinengine.testing.reference). Operands come as their stored arrays (uint8 FP8 codes, scales) and
layout flags; the reference decodes them itself and computes in float64, returning the exact
result of the spec's math together with a bound on the fp32 summation error of any order.
"""

from __future__ import annotations

import numpy as np

from twinengine.testing.reference import decode_e2m1_ref, decode_fp8_ref, e8m0_to_float_ref, unpack_e2m1_ref

__all__ = ["per_tensor_operand_ref", "mxfp8_operand_ref", "fp8_block_operand_ref", "nvfp4_operand_ref",
           "high_precision_operand_ref", "gemm_ref", "gemm_tolerance_ref", "gemm_cuda_tolerance_ref",
           "swizzle_scales_ref",
           "unswizzle_scales_ref"]

_MX_BLOCK = 32


def _as_2d(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.reshape(-1, a.shape[-1])


def high_precision_operand_ref(x, columnwise: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values (rows, K), per-block scales (rows, 1) of ones) of a high-precision operand."""
    v = _as_2d(np.asarray(x).astype(np.float64))
    v = v.T if columnwise else v
    return v, np.ones((v.shape[0], 1))


def per_tensor_operand_ref(codes, fmt: str, scale_inv) -> tuple[np.ndarray, np.ndarray]:
    """A per-tensor FP8 copy as the GEMM reads it: stored (rows, K) K-major (rowwise data, or
    the transposed columnwise data), one fp32 scale_inv."""
    v = _as_2d(decode_fp8_ref(np.asarray(codes).view(np.uint8), fmt).astype(np.float64))
    return v, np.full((v.shape[0], 1), float(np.asarray(scale_inv).reshape(-1)[0]))


def mxfp8_operand_ref(codes, fmt: str, scale_codes, columnwise: bool) -> tuple[np.ndarray, np.ndarray]:
    """An MXFP8 copy as the GEMM reads it (§5): rowwise data (R, K) with scales [r, k/32];
    columnwise data (R, K) read transposed, (K, R), with scales [r/32, k] -> [k, r/32]."""
    v = _as_2d(decode_fp8_ref(np.asarray(codes).view(np.uint8), fmt).astype(np.float64))
    e = np.asarray(scale_codes).view(np.uint8)
    rows, cols = v.shape
    if columnwise:
        s = e8m0_to_float_ref(e[: rows // _MX_BLOCK, :cols]).astype(np.float64).T
        return v.T, s
    return v, e8m0_to_float_ref(e[:rows, : cols // _MX_BLOCK]).astype(np.float64)




def fp8_block_operand_ref(codes, fmt: str, scale_inv, block_2d: bool) -> tuple[np.ndarray, np.ndarray]:
    """An FP8-block copy (§6) as the GEMM reads it: K-major data (rows, K) (rowwise data, or the
    transposed columnwise data) with fp32 scales per 128 K: 1D stored (K/128, rows) R-minor, 2D
    per 128x128 tile (rows/128, K/128)."""
    v = _as_2d(decode_fp8_ref(np.asarray(codes).view(np.uint8), fmt).astype(np.float64))
    s = np.asarray(scale_inv, dtype=np.float64)
    rows, k = v.shape
    if block_2d:
        return v, np.repeat(s[: -(-rows // 128), : -(-k // 128)], 128, axis=0)[:rows]
    return v, s[: -(-k // 128), :rows].T


def nvfp4_operand_ref(packed, scale_codes, amax) -> tuple[np.ndarray, np.ndarray]:
    """An NVFP4 copy (§7) as the GEMM reads it (§8): K-major packed E2M1 (rows, K/2), E4M3 block
    scales per 16 K, times the global decode scale S_dec = 1/min(2688/A, FLT_MAX) (1 for A = 0)."""
    v = _as_2d(decode_e2m1_ref(unpack_e2m1_ref(np.asarray(packed).view(np.uint8))).astype(np.float64))
    rows, k = v.shape
    d = decode_fp8_ref(np.asarray(scale_codes).view(np.uint8)[:rows, : k // 16], "e4m3").astype(np.float64)
    a = np.float32(np.asarray(amax).reshape(-1)[0])
    s_enc = np.float32(1.0) if a == 0 else np.minimum(np.float32(2688.0) / a, np.float32(np.finfo(np.float32).max))
    s_enc = np.float32(1.0) if s_enc == 0 else s_enc
    return v, d * float(np.float32(1.0) / np.float32(s_enc))


def gemm_ref(a, b, bias=None) -> tuple[np.ndarray, np.ndarray]:
    """(exact, magnitude): out = Σ_blocks (Σ_{k∈block} a·b) · s_a · s_b (+ bias) in float64, and
    Σ_k |a·b · s_a · s_b| + |bias|, the scale for the fp32 summation error bound.

    a, b: (values (rows, K), scales (rows, n_blocks)) from the *_operand_ref functions.
    """
    (va, sa), (vb, sb) = a, b
    k = va.shape[1]
    n_blocks = max(sa.shape[1], sb.shape[1])
    block = k // n_blocks if n_blocks else k
    exact = np.zeros((va.shape[0], vb.shape[0]))
    magnitude = np.zeros_like(exact)
    for j in range(n_blocks):
        sl = slice(j * block, (j + 1) * block)
        scale = sa[:, min(j, sa.shape[1] - 1)][:, None] * sb[:, min(j, sb.shape[1] - 1)][None, :]
        exact += (va[:, sl] @ vb[:, sl].T) * scale
        magnitude += (np.abs(va[:, sl]) @ np.abs(vb[:, sl]).T) * scale
    if bias is not None:
        bias = np.asarray(bias).astype(np.float64)
        exact += bias[None, :]
        magnitude += np.abs(bias)[None, :]
    return exact, magnitude


_OUT_EPS = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def gemm_tolerance_ref(exact: np.ndarray, magnitude: np.ndarray, k: int, out_dtype: str) -> np.ndarray:
    """Allowed |out − exact|: fp32 accumulation of k products in any order plus the block
    scaling and bias additions, ((k + 4) · 2^-24) · magnitude, then one rounding to out_dtype."""
    acc = (k + 4) * 2.0**-24 * magnitude
    return acc + _OUT_EPS[out_dtype] * (np.abs(exact) + acc)


# Extra relative error of the CUDA (cuBLASLt) GEMM per format, times Σ|a·b·s| (docs/cuda.md):
# FP8/FP4 tensor cores add a few MMA steps in a narrower accumulator before cuBLASLt promotes
# the partial sums to fp32 (fast accumulation off); bf16/fp16 MMAs and fp32 GEMMs accumulate in fp32.
CUDA_FORMAT_REL = {"high_precision": 2.0**-20, "fp8_current": 2.0**-12, "fp8_delayed": 2.0**-12,
                   "mxfp8": 2.0**-12, "fp8_block": 2.0**-12, "nvfp4": 2.0**-12}


def gemm_cuda_tolerance_ref(exact: np.ndarray, magnitude: np.ndarray, k: int, out_dtype: str,
                            scaling_mode: str) -> np.ndarray:
    """Allowed |out − exact| of the CUDA GEMM: the fp32 bound of :func:`gemm_tolerance_ref` plus
    CUDA_FORMAT_REL[scaling_mode] · magnitude (cuBLASLt's accumulation is its own)."""
    return gemm_tolerance_ref(exact, magnitude, k, out_dtype) + CUDA_FORMAT_REL[scaling_mode] * magnitude


def swizzle_scales_ref(compact, transposed: bool = False) -> np.ndarray:
    """Block scales in cuBLASLt's 128x4 tiled layout (NUMERICS.md §5; NVIDIA's "1D block scaling
    factors layout", as torchao's ``to_blocked`` writes it), as a flat uint8 array.

    compact: (rows, blocks) — or (blocks, rows) when transposed — rows a multiple of 128,
    blocks of 4. Built by reshapes, not by an index formula: the (rows, blocks) array is cut
    into 128x4 tiles taken row-major, and each tile's 128 rows, split as (4, 32), are
    interleaved so that row r lands at (r mod 32)·16 + floor(r/32)·4.
    """
    s = np.asarray(compact).view(np.uint8)
    s = s.T if transposed else s
    rows, blocks = s.shape
    assert rows % 128 == 0 and blocks % 4 == 0, "pad to (128k, 4k) first"
    tiles = s.reshape(rows // 128, 128, blocks // 4, 4).transpose(0, 2, 1, 3)  # (row tile, col tile, 128, 4)
    return np.ascontiguousarray(tiles.reshape(-1, 4, 32, 4).transpose(0, 2, 1, 3)).reshape(-1)


def unswizzle_scales_ref(tiled, rows: int, blocks: int, transposed: bool = False) -> np.ndarray:
    """Inverse of :func:`swizzle_scales_ref`: the compact (rows, blocks) (or (blocks, rows)) array."""
    t = np.asarray(tiled).view(np.uint8).reshape(rows // 128, blocks // 4, 32, 4, 4)  # (rt, ct, r%32, r//32, c)
    s = t.transpose(0, 1, 3, 2, 4).reshape(rows // 128, blocks // 4, 128, 4).transpose(0, 2, 1, 3)
    s = s.reshape(rows, blocks)
    return np.ascontiguousarray(s.T if transposed else s)


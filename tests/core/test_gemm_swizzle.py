"""The host scale swizzle (csrc/cpu/gemm_swizzle.cc, the same index header as the CUDA kernel)
against a NumPy model of NVIDIA's 128x4 tiled layout (NUMERICS.md §5), through the extension's
host-only op ``gemm_swizzle_scales``."""

from __future__ import annotations

import numpy as np
import pytest
from reference.gemm import swizzle_scales_ref, unswizzle_scales_ref

import twinengine._C as _C

_UINT8 = 5  # TweDType kTweUInt8
_CPU = 0


def _view(a: np.ndarray):
    return (a.ctypes.data, _UINT8, _CPU, tuple(a.shape))


def _run(x: np.ndarray, out_shape, *, transposed: bool, inverse: bool) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.uint8)
    out = np.full(out_shape, 0xAB, dtype=np.uint8)
    _C.call("gemm_swizzle_scales", [_view(x)], [_view(out)], {"transposed": int(transposed), "inverse": int(inverse)})
    return out


def swizzle(compact: np.ndarray, transposed: bool = False) -> np.ndarray:
    return _run(compact, (compact.size,), transposed=transposed, inverse=False)


def unswizzle(tiled: np.ndarray, compact_shape, transposed: bool = False) -> np.ndarray:
    return _run(tiled, compact_shape, transposed=transposed, inverse=True)


def _marker(rows: int, blocks: int, r: int, c: int) -> np.ndarray:
    compact = np.zeros((rows, blocks), np.uint8)
    compact[r, c] = 1
    return compact


@pytest.mark.parametrize(
    "rows, blocks, r, c, offset",
    [
        # nvmath-python's documented cases for an NVFP4 (M=128, K=128) operand (8 K-groups).
        (128, 8, 5, 2, 82),
        (128, 8, 5, 5, 593),
        # NUMERICS.md §5: inside a tile (r mod 32)·16 + floor(r/32)·4 + c.
        (128, 4, 0, 0, 0),
        (128, 4, 31, 3, 31 * 16 + 3),
        (128, 4, 32, 0, 4),
        (128, 4, 127, 3, 31 * 16 + 3 * 4 + 3),
        # Tiles row-major: the first tile of the second 128-row band follows both tiles of the first.
        (256, 8, 128, 0, 2 * 512),
        (256, 8, 0, 4, 512),
        (256, 8, 129, 5, 3 * 512 + 16 + 1),
    ],
)
def test_gemm_swizzle_scales_known_index_mapping(rows, blocks, r, c, offset):
    compact = _marker(rows, blocks, r, c)
    tiled = swizzle(compact)
    assert np.flatnonzero(tiled).tolist() == [offset]
    assert np.flatnonzero(swizzle_scales_ref(compact)).tolist() == [offset]


SHAPES = [(128, 4), (128, 8), (256, 4), (384, 12), (128, 20), (512, 8)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transposed", [False, True], ids=["rowwise", "columnwise"])
def test_gemm_swizzle_scales_matches_reference_and_round_trips(shape, transposed):
    rows, blocks = shape
    rng = np.random.default_rng(rows * 1000 + blocks)
    compact_shape = (blocks, rows) if transposed else (rows, blocks)
    compact = rng.integers(0, 256, compact_shape, dtype=np.uint8)
    tiled = swizzle(compact, transposed)
    np.testing.assert_array_equal(tiled, swizzle_scales_ref(compact, transposed))
    np.testing.assert_array_equal(unswizzle(tiled, compact_shape, transposed), compact)
    np.testing.assert_array_equal(unswizzle_scales_ref(tiled, rows, blocks, transposed), compact)
    # The other composition: swizzle ∘ unswizzle is the identity on the tiled layout too.
    other = rng.integers(0, 256, tiled.shape, dtype=np.uint8)
    np.testing.assert_array_equal(swizzle(unswizzle(other, compact_shape, transposed), transposed), other)


@pytest.mark.parametrize("logical", [(70, 96, 32), (300, 64, 32), (16, 48, 16), (200, 1040, 16)],
                         ids=["mxfp8-70x96", "mxfp8-300x64", "nvfp4-16x48", "nvfp4-200x1040"])
def test_gemm_swizzle_scales_padded_operand_scales(logical):
    """Scales of an (R, K) operand padded to (roundup(R,128), roundup(K/block,4)) as the
    quantizers store them (padding 0): real scales keep their place, padding stays 0."""
    rows, k, block = logical
    padded = (-(-rows // 128) * 128, -(-(k // block) // 4) * 4)
    rng = np.random.default_rng(rows)
    compact = np.zeros(padded, np.uint8)
    compact[:rows, : k // block] = rng.integers(1, 255, (rows, k // block), dtype=np.uint8)
    tiled = swizzle(compact)
    np.testing.assert_array_equal(tiled, swizzle_scales_ref(compact))
    back = unswizzle(tiled, padded)
    np.testing.assert_array_equal(back, compact)
    assert np.count_nonzero(tiled) == rows * (k // block)


@pytest.mark.parametrize(
    "shape, transposed, message",
    [((100, 4), False, "must be padded to (128k, 4k)"), ((128, 6), False, "must be padded to (128k, 4k)"),
     ((128, 4), True, "must be padded to (4k, 128k)")],
)
def test_gemm_swizzle_scales_rejects_unpadded(shape, transposed, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        swizzle(np.zeros(shape, np.uint8), transposed)


def test_gemm_swizzle_scales_rejects_size_and_dtype_mismatch():
    x = np.zeros((128, 4), np.uint8)
    with pytest.raises(ValueError, match="same number of scales"):
        _run(x, (128 * 8,), transposed=False, inverse=False)
    f = np.zeros((128, 4), np.float32)
    out = np.zeros((128, 4), np.uint8)
    with pytest.raises(ValueError, match="scales must be uint8"):
        _C.call("gemm_swizzle_scales", [(f.ctypes.data, 0, _CPU, f.shape)], [_view(out)],
                {"transposed": 0, "inverse": 0})

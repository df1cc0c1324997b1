"""edge_values(dtype, fmt): the input families that break quantizers, as NumPy arrays of shape
(128, 128) — a shape every format accepts (1x16 ... 128x128 blocks), so each family can go
through every quantizer unchanged."""

from __future__ import annotations

import numpy as np

from . import reference as ref

SHAPE = (128, 128)
FAMILIES = ("ties", "format_subnormals", "input_subnormals", "max_and_over_max", "infinities", "nans",
            "zero_blocks", "constant_rows")
"""The keys of ``edge_values``."""

_FORMAT_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "e2m1": 6.0}
_NVFP4_GLOBAL = 2688.0  # 6 * 448: a global amax of exactly this gives NVFP4 a global scale of 1


def _numpy_dtype(name: str) -> np.dtype:
    import ml_dtypes

    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"edge_values: dtype must be float32, bfloat16 or float16, got {name!r}")
    return np.dtype(getattr(ml_dtypes, name, name))


def _positive_values(fmt: str) -> np.ndarray:
    """Every finite positive value of the element format, ascending."""
    if fmt == "e2m1":
        values = ref.decode_e2m1_ref(np.arange(8, dtype=np.uint8))
    else:
        values = ref.decode_fp8_ref(np.arange(256, dtype=np.uint8), fmt)
    values = values[np.isfinite(values) & (values > 0)]
    return np.unique(values.astype(np.float64))


def _anchored(cells: np.ndarray, fmt: str) -> np.ndarray:
    """`cells` (cycled to fill SHAPE) with the format's max on every row and column that is a
    multiple of 16, so every block of every format (1x16 ... 128x128, rowwise or columnwise)
    holds it: per-tensor, MXFP8 and FP8-block scales are then exactly 1 and each cell is
    quantized unscaled. For e2m1, element (0, 0) is 2688 = 6·448 so the NVFP4 global scale is 1
    too (its own block then has a larger scale)."""
    out = np.resize(cells, SHAPE).astype(np.float64)
    out[::16, :] = _FORMAT_MAX[fmt]
    out[:, ::16] = _FORMAT_MAX[fmt]
    if fmt == "e2m1":
        out[0, 0] = _NVFP4_GLOBAL
    return out


def _signed(values: np.ndarray) -> np.ndarray:
    return np.stack([values, -values], axis=1).reshape(-1)


def edge_values(dtype: str, fmt: str) -> dict[str, np.ndarray]:
    """The families of inputs on which quantizers go wrong, for element format `fmt` ("e4m3",
    "e5m2" or "e2m1") and input `dtype` ("float32", "bfloat16", "float16").

    Returns ``{family: array}``, each of shape (128, 128) and `dtype` (bfloat16 as ml_dtypes):
        ties: every midpoint between adjacent values of `fmt` (both signs), quantized unscaled
            (see the anchor rule: each block holds the format max), so round-half-to-even decides;
        format_subnormals: `fmt`'s subnormals and the midpoints below and between them, unscaled;
        input_subnormals: subnormals of `dtype` (an amax so small the scale saturates);
        max_and_over_max: the format max, the next `dtype` value above it, twice it (capped at the
            largest `dtype` value), and the largest `dtype` value;
        infinities: +inf and -inf among normal values (one whole row of each);
        nans: NaN (both signs) among normal values, and one all-NaN 32x32 tile;
        zero_blocks: normal values with all-zero rows 0..31 and columns 0..31 (-0.0 in part);
        constant_rows: every row one value (the format max, tiny, negative, -0.0, ...).
    Every value is exactly representable in `dtype`; NaN payloads are the default quiet NaN.
    Raises:
        ValueError: an unknown dtype or format.
    """
    if fmt not in _FORMAT_MAX:
        raise ValueError(f"edge_values: fmt must be 'e4m3', 'e5m2' or 'e2m1', got {fmt!r}")
    np_dtype = _numpy_dtype(dtype)
    values = _positive_values(fmt)
    fmt_max = _FORMAT_MAX[fmt]
    rng = np.random.default_rng(16)
    normal = (rng.standard_normal(SHAPE) * fmt_max / 4).astype(np_dtype).astype(np.float64)
    smallest_normal = {"e4m3": 2.0 ** -6, "e5m2": 2.0 ** -14, "e2m1": 1.0}[fmt]
    subnormals = values[values < smallest_normal]
    info = np.finfo(np_dtype) if dtype != "bfloat16" else None
    tiny = float(info.smallest_subnormal) if info is not None else 2.0 ** -133
    largest = float(info.max) if info is not None else float(ref.BF16_MAX)

    families: dict[str, np.ndarray] = {}
    families["ties"] = _anchored(_signed((values[:-1] + values[1:]) / 2), fmt)
    below = np.concatenate([[subnormals[0] / 2], (subnormals[:-1] + subnormals[1:]) / 2, subnormals,
                            [(subnormals[-1] + smallest_normal) / 2]])
    families["format_subnormals"] = _anchored(_signed(below), fmt)
    families["input_subnormals"] = np.resize(_signed(tiny * np.arange(1, 65)), SHAPE)
    unsigned = np.dtype(f"uint{8 * np_dtype.itemsize}")
    above = (np.array([fmt_max], np_dtype).view(unsigned) + 1).view(np_dtype)[0]  # the next value of dtype
    over = np.array([fmt_max, float(above), min(2 * fmt_max, largest), largest, -largest, -fmt_max, 1.0, -0.5])
    families["max_and_over_max"] = np.resize(over, SHAPE)
    infinities = normal.copy()
    infinities[::7, ::5] = np.inf
    infinities[3::7, 2::5] = -np.inf
    infinities[64], infinities[65] = np.inf, -np.inf
    families["infinities"] = infinities
    nans = normal.copy()
    nans[::9, ::4] = np.nan
    nans[4::9, 1::4] = -np.nan
    nans[32:64, 32:64] = np.nan
    families["nans"] = nans
    zeros = normal.copy()
    zeros[:32], zeros[:, :32] = 0.0, 0.0
    zeros[:16, :16] = -0.0
    families["zero_blocks"] = zeros
    row_values = np.array([fmt_max, -fmt_max, 1.0, -0.0, 0.0, smallest_normal, subnormals[0], 3.0, -2.0 ** -10, 1024.0])
    families["constant_rows"] = np.repeat(np.resize(row_values, SHAPE[0])[:, None], SHAPE[1], axis=1)

    out = {}
    for name in FAMILIES:
        with np.errstate(over="ignore"):
            wide = families[name].astype(np.float32)
        cast = wide.astype(np_dtype)
        exact = np.isnan(wide) | (cast.astype(np.float64) == families[name])
        if not exact.all():
            raise AssertionError(f"edge_values: {name} has values {dtype} cannot hold")  # a bug in this module
        out[name] = cast
    return out

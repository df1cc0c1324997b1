"""Independent NumPy reference for twinengine's quantization numerics.

Written from docs/NUMERICS.md sections 1-7 only; it imports nothing of twinengine (no kernels, no
frontends, no other module of the package), nor torch or jax: it is the independent reference the kernels
are tested against, shipped as ``twinengine.testing.reference`` so users can test their own kernels too.
Clarity over speed, but every routine is vectorized so ~1M elements take a few seconds.

Conventions used throughout
---------------------------
* Inputs ``x`` are numpy arrays of dtype float32, ml_dtypes.bfloat16 or float16 with rank >= 1.
  They are widened exactly to float32 first.  "Flattened to 2-D (R, K)" means
  ``R = prod(x.shape[:-1])`` and ``K = x.shape[-1]``.
* All scale arithmetic is float32: every operand is an ``np.float32`` array or scalar, so numpy
  never promotes to float64 (``_f32`` below is the only way constants enter the arithmetic).
  ``fl(a op b)`` in the spec is literally ``a op b`` on float32 operands here.
* FP8 / FP4 casts are written from the bits (ml_dtypes' casts do not saturate); ml_dtypes is
  used only for the fp32 <-> bf16/fp16 conversions, which it rounds RNE.
* Data outputs are ``np.uint8`` byte codes.  Scales are float32 or uint8 codes as the spec says.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

__all__ = [
    "FLT_MAX",
    "BF16_MAX",
    "FP16_MAX",
    "FP8_MAX",
    "to_fp32",
    "amax_ref",
    "cast_fp8_ref",
    "decode_fp8_ref",
    "cast_e2m1_ref",
    "decode_e2m1_ref",
    "pack_e2m1_ref",
    "unpack_e2m1_ref",
    "float_to_bf16_ref",
    "float_to_fp16_ref",
    "round_to_dtype_ref",
    "scale_from_amax_ref",
    "e8m0_from_block_amax_ref",
    "e8m0_to_float_ref",
    "e8m0_multiplier_ref",
    "quantize_fp8_current_ref",
    "quantize_fp8_delayed_ref",
    "delayed_scaling_update_ref",
    "record_amax_ref",
    "quantize_mxfp8_ref",
    "quantize_fp8_block_ref",
    "philox4x32_10_ref",
    "rht_matrix_ref",
    "rht_ref",
    "sr_random_bytes_ref",
    "quantize_nvfp4_ref",
    "dequantize_fp8_ref",
    "dequantize_mxfp8_ref",
    "dequantize_fp8_block_ref",
    "dequantize_nvfp4_ref",
]

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

FLT_MAX = np.float32(np.finfo(np.float32).max)  # 3.4028235e38
BF16_MAX = np.float32(ml_dtypes.finfo(ml_dtypes.bfloat16).max)  # 3.3895314e38
FP16_MAX = np.float32(65504.0)
FP8_MAX = {"e4m3": np.float32(448.0), "e5m2": np.float32(57344.0)}
E2M1_MAX = np.float32(6.0)
NVFP4_GLOBAL = np.float32(2688.0)  # 6 * 448

# (exponent bits, mantissa bits, bias, max finite, NaN code) of the mini-float formats.
_FORMATS = {
    "e4m3": (4, 3, 7, 448.0, 0x7F),
    "e5m2": (5, 2, 15, 57344.0, 0x7F),
    "e2m1": (2, 1, 1, 6.0, 0x07),  # FP4 has no NaN: NaN encodes as +6 (0x7)
}


def _f32(value) -> np.float32:
    """A Python/NumPy scalar as an exact-or-RNE float32 scalar."""
    return np.float32(value)


def _check_fp8_fmt(fmt: str) -> None:
    if fmt not in ("e4m3", "e5m2"):
        raise ValueError(f"unknown FP8 format {fmt!r} (expected 'e4m3' or 'e5m2')")


def _roundup(n: int, m: int) -> int:
    return ((n + m - 1) // m) * m


def _ceildiv(n: int, m: int) -> int:
    return (n + m - 1) // m


def _pow2_f32(exponent) -> np.ndarray:
    """Exact float32 2**exponent for integer exponents in [-149, 127], built from the bits."""
    e = np.asarray(exponent, dtype=np.int64)
    if np.any(e < -149) or np.any(e > 127):
        raise ValueError("power of two out of float32 range")
    normal_bits = ((np.maximum(e, -126) + 127) << 23).astype(np.uint32)
    subnormal_bits = (np.uint64(1) << np.clip(e + 149, 0, 22).astype(np.uint64)).astype(np.uint32)
    bits = np.where(e >= -126, normal_bits, subnormal_bits).astype(np.uint32)
    return bits.view(np.float32)


# --------------------------------------------------------------------------------------------
# Input handling, amax
# --------------------------------------------------------------------------------------------

_INPUT_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
    np.dtype(np.float16): "float16",
}

_DTYPE_MAX = {"float32": FLT_MAX, "bfloat16": BF16_MAX, "float16": FP16_MAX}


def _input_dtype_name(x: np.ndarray) -> str:
    dt = np.asarray(x).dtype
    if dt not in _INPUT_DTYPES:
        raise TypeError(f"unsupported input dtype {dt} (expected float32, bfloat16 or float16)")
    return _INPUT_DTYPES[dt]


def to_fp32(x) -> np.ndarray:
    """Widen a float32/bfloat16/float16 array exactly to float32 (a new array)."""
    x = np.asarray(x)
    _input_dtype_name(x)
    return x.astype(np.float32)


def _as_2d(x) -> tuple[np.ndarray, int, int]:
    """(fp32 copy flattened to (R, K), R, K)."""
    x = np.asarray(x)
    if x.ndim < 1:
        raise ValueError("input must have rank >= 1")
    x32 = to_fp32(x)
    K = x.shape[-1]
    R = int(np.prod(x.shape[:-1], dtype=np.int64))
    return x32.reshape(R, K), R, K


def _abs_skip_nan(v: np.ndarray) -> np.ndarray:
    """|v| with NaN replaced by 0 (NaN never contributes to an amax; +-inf counts as +inf)."""
    a = np.abs(np.asarray(v, dtype=np.float32))
    return np.where(np.isnan(a), _f32(0.0), a)


def _amax_along(v: np.ndarray, axis) -> np.ndarray:
    """NaN-skipping max |v| over `axis`, starting from 0 (an all-NaN or empty set gives 0)."""
    return np.max(_abs_skip_nan(v), axis=axis, initial=_f32(0.0)).astype(np.float32)


def amax_ref(x) -> np.float32:
    """Maximum of |x| over the non-NaN elements, starting from 0; +-inf counts as +inf."""
    return np.float32(_amax_along(to_fp32(x), axis=None))


# --------------------------------------------------------------------------------------------
# Mini-float casts (FP8 E4M3/E5M2, FP4 E2M1), written from the bits
# --------------------------------------------------------------------------------------------


def _round_magnitude_sat(mag: np.ndarray, fmt: str) -> np.ndarray:
    """RNE of finite-or-inf non-negative float32 `mag` onto the format grid, saturating to max.

    The grid spacing ("quantum") at |v| is 2**(max(e, emin) - mbits) with e the unbiased fp32
    exponent of |v|.  |v| / quantum is an exact power-of-two rescale, np.rint rounds it
    half-to-even, and multiplying back by the quantum is exact again.
    """
    ebits, mbits, bias, maxval, _ = _FORMATS[fmt]
    maxval = _f32(maxval)
    emin = 1 - bias
    # Anything >= 2*max saturates anyway; clamping first keeps inf out of the arithmetic.
    mag = np.minimum(mag.astype(np.float32), _f32(2.0) * maxval)
    e = (mag.view(np.uint32) >> np.uint32(23)).astype(np.int64) - 127  # -127 for 0 / subnormal
    e = np.maximum(e, emin)
    quantum = _pow2_f32(e - mbits)
    rounded = (np.rint(mag / quantum) * quantum).astype(np.float32)
    return np.minimum(rounded, maxval)


def _encode_magnitude(r: np.ndarray, fmt: str) -> np.ndarray:
    """Code (without sign bit) of non-negative float32 values that lie exactly on the grid."""
    ebits, mbits, bias, _, _ = _FORMATS[fmt]
    emin = 1 - bias
    bits = r.view(np.uint32)
    exp_unbiased = (bits >> np.uint32(23)).astype(np.int64) - 127
    mant = ((bits >> np.uint32(23 - mbits)) & np.uint32((1 << mbits) - 1)).astype(np.int64)
    normal_code = ((exp_unbiased + bias) << mbits) | mant
    # Subnormal (and zero): the code is the integer count of the smallest quantum.
    subnormal_code = (r / _pow2_f32(emin - mbits)).astype(np.int64)
    is_normal = r >= _pow2_f32(emin)
    return np.where(is_normal, normal_code, subnormal_code).astype(np.uint8)


def _cast_minifloat(v, fmt: str) -> np.ndarray:
    """RNE_sat(v -> fmt) of float32 values: codes as uint8 (sign bit kept, NaN -> NaN code)."""
    ebits, mbits, bias, maxval, nan_code = _FORMATS[fmt]
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        is_nan = np.isnan(v)
        mag = np.where(is_nan, _f32(0.0), np.abs(v))
        code = _encode_magnitude(_round_magnitude_sat(mag, fmt), fmt)
        sign = ((v.view(np.uint32) >> np.uint32(31)).astype(np.uint8)) << np.uint8(ebits + mbits)
        code = code | sign
        return np.where(is_nan, np.uint8(nan_code), code).astype(np.uint8)


def _decode_table(fmt: str) -> np.ndarray:
    """float32 value of every code of `fmt` (computed exactly in Python floats)."""
    ebits, mbits, bias, _, _ = _FORMATS[fmt]
    n = 1 << (1 + ebits + mbits)
    emax_field = (1 << ebits) - 1
    table = np.empty(n, dtype=np.float32)
    for code in range(n):
        sign = -1.0 if code >> (ebits + mbits) else 1.0
        exp_field = (code >> mbits) & emax_field
        mant = code & ((1 << mbits) - 1)
        if fmt == "e4m3" and exp_field == emax_field and mant == (1 << mbits) - 1:
            value = math.nan  # 0x7F / 0xFF
        elif fmt == "e5m2" and exp_field == emax_field:
            value = sign * math.inf if mant == 0 else math.nan
        elif exp_field == 0:
            value = sign * mant * 2.0 ** (1 - bias - mbits)
        else:
            value = sign * (1.0 + mant / (1 << mbits)) * 2.0 ** (exp_field - bias)
        table[code] = value
    return table


_DECODE = {fmt: _decode_table(fmt) for fmt in _FORMATS}


def cast_fp8_ref(v_fp32, fmt: str) -> np.ndarray:
    """RNE_sat(v -> E4M3/E5M2): finite overflow and +-inf -> +-max, any NaN -> 0x7F."""
    _check_fp8_fmt(fmt)
    return _cast_minifloat(v_fp32, fmt)


def decode_fp8_ref(codes, fmt: str) -> np.ndarray:
    """float32 values of FP8 codes (E4M3: 0x7F/0xFF NaN; E5M2: inf and NaN codes)."""
    _check_fp8_fmt(fmt)
    return _DECODE[fmt][np.asarray(codes, dtype=np.uint8)]


def cast_e2m1_ref(v_fp32) -> np.ndarray:
    """RNE onto the E2M1 grid, |v| > 6 -> 6, NaN -> 0x7; codes 0..15, sign of zero kept."""
    return _cast_minifloat(v_fp32, "e2m1")


def decode_e2m1_ref(codes) -> np.ndarray:
    """float32 values of E2M1 codes 0..15."""
    codes = np.asarray(codes, dtype=np.uint8)
    if np.any(codes > 15):
        raise ValueError("E2M1 codes must be in 0..15")
    return _DECODE["e2m1"][codes]


def pack_e2m1_ref(codes) -> np.ndarray:
    """Pack E2M1 codes along the last dim, two per byte, even index in the low nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    if codes.shape[-1] % 2:
        raise ValueError("last dimension must be even to pack E2M1")
    low = codes[..., 0::2] & np.uint8(0x0F)
    high = codes[..., 1::2] & np.uint8(0x0F)
    return (low | (high << np.uint8(4))).astype(np.uint8)


def unpack_e2m1_ref(packed) -> np.ndarray:
    """Inverse of pack_e2m1_ref: uint8[..., n] -> codes uint8[..., 2n]."""
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = packed & np.uint8(0x0F)
    out[..., 1::2] = packed >> np.uint8(4)
    return out


# --------------------------------------------------------------------------------------------
# High-precision roundings (ml_dtypes / numpy round these RNE)
# --------------------------------------------------------------------------------------------


def float_to_bf16_ref(x_fp32) -> np.ndarray:
    """fp32 -> bfloat16, RNE, subnormals kept (ml_dtypes)."""
    return np.asarray(x_fp32, dtype=np.float32).astype(ml_dtypes.bfloat16)


def float_to_fp16_ref(x_fp32) -> np.ndarray:
    """fp32 -> float16, RNE, subnormals kept (IEEE numpy cast)."""
    with np.errstate(over="ignore"):
        return np.asarray(x_fp32, dtype=np.float32).astype(np.float16)


def round_to_dtype_ref(x_fp32, dtype_name: str) -> np.ndarray:
    """Round an fp32 result to the output dtype ("float32", "bfloat16", "float16") with RNE."""
    if dtype_name == "float32":
        return np.asarray(x_fp32, dtype=np.float32).copy()
    if dtype_name == "bfloat16":
        return float_to_bf16_ref(x_fp32)
    if dtype_name == "float16":
        return float_to_fp16_ref(x_fp32)
    raise ValueError(f"unknown dtype name {dtype_name!r}")


# --------------------------------------------------------------------------------------------
# §2 scale from amax, §5 E8M0
# --------------------------------------------------------------------------------------------


def scale_from_amax_ref(amax, fmt_max, eps=0.0, pow2=False, inf_value=FLT_MAX):
    """§2: the ENCODE scale s from an amax (scalar -> np.float32, array -> float32 array).

    1. a = max(a, eps) (NaN stays NaN)  2. a in {0, +inf, NaN} -> s = 1  3. s = M / a (fp32)
    4. s == +inf -> inf_value  5. pow2: clear the 23 mantissa bits.
    The decode scale is s_inv = fl(1 / s) (see _scale_inv).
    """
    scalar = np.ndim(amax) == 0
    a = np.asarray(amax, dtype=np.float32)
    M = _f32(fmt_max)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        a = np.where(np.isnan(a), a, np.maximum(a, _f32(eps)))
        use_one = (a == 0) | np.isposinf(a) | np.isnan(a)
        s = (M / np.where(use_one, _f32(1.0), a)).astype(np.float32)
        s = np.where(np.isposinf(s), _f32(inf_value), s).astype(np.float32)
        if pow2:
            s = (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
        s = np.where(use_one, _f32(1.0), s).astype(np.float32)
    return np.float32(s) if scalar else s


def _scale_inv(s) -> np.ndarray:
    """s_inv = fl(1 / s) in fp32."""
    with np.errstate(divide="ignore", over="ignore"):
        return (_f32(1.0) / np.asarray(s, dtype=np.float32)).astype(np.float32)


def e8m0_from_block_amax_ref(a, fmt_max) -> np.ndarray:
    """§5 RCEIL: v = fl(a * fl(1/M)), E8M0 code of v rounded UP to a power of two (uint8)."""
    a = np.asarray(a, dtype=np.float32)
    recip = _f32(1.0) / _f32(fmt_max)
    with np.errstate(over="ignore", invalid="ignore"):
        v = (a * recip).astype(np.float32)
    bits = v.view(np.uint32)
    exp_field = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64)
    mant = bits & np.uint32(0x7FFFFF)
    normal_e = np.minimum(exp_field + (mant != 0), 254)
    subnormal_e = np.where(v <= _pow2_f32(-127), 0, 1)  # covers v == 0 too
    e = np.where(exp_field == 0, subnormal_e, normal_e)
    e = np.where(np.isposinf(v), 254, e)
    e = np.where(np.isnan(v), 255, e)
    return e.astype(np.uint8)


def e8m0_to_float_ref(e) -> np.ndarray:
    """2**(e - 127) exactly as float32 (e = 0 is the subnormal 2**-127; e = 255 is NaN)."""
    e = np.asarray(e, dtype=np.uint8).astype(np.int64)
    value = _pow2_f32(np.minimum(e, 254) - 127)
    return np.where(e == 255, np.float32(np.nan), value).astype(np.float32)


def e8m0_multiplier_ref(e) -> np.ndarray:
    """§5 encode multiplier m_b = 2**(127 - e) built exactly from bits (e = 254 -> 2**-127)."""
    e = np.asarray(e, dtype=np.uint8).astype(np.int64)
    value = _pow2_f32(127 - np.minimum(e, 254))
    return np.where(e == 255, np.float32(np.nan), value).astype(np.float32)


# --------------------------------------------------------------------------------------------
# §3/§4 per-tensor FP8
# --------------------------------------------------------------------------------------------


def _cast_scaled_fp8(x32: np.ndarray, s, fmt: str) -> np.ndarray:
    """q = RNE_sat(fl(x * s)) with the multiplication in fp32."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = (x32 * np.asarray(s, dtype=np.float32)).astype(np.float32)
    return cast_fp8_ref(v, fmt)


def _per_tensor_outputs(x, q2d, s_inv, a, rowwise, columnwise) -> dict:
    out = {}
    if rowwise:
        out["rowwise_data"] = q2d.reshape(np.shape(x))
        out["rowwise_scale_inv"] = np.array([s_inv], dtype=np.float32)
    if columnwise:
        out["columnwise_data"] = np.ascontiguousarray(q2d.T)
        out["columnwise_scale_inv"] = np.array([s_inv], dtype=np.float32)
    out["amax"] = np.array([a], dtype=np.float32)
    return out


def quantize_fp8_current_ref(x, fmt, rowwise=True, columnwise=True, eps=0.0, pow2=False) -> dict:
    """§4 per-tensor current scaling (inf_value = FLT_MAX); columnwise = transposed bytes."""
    _check_fp8_fmt(fmt)
    x2, R, K = _as_2d(x)
    a = amax_ref(x2)
    s = scale_from_amax_ref(a, FP8_MAX[fmt], eps=eps, pow2=pow2, inf_value=FLT_MAX)
    s_inv = np.float32(_scale_inv(s))
    q = _cast_scaled_fp8(x2, s, fmt)
    return _per_tensor_outputs(x, q, s_inv, a, rowwise, columnwise)


def quantize_fp8_delayed_ref(x, fmt, scale, rowwise=True, columnwise=True) -> dict:
    """§3 delayed scaling quantize with a given scale s; "amax" is max|x| of the UNSCALED x."""
    _check_fp8_fmt(fmt)
    x2, R, K = _as_2d(x)
    s = np.float32(np.asarray(scale, dtype=np.float32).reshape(-1)[0])
    s_inv = np.float32(_scale_inv(s))
    q = _cast_scaled_fp8(x2, s, fmt)
    return _per_tensor_outputs(x, q, s_inv, amax_ref(x2), rowwise, columnwise)


def record_amax_ref(amax_history, amax):
    """§3 quantize step H[0] = max(H[0], amax) per slot, with every amax NaN-skipping: the new
    amax replaces H[0] only when neither is NaN and it is larger (subnormals compare as the
    values they are; -0.0 counts below +0.0). Other rows are unchanged."""
    H = np.array(amax_history, dtype=np.float32, copy=True)
    flat = H.reshape(H.shape[0], -1)
    a = np.asarray(amax, dtype=np.float32).reshape(-1)
    for n in range(flat.shape[1]):
        h, v = float(flat[0, n]), float(a[n])
        if math.isnan(h) or math.isnan(v):
            continue
        if v > h or (v == h == 0.0 and math.copysign(1.0, v) > math.copysign(1.0, h)):
            flat[0, n] = a[n]
    return flat.reshape(H.shape)


def delayed_scaling_update_ref(amax_history, scale, fmt, margin=0, algo="max"):
    """§3 update of (amax_history (L, N), scale (N,)) -> (new_history, new_scale), per column.

    Column n with H[0, n] == 0 is left untouched.  Otherwise
      a* = H[0, n] raised to each |H[k, n]| (k >= 1) that is larger ("max"; NaN entries are
           skipped as in every amax, a NaN H[0] stays NaN) or H[0, n] ("most_recent");
      roll: H'[0] = 0, H'[k] = H[k+1] (1 <= k <= L-2), H'[L-1] = H[0]   (for L == 1: H'[0] = 0);
      s' = fl(fl(M * 2**-margin) / a*) if a* is finite and > 0 else s; s' == +inf -> FLT_MAX.
    """
    _check_fp8_fmt(fmt)
    if algo not in ("max", "most_recent"):
        raise ValueError(f"unknown amax_compute_algo {algo!r}")
    H = np.array(amax_history, dtype=np.float32, copy=True)
    if H.ndim == 1:
        H = H[:, None]
    s = np.array(scale, dtype=np.float32, copy=True).reshape(-1)
    L, N = H.shape
    if s.shape != (N,):
        raise ValueError("scale must have one entry per history column")
    numerator = (FP8_MAX[fmt] * _f32(2.0 ** (-margin))).astype(np.float32)  # fl(M * 2^-m)

    new_H = H.copy()
    new_s = s.copy()
    for n in range(N):
        a_new = H[0, n]
        if a_new == 0:
            continue
        a_star = np.float32(a_new)
        if algo == "max":  # NaN-skipping max of |H[k]| folded onto a_new (a NaN a_new stays NaN)
            for h in H[1:, n]:
                if np.abs(h) > a_star:
                    a_star = np.float32(np.abs(h))
        rolled = np.zeros(L, dtype=np.float32)
        if L >= 2:
            rolled[1 : L - 1] = H[2:L, n]
            rolled[L - 1] = a_new
        new_H[:, n] = rolled
        if np.isfinite(a_star) and a_star > 0:
            with np.errstate(over="ignore"):
                sn = np.float32(numerator / a_star)
            new_s[n] = FLT_MAX if np.isposinf(sn) else sn
    return new_H, new_s


# --------------------------------------------------------------------------------------------
# §5 MXFP8
# --------------------------------------------------------------------------------------------


def _padded(values: np.ndarray, shape, dtype) -> np.ndarray:
    out = np.zeros(shape, dtype=dtype)
    out[: values.shape[0], : values.shape[1]] = values
    return out


def quantize_mxfp8_ref(x, fmt, rowwise=True, columnwise=True, two_d=False) -> dict:
    """§5 MXFP8: 1x32 blocks (rowwise along K, columnwise along R), E8M0 RCEIL scales.

    rowwise_data / columnwise_data: uint8 with x's shape (columnwise is NOT transposed);
    rowwise_scale_inv: uint8 (roundup(R,128), roundup(K/32,4)), entry [r, k//32];
    columnwise_scale_inv: uint8 (roundup(R/32,4), roundup(K,128)), entry [r//32, k].
    two_d: one exponent per 32x32 tile, both copies byte-identical, scales broadcast.
    """
    _check_fp8_fmt(fmt)
    x2, R, K = _as_2d(x)
    if R % 32 or K % 32:
        raise ValueError(f"MXFP8 requires R % 32 == 0 and K % 32 == 0 (got R={R}, K={K})")
    M = FP8_MAX[fmt]
    out = {}

    def encode(e_full: np.ndarray) -> np.ndarray:  # e_full: (R, K) exponent of each element
        m = e8m0_multiplier_ref(e_full)
        return _cast_scaled_fp8(x2, m, fmt).reshape(np.shape(x))

    if two_d:
        tiles = x2.reshape(R // 32, 32, K // 32, 32)
        e_tile = e8m0_from_block_amax_ref(_amax_along(tiles, axis=(1, 3)), M)  # (R/32, K/32)
        e_row = np.repeat(e_tile, 32, axis=0)  # (R, K/32)
        e_col = np.repeat(e_tile, 32, axis=1)  # (R/32, K)
        data = encode(np.repeat(e_row, 32, axis=1))
        data_row = data_col = data
    else:
        e_row = e8m0_from_block_amax_ref(_amax_along(x2.reshape(R, K // 32, 32), axis=2), M)
        e_col = e8m0_from_block_amax_ref(_amax_along(x2.reshape(R // 32, 32, K), axis=1), M)
        data_row = encode(np.repeat(e_row, 32, axis=1)) if rowwise else None
        data_col = encode(np.repeat(e_col, 32, axis=0)) if columnwise else None

    if rowwise:
        out["rowwise_data"] = data_row
        out["rowwise_scale_inv"] = _padded(e_row, (_roundup(R, 128), _roundup(K // 32, 4)), np.uint8)
    if columnwise:
        out["columnwise_data"] = data_col
        out["columnwise_scale_inv"] = _padded(
            e_col, (_roundup(R // 32, 4), _roundup(K, 128)), np.uint8
        )
    return out


# --------------------------------------------------------------------------------------------
# §6 FP8 block scaling (fp32 scales)
# --------------------------------------------------------------------------------------------

_FP8_BLOCK = 128


def _block_1d_along_last(x2: np.ndarray, fmt, pow2, eps, inf_value):
    """1x128 blocks along the last dim of x2 (rows, cols): (q (rows, cols), s_inv (rows, nb))."""
    rows, cols = x2.shape
    nb = _ceildiv(cols, _FP8_BLOCK)
    padded = np.zeros((rows, nb * _FP8_BLOCK), dtype=np.float32)  # zeros never change an amax
    padded[:, :cols] = x2
    a = _amax_along(padded.reshape(rows, nb, _FP8_BLOCK), axis=2)
    s = scale_from_amax_ref(a, FP8_MAX[fmt], eps=eps, pow2=pow2, inf_value=inf_value)
    s_full = np.repeat(s, _FP8_BLOCK, axis=1)[:, :cols]
    return _cast_scaled_fp8(x2, s_full, fmt), _scale_inv(s)


def quantize_fp8_block_ref(
    x, fmt, rowwise=True, columnwise=True, block_dim=1, pow2=True, eps=0.0,
    allow_partial_blocks=False,
) -> dict:
    """§6 FP8 block scaling.

    block_dim=1: rowwise 1x128 blocks along K; data (R, K) [x's shape], scale_inv fp32
      (ceil(K/128), roundup(R,4)) with entry [kb, r] (R-minor).  Columnwise: 1x128 blocks of
      xᵀ (K, R) along R; data (K, R), scale_inv (ceil(R/128), roundup(K,4)) entry [rb, k].
    block_dim=2: 128x128 tiles; rowwise scale_inv (ceil(R/128), roundup(ceil(K/128),4)) entry
      [rb, kb]; columnwise data = rowwise bytes transposed, scale_inv
      (ceil(K/128), roundup(ceil(R/128),4)) entry [kb, rb].
    Padding is 0.  inf_value = max finite of the INPUT dtype.  The spec requires R % 128 == 0
    and K % 128 == 0 (ValueError); allow_partial_blocks=True instead treats a partial block's
    amax as the amax over its existing elements.
    """
    _check_fp8_fmt(fmt)
    if block_dim not in (1, 2):
        raise ValueError("block_dim must be 1 or 2")
    inf_value = _DTYPE_MAX[_input_dtype_name(x)]
    x2, R, K = _as_2d(x)
    if not allow_partial_blocks and (R % _FP8_BLOCK or K % _FP8_BLOCK):
        raise ValueError(f"FP8 block scaling requires R % 128 == 0 and K % 128 == 0 (got R={R}, K={K})")
    nbr, nbk = _ceildiv(R, _FP8_BLOCK), _ceildiv(K, _FP8_BLOCK)
    out = {}

    if block_dim == 1:
        if rowwise:
            q, s_inv = _block_1d_along_last(x2, fmt, pow2, eps, inf_value)  # s_inv (R, nbk)
            out["rowwise_data"] = q.reshape(np.shape(x))
            out["rowwise_scale_inv"] = _padded(s_inv.T, (nbk, _roundup(R, 4)), np.float32)
        if columnwise:
            q, s_inv = _block_1d_along_last(np.ascontiguousarray(x2.T), fmt, pow2, eps, inf_value)
            out["columnwise_data"] = q  # (K, R)
            out["columnwise_scale_inv"] = _padded(s_inv.T, (nbr, _roundup(K, 4)), np.float32)
        return out

    padded = np.zeros((nbr * _FP8_BLOCK, nbk * _FP8_BLOCK), dtype=np.float32)
    padded[:R, :K] = x2
    a = _amax_along(padded.reshape(nbr, _FP8_BLOCK, nbk, _FP8_BLOCK), axis=(1, 3))
    s = scale_from_amax_ref(a, FP8_MAX[fmt], eps=eps, pow2=pow2, inf_value=inf_value)
    s_full = np.repeat(np.repeat(s, _FP8_BLOCK, axis=0), _FP8_BLOCK, axis=1)[:R, :K]
    q = _cast_scaled_fp8(x2, s_full, fmt)
    s_inv = _scale_inv(s)  # (nbr, nbk)
    if rowwise:
        out["rowwise_data"] = q.reshape(np.shape(x))
        out["rowwise_scale_inv"] = _padded(s_inv, (nbr, _roundup(nbk, 4)), np.float32)
    if columnwise:
        out["columnwise_data"] = np.ascontiguousarray(q.T)
        out["columnwise_scale_inv"] = _padded(s_inv.T, (nbk, _roundup(nbr, 4)), np.float32)
    return out


# --------------------------------------------------------------------------------------------
# §7 NVFP4: Philox, RHT, quantize
# --------------------------------------------------------------------------------------------

_PHILOX_M0 = np.uint64(0xD2511F53)
_PHILOX_M1 = np.uint64(0xCD9E8D57)
_PHILOX_W0 = np.uint32(0x9E3779B9)
_PHILOX_W1 = np.uint32(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10_ref(counter, key):
    """Random123 Philox4x32-10.  counter: 4 uint32 arrays (broadcastable), key: 2 uint32.

    Round:  (hi0, lo0) = M0 * c0,  (hi1, lo1) = M1 * c2   (64-bit products)
            c = (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)
    The key is bumped by (W0, W1) between rounds (10 rounds, 9 bumps).
    """
    c = [np.asarray(ci).astype(np.uint32).astype(np.uint64) for ci in counter]
    c = list(np.broadcast_arrays(*c))
    k0 = np.uint64(int(np.asarray(key[0])) & 0xFFFFFFFF)
    k1 = np.uint64(int(np.asarray(key[1])) & 0xFFFFFFFF)
    for rnd in range(10):
        if rnd > 0:
            k0 = (k0 + np.uint64(_PHILOX_W0)) & _MASK32
            k1 = (k1 + np.uint64(_PHILOX_W1)) & _MASK32
        p0 = _PHILOX_M0 * c[0]  # < 2**64, exact in uint64
        p1 = _PHILOX_M1 * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return tuple(ci.astype(np.uint32) for ci in c)


_RHT_SIGN_MASK = 0xD7E8


def rht_matrix_ref() -> np.ndarray:
    """H = (1/4) * diag(sign) * H16 (Sylvester), sign_i = -1 iff bit i of 0xD7E8 is set.

    H16[j, i] = (-1)**popcount(i & j); so H[j, i] = sign_j * H16[j, i] / 4 (float32, exact).
    """
    idx = np.arange(16)
    h16 = np.array([[(-1.0) ** bin(j & i).count("1") for i in idx] for j in idx])
    sign = np.array([-1.0 if (_RHT_SIGN_MASK >> j) & 1 else 1.0 for j in idx])
    return (0.25 * sign[:, None] * h16).astype(np.float32)


def rht_ref(x2d) -> np.ndarray:
    """16-point RHT along the LAST axis of a 2-D array, in contiguous chunks of 16.

    For the NVFP4 columnwise copy this is applied to the transposed operand xᵀ of shape (K, R),
    i.e. along the token dimension R.  For each chunk (row vector x of 16 values):
        x'_i = sum_{j=0..15} x_j * H[j, i]      (x' = x · H)
    The products are exact; they are summed in index order j = 0..15 starting from the first
    product (acc = p_0; acc = fl(acc + p_j) for j = 1..15), rounding to fp32 after every add.
    The result is rounded to bf16 (RNE, subnormals kept) and returned WIDENED to float32
    (every returned value is exactly a bf16 value).
    """
    x = to_fp32(x2d)
    if x.ndim != 2 or x.shape[-1] % 16:
        raise ValueError("rht_ref expects a 2-D array whose last dimension is a multiple of 16")
    rows, cols = x.shape
    chunks = x.reshape(rows, cols // 16, 16)  # [..., j]
    H = rht_matrix_ref()
    with np.errstate(over="ignore", invalid="ignore"):
        acc = chunks[..., 0:1] * H[0][None, None, :]  # p_0 for every output i: [..., i]
        for j in range(1, 16):
            acc = (acc + chunks[..., j : j + 1] * H[j][None, None, :]).astype(np.float32)
    y = acc.reshape(rows, cols).astype(np.float32)
    return float_to_bf16_ref(y).astype(np.float32)


def sr_random_bytes_ref(n_elements: int, copy: int, seed: int, offset: int) -> np.ndarray:
    """§7 step 9: the random byte (uint8) of each element i = 0..n-1 of quantized copy `copy`.

    g = i // 16, b = i % 16, counter = (g mod 2^32, ((g >> 32) << 1) | copy, offset, 0),
    key = (seed, 0); byte b of the little-endian 16 bytes (x0, x1, x2, x3).
    """
    n_groups = _ceildiv(n_elements, 16)
    g = np.arange(n_groups, dtype=np.uint64)
    c0 = (g & _MASK32).astype(np.uint32)
    c1 = (((g >> np.uint64(32)) << np.uint64(1)) | np.uint64(copy)).astype(np.uint32)
    c2 = np.full(n_groups, np.uint32(offset & 0xFFFFFFFF), dtype=np.uint32)
    c3 = np.zeros(n_groups, dtype=np.uint32)
    words = philox4x32_10_ref((c0, c1, c2, c3), (np.uint32(seed & 0xFFFFFFFF), np.uint32(0)))
    # byte b: (x_{b//4} >> (8*(b%4))) & 0xFF
    b = np.arange(16)
    stacked = np.stack(words, axis=1)  # (n_groups, 4)
    per_group = (stacked[:, b // 4] >> (8 * (b % 4)).astype(np.uint32)) & np.uint32(0xFF)
    return per_group.reshape(-1)[:n_elements].astype(np.uint8)


def _e2m1_stochastic(v: np.ndarray, rand_bytes: np.ndarray) -> np.ndarray:
    """§7 step 9: stochastic rounding of fp32 v to E2M1 codes with the given random bytes."""

    def step(m):
        return np.where(m < 2, _f32(0.5), np.where(m < 4, _f32(1.0), _f32(2.0))).astype(np.float32)

    with np.errstate(over="ignore", invalid="ignore"):
        is_nan = np.isnan(v)
        mag = np.where(is_nan, _f32(0.0), np.abs(v)).astype(np.float32)
        u = (rand_bytes.astype(np.float32) / _f32(256.0)).astype(np.float32)  # exact
        t = (mag + (u * step(mag)).astype(np.float32)).astype(np.float32)  # product exact
        st = step(t)
        q = np.minimum(np.floor(t / st) * st, _f32(6.0)).astype(np.float32)
        code = _encode_magnitude(q, "e2m1")
        sign = ((v.view(np.uint32) >> np.uint32(31)).astype(np.uint8)) << np.uint8(3)
        return np.where(is_nan, np.uint8(0x7), code | sign).astype(np.uint8)


def _nvfp4_global_scales(A: np.float32):
    """§7 step 2: (S_enc, S_dec)."""
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = np.minimum(NVFP4_GLOBAL / np.float32(A), FLT_MAX).astype(np.float32)
    if A == 0 or s_enc == 0:
        s_enc = _f32(1.0)
    s_dec = np.float32(_f32(1.0) / np.float32(s_enc))
    return np.float32(s_enc), s_dec


def _nvfp4_quantize_copy(c2: np.ndarray, two_d: bool, stochastic: bool, copy_index: int, rng, A=None):
    """Quantize one copy (rows, cols) per §7 steps 1-5 / 7 / 9; `A` a given global amax (step 1's
    all-reduce MAX) instead of the copy's own.

    Returns (codes (rows, cols) uint8 unpacked, d_b codes (rows, cols/16) uint8, A (float32)).
    """
    rows, cols = c2.shape
    A = np.float32(_amax_along(c2, axis=None) if A is None else A)
    s_enc, s_dec = _nvfp4_global_scales(A)
    factor = np.float32(s_enc * (_f32(1.0) / _f32(6.0)))  # fl(S_enc * fl(1/6))

    if two_d:
        tiles = c2.reshape(rows // 16, 16, cols // 16, 16)
        a_b = np.repeat(_amax_along(tiles, axis=(1, 3)), 16, axis=0)  # (rows, cols/16)
    else:
        a_b = _amax_along(c2.reshape(rows, cols // 16, 16), axis=2)  # (rows, cols/16)

    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        d_code = cast_fp8_ref((a_b * factor).astype(np.float32), "e4m3")
        d_val = decode_fp8_ref(d_code, "e4m3")
        m_b = np.minimum(_f32(1.0) / (d_val * s_dec).astype(np.float32), FLT_MAX).astype(np.float32)
        v = (c2 * np.repeat(m_b, 16, axis=1)).astype(np.float32)
    if stochastic:
        seed, offset = int(rng[0]), int(rng[1])
        rb = sr_random_bytes_ref(rows * cols, copy_index, seed, offset).reshape(rows, cols)
        codes = _e2m1_stochastic(v, rb)
    else:
        codes = cast_e2m1_ref(v)
    return codes, d_code, A


def quantize_nvfp4_ref(
    x, rowwise=True, columnwise=True, with_rht=False, two_d=False, stochastic=False, rng=(0, 0), global_amax=None
) -> dict:
    """§7 NVFP4.

    Rowwise copy: x as (R, K).  Columnwise copy: xᵀ (K, R), first RHT'd along R when with_rht
    (bf16 input only).  Each copy has its own global amax.  Keys (present ones only):
      rowwise_data uint8 x.shape[:-1] + (K/2,), rowwise_scale_inv uint8 E4M3 codes
      (roundup(R,128), roundup(K/16,4)) entry [r, k//16], amax float32 (1,);
      columnwise_data uint8 (K, R/2), columnwise_scale_inv uint8 (roundup(K,128),
      roundup(R/16,4)) entry [k, r//16], columnwise_amax float32 (1,).
    two_d: 16x16 tiles of each copy (for the RNE path this makes the columnwise copy exactly the
    transpose of the rowwise one).  stochastic: §7 step 9 on both copies, rng = (seed, offset).
    global_amax: given (A_rowwise, A_columnwise) used instead of each copy's own amax (the
    group-wide amaxes of a shard, §7 step 1 / §12).
    """
    dtype_name = _input_dtype_name(x)
    x2, R, K = _as_2d(x)
    if R % 16 or K % 16:
        raise ValueError(f"NVFP4 requires R % 16 == 0 and K % 16 == 0 (got R={R}, K={K})")
    if with_rht and columnwise and dtype_name != "bfloat16":
        raise ValueError(f"RHT is defined for bfloat16 input only (got {dtype_name})")
    if stochastic:
        seed, offset = int(rng[0]), int(rng[1])
        if not (0 <= seed < 2**32 and 0 <= offset < 2**32):
            raise ValueError("rng seed and offset must be in [0, 2**32)")
    out = {}
    if rowwise:
        codes, d_code, A = _nvfp4_quantize_copy(x2, two_d, stochastic, 0, rng,
                                                None if global_amax is None else global_amax[0])
        out["rowwise_data"] = pack_e2m1_ref(codes).reshape(tuple(np.shape(x)[:-1]) + (K // 2,))
        out["rowwise_scale_inv"] = _padded(d_code, (_roundup(R, 128), _roundup(K // 16, 4)), np.uint8)
        out["amax"] = np.array([A], dtype=np.float32)
    if columnwise:
        xt = np.ascontiguousarray(x2.T)  # (K, R)
        if with_rht:
            xt = rht_ref(xt)
        codes, d_code, A = _nvfp4_quantize_copy(xt, two_d, stochastic, 1, rng,
                                                None if global_amax is None else global_amax[1])
        out["columnwise_data"] = pack_e2m1_ref(codes)  # (K, R/2)
        out["columnwise_scale_inv"] = _padded(d_code, (_roundup(K, 128), _roundup(R // 16, 4)), np.uint8)
        out["columnwise_amax"] = np.array([A], dtype=np.float32)
    return out


# --------------------------------------------------------------------------------------------
# Dequantization (float32 in the ORIGINAL x shape)
# --------------------------------------------------------------------------------------------


def _shape_2d(shape) -> tuple[int, int]:
    shape = tuple(int(d) for d in shape)
    return int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]


def _back_to_shape(y2d_rk: np.ndarray, shape) -> np.ndarray:
    return np.ascontiguousarray(y2d_rk).reshape(tuple(shape)).astype(np.float32)


def dequantize_fp8_ref(data_u8, scale_inv, fmt, shape, columnwise=False) -> np.ndarray:
    """Per-tensor FP8: x̂ = fl(q * s_inv); columnwise data is (K, R) and is transposed back."""
    R, K = _shape_2d(shape)
    q = decode_fp8_ref(np.asarray(data_u8, dtype=np.uint8), fmt)
    q = q.reshape(K, R).T if columnwise else q.reshape(R, K)
    s_inv = np.float32(np.asarray(scale_inv, dtype=np.float32).reshape(-1)[0])
    with np.errstate(over="ignore", invalid="ignore"):
        return _back_to_shape(q * s_inv, shape)


def dequantize_mxfp8_ref(data_u8, scale_u8, fmt, shape, columnwise=False) -> np.ndarray:
    """MXFP8: x̂ = fl(q * 2**(e - 127)); data is (R, K) for both copies."""
    R, K = _shape_2d(shape)
    q = decode_fp8_ref(np.asarray(data_u8, dtype=np.uint8), fmt).reshape(R, K)
    e = np.asarray(scale_u8, dtype=np.uint8)
    if columnwise:
        e_full = np.repeat(e[: R // 32, :K], 32, axis=0)
    else:
        e_full = np.repeat(e[:R, : K // 32], 32, axis=1)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        return _back_to_shape(q * e8m0_to_float_ref(e_full), shape)


def dequantize_fp8_block_ref(data_u8, scale_inv, fmt, shape, columnwise=False, block_dim=1):
    """FP8 block: x̂ = fl(q * s_inv_b), scale layouts as in quantize_fp8_block_ref."""
    R, K = _shape_2d(shape)
    s = np.asarray(scale_inv, dtype=np.float32)
    B = _FP8_BLOCK
    nbr, nbk = _ceildiv(R, B), _ceildiv(K, B)
    if columnwise:
        q = decode_fp8_ref(np.asarray(data_u8, dtype=np.uint8), fmt).reshape(K, R)  # xᵀ layout
        if block_dim == 1:
            s_full = np.repeat(s[:nbr, :K].T, B, axis=1)[:, :R]  # [k, r] = s[r//128, k]
        else:
            s_full = np.repeat(np.repeat(s[:nbk, :nbr], B, axis=0), B, axis=1)[:K, :R]
        with np.errstate(over="ignore", invalid="ignore"):
            return _back_to_shape((q * s_full).T, shape)
    q = decode_fp8_ref(np.asarray(data_u8, dtype=np.uint8), fmt).reshape(R, K)
    if block_dim == 1:
        s_full = np.repeat(s[:nbk, :R].T, B, axis=1)[:, :K]  # [r, k] = s[k//128, r]
    else:
        s_full = np.repeat(np.repeat(s[:nbr, :nbk], B, axis=0), B, axis=1)[:R, :K]
    with np.errstate(over="ignore", invalid="ignore"):
        return _back_to_shape(q * s_full, shape)


def dequantize_nvfp4_ref(data_u8, scale_u8, amax, shape, columnwise=False) -> np.ndarray:
    """NVFP4 (§7 step 6): x̂ = fl(q * fl(fl(float(d_b) * A) * fl(1/2688))).

    A is the global amax of that copy ("amax" or "columnwise_amax").  Columnwise data (K, R/2)
    is transposed back to (R, K) (with RHT this yields the RHT'd values, not x).
    """
    R, K = _shape_2d(shape)
    rows, cols = (K, R) if columnwise else (R, K)
    q = decode_e2m1_ref(unpack_e2m1_ref(np.asarray(data_u8, dtype=np.uint8)).reshape(rows, cols))
    d = decode_fp8_ref(np.asarray(scale_u8, dtype=np.uint8)[:rows, : cols // 16], "e4m3")
    A = np.float32(np.asarray(amax, dtype=np.float32).reshape(-1)[0])
    inv_2688 = _f32(1.0) / NVFP4_GLOBAL
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        block = ((d * A).astype(np.float32) * inv_2688).astype(np.float32)
        y = (q * np.repeat(block, 16, axis=1)).astype(np.float32)
    return _back_to_shape(y.T if columnwise else y, shape)

"""Independent NumPy reference of the rotary position embedding (docs/numerics.md, "Rotary position
embedding"): cos / sin of the fp32 angle in binary64 with +, −, × (NumPy float64 ops are IEEE
binary64, no FMA) and rounded to fp32; the fp32 rotation; the transpose for the backward; TE's
RotaryPositionEmbedding angles. Written from the spec only; never imports twinengine's kernels or
frontends, torch or jax."""

from __future__ import annotations

import numpy as np

from twinengine.testing.reference import round_to_dtype_ref, to_fp32

_P1 = np.float64(1.57079632580280303955e+00)
_P2 = np.float64(9.92093573959351656958e-10)
_P3 = np.float64(5.72118872610983179676e-18)
_TWO_OVER_PI = np.float64(6.36619772367581382433e-01)
_TWO_PI = np.float64(6.28318530717958623200e+00)
_S = (-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
      2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10)
_C = (4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
      -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11)


def sincos_f64_ref(angle) -> tuple[np.ndarray, np.ndarray]:
    """The binary64 (sin, cos) of fp32 angles before the final rounding (NaN for NaN / ±inf)."""
    a = np.asarray(angle, dtype=np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        finite = np.isfinite(a)
        a = np.where(finite, a, 0.0)
        big = np.abs(a) >= 16777216.0
        a = np.where(big, np.fmod(a, _TWO_PI), a)
        k = np.rint(a * _TWO_OVER_PI)  # round half to even, exact
        r = ((a - k * _P1) - k * _P2) - k * _P3
        z = r * r
        ps = np.full_like(z, _S[5])
        for c in (_S[4], _S[3], _S[2], _S[1]):
            ps = ps * z + c
        sin_r = r + (z * r) * (_S[0] + z * ps)
        pc = np.full_like(z, _C[5])
        for c in (_C[4], _C[3], _C[2], _C[1], _C[0]):
            pc = pc * z + c
        q = z * pc
        hz = 0.5 * z
        w = 1.0 - hz
        cos_r = w + (((1.0 - w) - hz) + z * q)
        quad = k.astype(np.int64) & 3
        s = np.select([quad == 0, quad == 1, quad == 2], [sin_r, cos_r, -sin_r], -cos_r)
        c = np.select([quad == 0, quad == 1, quad == 2], [cos_r, -sin_r, -cos_r], sin_r)
        tiny = np.abs(np.where(finite, np.asarray(angle, dtype=np.float32).astype(np.float64), 1.0)) < 2.0**-27
        s = np.where(tiny, np.asarray(angle, dtype=np.float32).astype(np.float64), s)
        c = np.where(tiny, 1.0, c)
        s = np.where(finite, s, np.nan)
        c = np.where(finite, c, np.nan)
    return s, c


def sincos_ref(angle) -> tuple[np.ndarray, np.ndarray]:
    """(sin, cos) of fp32 angles, each rounded (RNE) to fp32."""
    s, c = sincos_f64_ref(angle)
    return s.astype(np.float32), c.astype(np.float32)


def _positions(tensor_format: str, shape, cu_seqlens) -> np.ndarray:
    """Position of every token in the token order of the (tokens, h, d) view (-1: copied)."""
    if tensor_format == "sbhd":
        s, b = shape[0], shape[1]
        return np.repeat(np.arange(s), b)
    if tensor_format == "bshd":
        b, s = shape[0], shape[1]
        return np.tile(np.arange(s), b)
    pos = np.full(shape[0], -1, dtype=np.int64)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    for i in range(len(cu) - 1):
        pos[cu[i]:cu[i + 1]] = np.arange(cu[i + 1] - cu[i])
    return pos


def _partner(d2: int, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(d2)
    if interleaved:
        first = i % 2 == 0
        j = np.where(first, i + 1, i - 1)
    else:
        first = i < d2 // 2
        j = np.where(first, i + d2 // 2, i - d2 // 2)
    return j, first


def rope_ref(t, freqs, tensor_format: str = "sbhd", interleaved: bool = False, cu_seqlens=None,
             backward: bool = False) -> np.ndarray:
    """apply_rotary_pos_emb (backward=False) or its transpose applied to t = dy (backward=True)."""
    t = np.asarray(t)
    out_dtype = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}.get(t.dtype, "bfloat16")
    x = to_fp32(t)
    shape = x.shape
    d = shape[-1]
    rows = x.reshape(-1, shape[-2], d)  # (tokens, h, d)
    f = np.asarray(freqs, dtype=np.float32).reshape(np.asarray(freqs).shape[0], -1)
    d2 = f.shape[1]
    pos = _positions(tensor_format, shape, cu_seqlens)
    out = rows.copy()
    j, first = _partner(d2, interleaved)
    sin, cos = sincos_ref(f)
    keep = pos >= 0
    p = pos[keep]
    xr = rows[keep][:, :, :d2]
    c = cos[p][:, None, :]
    xj = xr[:, :, j]
    with np.errstate(all="ignore"):
        if backward:
            other = np.where(first, xj, -xj)
            s = sin[p][:, None, :][:, :, j]
        else:
            other = np.where(first, -xj, xj)
            s = sin[p][:, None, :]
        a = (xr * c).astype(np.float32)
        b = (other * s).astype(np.float32)
        y = (a + b).astype(np.float32)
    sub = out[keep]
    sub[:, :, :d2] = y
    out[keep] = sub
    return round_to_dtype_ref(out.reshape(shape), out_dtype)


def inv_freq_ref(d2: int, rotary_base: float) -> np.ndarray:
    """fl32(1 / fl32(pow64(fl32(base), fl32(2j / d2))))."""
    e = (np.arange(0, d2, 2, dtype=np.float32) / np.float32(d2)).astype(np.float32)
    pw = np.power(np.float64(np.float32(rotary_base)), e.astype(np.float64)).astype(np.float32)
    return (np.float32(1) / pw).astype(np.float32)


def rotary_freqs_ref(dim: int, max_seq_len: int, rotary_percent: float = 1.0, seq_len_interpolation_factor=None,
                     rotary_base: float = 10000.0, interleaved: bool = False, offset: int = 0) -> np.ndarray:
    """TE's RotaryPositionEmbedding(dim, ...)(max_seq_len, offset): fp32 (max_seq_len, 1, 1, d2)."""
    d2 = int(dim * rotary_percent) if rotary_percent < 1.0 else dim
    inv = inv_freq_ref(d2, rotary_base)
    seq = (np.arange(max_seq_len, dtype=np.float32) + np.float32(offset)).astype(np.float32)
    if seq_len_interpolation_factor is not None:
        seq = (seq * np.float32(1.0 / seq_len_interpolation_factor)).astype(np.float32)
    fr = (seq[:, None] * inv[None, :]).astype(np.float32)
    emb = np.stack((fr, fr), axis=-1).reshape(max_seq_len, -1) if interleaved else np.concatenate((fr, fr), axis=-1)
    return emb.reshape(max_seq_len, 1, 1, d2)

"""Independent NumPy references of attention (docs/attention.md). Written from the spec only;
never imports twinengine, torch or jax.

Two references:
- ``attention_fwd_f64`` / ``attention_bwd_f64``: plain float64 softmax attention over the full
  masked score matrix (the mathematical result; kernels are compared with a tolerance).
- ``attention_fwd_emul`` / ``attention_bwd_emul``: an fp32 emulation of the documented blocked
  order (64-key blocks, online softmax, exp_f32 / log_f32 ports, canonical sums, sequential
  accumulators), which the kernel must match byte for byte.
- ``attention_fp8_fwd_emul`` / ``attention_fp8_bwd_emul``: the same for FP8 attention
  (docs/attention.md §9: E4M3 Q, K, V, P; E5M2 dO, dS; per-tensor current scales).
"""

from __future__ import annotations

import math

import numpy as np

from .quantize import (amax_ref, cast_fp8_ref, decode_fp8_ref, philox4x32_10_ref, round_to_dtype_ref,
                       scale_from_amax_ref, to_fp32)
from .sums import canonical_sum_ref

F = np.float32
ATTN_TAG = 0x4154544E  # "ATTN"
KEY_BLOCK = 64
PADDING = ("padding", "padding_causal", "padding_causal_bottom_right")
CAUSAL = ("causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right")


def _bits(u: int) -> np.float32:
    return np.array([u], np.uint32).view(np.float32)[0]


# ---- masks ------------------------------------------------------------------------------

def window_ref(mask_type: str, window_size) -> tuple[int, int]:
    causal = mask_type in CAUSAL
    if window_size is None or (causal and tuple(window_size) == (-1, -1)):
        return (-1, 0) if causal else (-1, -1)
    return int(window_size[0]), int(window_size[1])


def visible_ref(mask_type: str, window_size, s_q: int, s_kv: int, seqlens_q=None, seqlens_kv=None,
                batch: int = 1) -> np.ndarray:
    """bool (B, S_q, S_kv): key j visible to query row i of batch b (docs/attention.md §2)."""
    left, right = window_ref(mask_type, window_size)
    out = np.zeros((batch, s_q, s_kv), bool)
    for b in range(batch):
        sq = int(seqlens_q[b]) if seqlens_q is not None else s_q
        skv = int(seqlens_kv[b]) if seqlens_kv is not None else s_kv
        delta = 0 if mask_type in ("causal", "padding_causal") else skv - sq
        i = np.arange(s_q)[:, None]
        j = np.arange(s_kv)[None, :]
        vis = (i < sq) & (j < skv)
        if left >= 0:
            vis &= j >= i + delta - left
        if right >= 0:
            vis &= j <= i + delta + right
        out[b] = vis
    return out


def visible_thd_ref(mask_type: str, window_size, cu_seqlens_q, cu_seqlens_kv, t_q: int, t_kv: int) -> np.ndarray:
    """bool (1, T_q, T_kv) of packed (thd) sequences: sequence s holds query tokens
    cu_q[s] .. cu_q[s+1] - 1 and key tokens cu_kv[s] .. cu_kv[s+1] - 1; inside a sequence the
    bshd rule applies with its own lengths; tokens of different sequences never see each other."""
    out = np.zeros((1, t_q, t_kv), bool)
    cu_q, cu_kv = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_kv)
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[s]), int(cu_q[s + 1]), int(cu_kv[s]), int(cu_kv[s + 1])
        if q1 > q0 and k1 > k0:
            out[0, q0:q1, k0:k1] = visible_ref(mask_type, window_size, q1 - q0, k1 - k0)[0]
    return out


def dropout_keep_ref(shape: tuple[int, int, int, int], p: float, seed: int, offset: int) -> np.ndarray:
    """bool (B, H, S_q, S_kv): probability n = ((b·H + h)·S_q + i)·S_kv + j kept iff word n mod 4
    of Philox4x32-10 (key (seed, 0), counter (floor(n/4) mod 2^32, floor(n/2^34), offset, "ATTN"))
    is >= floor(p·2^32), p the fp32 value."""
    n_total = int(np.prod(shape))
    threshold = int(float(F(p)) * 2**32)
    j = np.arange((n_total + 3) // 4, dtype=np.uint64)
    c0 = (j & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    c1 = (j >> np.uint64(32)).astype(np.uint32)
    c2 = np.full(j.shape, offset & 0xFFFFFFFF, np.uint32)
    c3 = np.full(j.shape, ATTN_TAG, np.uint32)
    words = np.stack(philox4x32_10_ref((c0, c1, c2, c3), (np.uint32(seed & 0xFFFFFFFF), np.uint32(0))), axis=1)
    return (words.reshape(-1)[:n_total].astype(np.uint64) >= np.uint64(threshold)).reshape(shape)


def _default_scale(d: int, softmax_scale) -> float:
    return 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)


def _expand_kv(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, S, H_kv, D) -> (B, H, S, D): query head h reads kv head h // (H / H_kv)."""
    group = heads // x.shape[2]
    return np.repeat(np.moveaxis(x, 2, 1), group, axis=1)


# ---- float64 reference ------------------------------------------------------------------

def _f64_parts(q, k, v, mask_type, window_size, seqlens_q, seqlens_kv, softmax_scale, dropout_p, rng, visible=None):
    q64 = np.moveaxis(to_fp32(q).astype(np.float64), 2, 1)  # (B, H, S_q, D)
    b, h, s_q, d = q64.shape
    k64 = _expand_kv(to_fp32(k).astype(np.float64), h)
    v64 = _expand_kv(to_fp32(v).astype(np.float64), h)
    s_kv = k64.shape[2]
    if visible is None:
        visible = visible_ref(mask_type, window_size, s_q, s_kv, seqlens_q, seqlens_kv, b)
    vis = visible[:, None]
    scale = float(F(_default_scale(d, softmax_scale)))
    scores = np.where(vis, q64 @ np.swapaxes(k64, -1, -2) * scale, -np.inf)
    m = scores.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(vis, np.exp(scores - m), 0.0)
    total = e.sum(-1, keepdims=True)
    probs = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(total[..., 0] > 0, m[..., 0] + np.log(np.where(total[..., 0] > 0, total[..., 0], 1.0)), -np.inf)
    zs = np.ones_like(probs)
    if dropout_p > 0:
        keep = dropout_keep_ref((b, h, s_q, s_kv), dropout_p, int(rng[0]), int(rng[1]))
        zs = np.where(keep, 1.0 / (1.0 - float(F(dropout_p))), 0.0)
    return q64, k64, v64, probs, lse, zs, scale


def attention_fwd_f64(q, k, v, *, mask_type, window_size=None, seqlens_q=None, seqlens_kv=None, softmax_scale=None,
                      dropout_p=0.0, rng=None, visible=None) -> tuple[np.ndarray, np.ndarray]:
    """(out (B, S_q, H, D_v), lse (B, H, S_q)) in float64; fully masked rows give 0 and -inf.
    `visible` (B, S_q, S_kv) replaces the mask of mask_type / window / seqlens (thd)."""
    _, _, v64, probs, lse, zs, _ = _f64_parts(q, k, v, mask_type, window_size, seqlens_q, seqlens_kv, softmax_scale,
                                              dropout_p, rng, visible)
    return np.moveaxis((probs * zs) @ v64, 1, 2), lse


def attention_bwd_f64(dout, q, k, v, *, mask_type, window_size=None, seqlens_q=None, seqlens_kv=None,
                      softmax_scale=None, dropout_p=0.0, rng=None, visible=None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) in float64 (dk / dv summed over the query heads of each kv group)."""
    q64, k64, v64, probs, _, zs, scale = _f64_parts(q, k, v, mask_type, window_size, seqlens_q, seqlens_kv,
                                                    softmax_scale, dropout_p, rng, visible)
    do = np.moveaxis(to_fp32(dout).astype(np.float64), 2, 1)
    pd = probs * zs
    dv_h = np.swapaxes(pd, -1, -2) @ do
    dp = (do @ np.swapaxes(v64, -1, -2)) * zs
    ds = probs * (dp - (dp * probs).sum(-1, keepdims=True))
    dq = ds @ k64 * scale
    dk_h = np.swapaxes(ds, -1, -2) @ q64 * scale
    b, h = q64.shape[:2]
    h_kv = np.asarray(k).shape[2]
    group = h // h_kv
    dk = dk_h.reshape(b, h_kv, group, *dk_h.shape[2:]).sum(2)
    dv = dv_h.reshape(b, h_kv, group, *dv_h.shape[2:]).sum(2)
    return np.moveaxis(dq, 1, 2), np.moveaxis(dk, 1, 2), np.moveaxis(dv, 1, 2)


# ---- fp32 emulation of the documented order ---------------------------------------------

def exp_f32_ref(x) -> np.ndarray:
    """Port of numerics.h exp_f32 (fdlibm e_expf without FMA), elementwise in fp32."""
    x = np.asarray(x, F)
    with np.errstate(all="ignore"):
        ln2_hi, ln2_lo = _bits(0x3F317200), _bits(0x35BFBE8E)
        inv_ln2, p1, p2 = _bits(0x3FB8AA3B), _bits(0x3E2AAA8F), _bits(0xBB355215)
        safe = np.where(np.isfinite(x), x, F(0)).astype(F)
        shifted = (inv_ln2 * safe).astype(F)
        rounded = np.where(safe < 0, shifted - F(0.5), shifted + F(0.5)).astype(F)
        k = np.clip(np.trunc(rounded), -200, 200).astype(np.int32)
        kf = k.astype(F)
        hi = (safe - kf * ln2_hi).astype(F)
        lo = (kf * ln2_lo).astype(F)
        r = (hi - lo).astype(F)
        t = r * r
        c = r - t * (p1 + p2 * t)
        q = (r * c) / (F(2) - c)
        y = F(1) - ((lo - q) - hi)
        normal = k >= -125
        e_norm = np.clip(127 + k, 1, 254).astype(np.uint32) << np.uint32(23)
        res_norm = np.where(k == 128, y * F(2) * _bits(0x7F000000), y * e_norm.view(F))
        e_sub = np.clip(227 + k, 1, 254).astype(np.uint32) << np.uint32(23)
        res_sub = (y * e_sub.view(F)).astype(F) * _bits(0x0D800000)
        res = np.where(normal, res_norm, res_sub).astype(F)
        res = np.where(x > _bits(0x42B17217), F(np.inf), res)
        res = np.where(x < _bits(0xC2CFF1B5), F(0), res)
        return np.where(np.isnan(x), x, res).astype(F)


def log_f32_ref(x) -> np.ndarray:
    """Port of numerics.h log_f32 (FreeBSD e_logf without FMA) for finite normal x > 0."""
    x = np.asarray(x, F)
    assert np.all(np.isfinite(x) & (x >= np.finfo(F).tiny)), "log_f32_ref covers finite normal x > 0 only"
    ln2_hi, ln2_lo = _bits(0x3F317180), _bits(0x3717F7D1)
    lg1, lg2, lg3, lg4 = _bits(0x3F2AAAAA), _bits(0x3ECCCE13), _bits(0x3E91E9EE), _bits(0x3E789E26)
    ix = x.view(np.int32).astype(np.int64)
    k = (ix >> 23) - 127
    ix = ix & 0x007FFFFF
    i0 = (ix + (0x95F64 << 3)) & 0x800000
    xn = (ix | (i0 ^ 0x3F800000)).astype(np.uint32).view(F)
    k = k + (i0 >> 23)
    f = (xn - F(1)).astype(F)
    dk = k.astype(F)
    # small branch: -2^-9 <= f < 2^-9
    small = (0x007FFFFF & (0x8000 + ix)) < 0xC000
    r_small = ((f * f).astype(F) * (F(0.5) - (F(0.333333333333) * f).astype(F))).astype(F)
    small_k0 = f - r_small
    small_k = dk * ln2_hi - ((r_small - dk * ln2_lo) - f)
    small_zero = (dk * ln2_hi + dk * ln2_lo).astype(F)
    res_small = np.where(f == 0, np.where(k == 0, F(0), small_zero), np.where(k == 0, small_k0, small_k))
    s = (f / (F(2) + f)).astype(F)
    z = s * s
    i = ix - (0x6147A << 3)
    w = z * z
    j = (0x6B851 << 3) - ix
    t1 = w * (lg2 + w * lg4)
    t2 = z * (lg1 + w * lg3)
    big = (i | j) > 0
    r = (t2 + t1).astype(F)
    hfsq = ((F(0.5) * f) * f).astype(F)
    sr_big = (s * (hfsq + r)).astype(F)
    big_k0 = f - (hfsq - sr_big)
    big_k = dk * ln2_hi - ((hfsq - (sr_big + dk * ln2_lo)) - f)
    sr = (s * (f - r)).astype(F)
    other_k0 = f - sr
    other_k = dk * ln2_hi - ((sr - dk * ln2_lo) - f)
    res_main = np.where(big, np.where(k == 0, big_k0, big_k), np.where(k == 0, other_k0, other_k))
    return np.where(small, res_small, res_main).astype(F)


def _rows(q, k, v):
    """fp32 per-row views: q (B, H, S_q, D); k, v expanded to (B, H, S_kv, ·)."""
    q32 = np.moveaxis(to_fp32(q), 2, 1)
    h = q32.shape[1]
    return q32, _expand_kv(to_fp32(k), h), _expand_kv(to_fp32(v), h)


def _scores(q32, k32, j, scale):
    """x_j = fl(Σc_d fl(q_d · k_{j,d}) · s) for every row: (B, H, S_q)."""
    return (canonical_sum_ref(q32 * k32[:, :, j][:, :, None, :]) * scale).astype(F)


def attention_fwd_emul(q, k, v, *, mask_type, window_size=None, seqlens_q=None, seqlens_kv=None, softmax_scale=None,
                       dropout_p=0.0, rng=None, visible=None) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's exact bytes: (out in q's dtype (B, S_q, H, D_v), lse fp32 (B, H, S_q))."""
    q32, k32, v32 = _rows(q, k, v)
    b, h, s_q, d = q32.shape
    s_kv, d_v = k32.shape[2], v32.shape[3]
    scale = F(_default_scale(d, softmax_scale))
    if visible is None:
        visible = visible_ref(mask_type, window_size, s_q, s_kv, seqlens_q, seqlens_kv, b)
    vis = np.broadcast_to(visible[:, None], (b, h, s_q, s_kv))
    keep = dropout_keep_ref((b, h, s_q, s_kv), dropout_p, int(rng[0]), int(rng[1])) if dropout_p > 0 else None
    dscale = F(F(1) / (F(1) - F(dropout_p)))
    m = np.full((b, h, s_q), -np.inf, F)
    l = np.zeros((b, h, s_q), F)
    acc = np.zeros((b, h, s_q, d_v), F)
    with np.errstate(invalid="ignore", over="ignore"):
        for t in range(0, s_kv, KEY_BLOCK):
            js = range(t, min(s_kv, t + KEY_BLOCK))
            x = {j: _scores(q32, k32, j, scale) for j in js}
            m_blk = np.full((b, h, s_q), -np.inf, F)
            for j in js:
                m_blk = np.where(vis[..., j] & (x[j] > m_blk), x[j], m_blk)
            active = vis[..., t:t + KEY_BLOCK].any(-1)
            m_new = np.where(active, np.where(m_blk > m, m_blk, m), m).astype(F)
            alpha = exp_f32_ref((m - m_new).astype(F))
            l = np.where(active, l * alpha, l).astype(F)
            acc = np.where(active[..., None], acc * alpha[..., None], acc).astype(F)
            for j in js:
                p = exp_f32_ref((x[j] - m_new).astype(F))
                l = np.where(vis[..., j], l + p, l).astype(F)
                pd = p if keep is None else np.where(keep[..., j], (p * dscale).astype(F), F(0))
                acc = np.where(vis[..., j][..., None], acc + (pd[..., None] * v32[:, :, j][:, :, None, :]).astype(F),
                               acc).astype(F)
            m = m_new
    empty = ~vis.any(-1)
    out = np.where(empty[..., None], F(0), acc / np.where(empty, F(1), l)[..., None]).astype(F)
    lse = np.full((b, h, s_q), -np.inf, F)
    if (~empty).any():
        lse[~empty] = (m[~empty] + log_f32_ref(l[~empty])).astype(F)
    return round_to_dtype_ref(np.moveaxis(out, 1, 2), np.asarray(q).dtype.name), lse


def attention_bwd_emul(dout, q, k, v, out, lse, *, mask_type, window_size=None, seqlens_q=None, seqlens_kv=None,
                       softmax_scale=None, dropout_p=0.0, rng=None, visible=None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's exact bytes of (dq, dk, dv) (docs/attention.md §4)."""
    dtype = np.asarray(q).dtype.name
    q32, k32, v32 = _rows(q, k, v)
    b, h, s_q, d = q32.shape
    s_kv, d_v = k32.shape[2], v32.shape[3]
    h_kv = np.asarray(k).shape[2]
    group = h // h_kv
    scale = F(_default_scale(d, softmax_scale))
    do32 = np.moveaxis(to_fp32(dout), 2, 1)
    o32 = np.moveaxis(to_fp32(out), 2, 1)
    lse = np.asarray(lse, F)
    if visible is None:
        visible = visible_ref(mask_type, window_size, s_q, s_kv, seqlens_q, seqlens_kv, b)
    vis = np.broadcast_to(visible[:, None], (b, h, s_q, s_kv))
    keep = dropout_keep_ref((b, h, s_q, s_kv), dropout_p, int(rng[0]), int(rng[1])) if dropout_p > 0 else None
    dscale = F(F(1) / (F(1) - F(dropout_p)))
    delta = canonical_sum_ref((do32 * o32).astype(F))
    ds = np.zeros((b, h, s_q, s_kv), F)   # the test-side emulation may hold the full matrix
    pd = np.zeros((b, h, s_q, s_kv), F)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(s_kv):
            x = _scores(q32, k32, j, scale)
            p = exp_f32_ref((x - lse).astype(F))
            dp = canonical_sum_ref((do32 * v32[:, :, j][:, :, None, :]).astype(F))
            if keep is not None:
                dp = np.where(keep[..., j], (dp * dscale).astype(F), F(0))
                pdj = np.where(keep[..., j], (p * dscale).astype(F), F(0))
            else:
                pdj = p
            ds[..., j] = np.where(vis[..., j], (p * (dp - delta).astype(F)).astype(F), F(0))
            pd[..., j] = np.where(vis[..., j], pdj, F(0))
    acc_q = np.zeros((b, h, s_q, d), F)
    for j in range(s_kv):
        term = (ds[..., j][..., None] * k32[:, :, j][:, :, None, :]).astype(F)
        acc_q = np.where(vis[..., j][..., None], acc_q + term, acc_q).astype(F)
    dq = (acc_q * scale).astype(F)
    acc_k = np.zeros((b, h_kv, s_kv, d), F)
    acc_v = np.zeros((b, h_kv, s_kv, d_v), F)
    for hh in range(group):
        for i in range(s_q):
            heads = np.arange(h_kv) * group + hh
            vis_i = vis[:, heads, i, :][..., None]  # (B, H_kv, S_kv, 1)
            qi = q32[:, heads, i, :][:, :, None, :]
            doi = do32[:, heads, i, :][:, :, None, :]
            acc_k = np.where(vis_i, acc_k + (ds[:, heads, i, :][..., None] * qi).astype(F), acc_k).astype(F)
            acc_v = np.where(vis_i, acc_v + (pd[:, heads, i, :][..., None] * doi).astype(F), acc_v).astype(F)
    dk = (acc_k * scale).astype(F)
    return (round_to_dtype_ref(np.moveaxis(dq, 1, 2), dtype), round_to_dtype_ref(np.moveaxis(dk, 1, 2), dtype),
            round_to_dtype_ref(np.moveaxis(acc_v, 1, 2), dtype))


# ---- FP8 attention (docs/attention.md §9) -----------------------------------------------

E4M3_MAX, E5M2_MAX = 448.0, 57344.0
P_SCALE = F(448.0)


def _q8(x32, scale, fmt: str) -> np.ndarray:
    """Q8(x, s, F): value of RNE_sat(fl(x · s)) in F, as fp32."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = (np.asarray(x32, F) * F(scale)).astype(F)
    return decode_fp8_ref(cast_fp8_ref(v, fmt), fmt).astype(F)


def _current(x, fmt: str) -> tuple[np.ndarray, np.float32]:
    """(Q8(x, s, F), inv(s)) with s = §2(amax x, max F), ε = 0, no pow2."""
    s = F(scale_from_amax_ref(amax_ref(x), E4M3_MAX if fmt == "e4m3" else E5M2_MAX))
    return _q8(to_fp32(x), s, fmt), F(F(1) / s)


def attention_fp8_fwd_emul(q, k, v, *, mask_type, window_size=None, seqlens_q=None, seqlens_kv=None,
                           softmax_scale=None, dropout_p=0.0, rng=None, visible=None) -> tuple[np.ndarray, np.ndarray]:
    """The FP8 kernel's exact bytes: (out in q's dtype (B, S_q, H, D_v), lse fp32 (B, H, S_q))."""
    q8, inv_q = _current(q, "e4m3")
    k8, inv_k = _current(k, "e4m3")
    v8, inv_v = _current(v, "e4m3")
    q32, k32, v32 = _rows(q8, k8, v8)
    b, h, s_q, d = q32.shape
    s_kv, d_v = k32.shape[2], v32.shape[3]
    c_qk = F(F(inv_q * inv_k) * F(_default_scale(d, softmax_scale)))
    c_pv = F(F(F(1) / P_SCALE) * inv_v)
    if visible is None:
        visible = visible_ref(mask_type, window_size, s_q, s_kv, seqlens_q, seqlens_kv, b)
    vis = np.broadcast_to(visible[:, None], (b, h, s_q, s_kv))
    keep = dropout_keep_ref((b, h, s_q, s_kv), dropout_p, int(rng[0]), int(rng[1])) if dropout_p > 0 else None
    dscale = F(F(1) / (F(1) - F(dropout_p)))
    m = np.full((b, h, s_q), -np.inf, F)
    l = np.zeros((b, h, s_q), F)
    acc = np.zeros((b, h, s_q, d_v), F)
    with np.errstate(invalid="ignore", over="ignore"):
        for t in range(0, s_kv, KEY_BLOCK):
            js = range(t, min(s_kv, t + KEY_BLOCK))
            x = {j: _scores(q32, k32, j, c_qk) for j in js}
            m_blk = np.full((b, h, s_q), -np.inf, F)
            for j in js:
                m_blk = np.where(vis[..., j] & (x[j] > m_blk), x[j], m_blk)
            active = vis[..., t:t + KEY_BLOCK].any(-1)
            m_new = np.where(active, np.where(m_blk > m, m_blk, m), m).astype(F)
            alpha = exp_f32_ref((m - m_new).astype(F))
            l = np.where(active, l * alpha, l).astype(F)
            acc = np.where(active[..., None], acc * alpha[..., None], acc).astype(F)
            for j in js:
                p = exp_f32_ref((x[j] - m_new).astype(F))
                l = np.where(vis[..., j], l + p, l).astype(F)
                p8 = _q8(np.where(vis[..., j], p, F(0)), P_SCALE, "e4m3")
                pd = p8 if keep is None else np.where(keep[..., j], (p8 * dscale).astype(F), F(0))
                acc = np.where(vis[..., j][..., None], acc + (pd[..., None] * v32[:, :, j][:, :, None, :]).astype(F),
                               acc).astype(F)
            m = m_new
    empty = ~vis.any(-1)
    out = (acc / np.where(empty, F(1), l)[..., None]).astype(F)
    out = np.where(empty[..., None], F(0), (out * c_pv).astype(F)).astype(F)
    lse = np.full((b, h, s_q), -np.inf, F)
    if (~empty).any():
        lse[~empty] = (m[~empty] + log_f32_ref(l[~empty])).astype(F)
    return round_to_dtype_ref(np.moveaxis(out, 1, 2), np.asarray(q).dtype.name), lse


def attention_fp8_bwd_emul(dout, q, k, v, out, lse, *, mask_type, window_size=None, seqlens_q=None, seqlens_kv=None,
                           softmax_scale=None, dropout_p=0.0, rng=None, visible=None
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The FP8 kernel's exact bytes of (dq, dk, dv) (docs/attention.md §9, backward)."""
    dtype = np.asarray(q).dtype.name
    q8, inv_q = _current(q, "e4m3")
    k8, inv_k = _current(k, "e4m3")
    v8, inv_v = _current(v, "e4m3")
    do8, inv_do = _current(dout, "e5m2")
    q32, k32, v32 = _rows(q8, k8, v8)
    b, h, s_q, d = q32.shape
    s_kv, d_v = k32.shape[2], v32.shape[3]
    h_kv = np.asarray(k).shape[2]
    group = h // h_kv
    scale = F(_default_scale(d, softmax_scale))
    c_qk = F(F(inv_q * inv_k) * scale)
    c_dov = F(inv_do * inv_v)
    c_dv = F(F(F(1) / P_SCALE) * inv_do)
    dohp = np.moveaxis(to_fp32(dout), 2, 1)
    do32 = np.moveaxis(do8, 2, 1)
    o32 = np.moveaxis(to_fp32(out), 2, 1)
    lse = np.asarray(lse, F)
    if visible is None:
        visible = visible_ref(mask_type, window_size, s_q, s_kv, seqlens_q, seqlens_kv, b)
    vis = np.broadcast_to(visible[:, None], (b, h, s_q, s_kv))
    keep = dropout_keep_ref((b, h, s_q, s_kv), dropout_p, int(rng[0]), int(rng[1])) if dropout_p > 0 else None
    dscale = F(F(1) / (F(1) - F(dropout_p)))
    delta = canonical_sum_ref((dohp * o32).astype(F))
    ds = np.zeros((b, h, s_q, s_kv), F)
    pd = np.zeros((b, h, s_q, s_kv), F)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(s_kv):
            x = _scores(q32, k32, j, c_qk)
            p = np.where(vis[..., j], exp_f32_ref((x - lse).astype(F)), F(0))
            dp = (canonical_sum_ref((do32 * v32[:, :, j][:, :, None, :]).astype(F)) * c_dov).astype(F)
            p8 = _q8(p, P_SCALE, "e4m3")
            if keep is not None:
                dp = np.where(keep[..., j], (dp * dscale).astype(F), F(0))
                pdj = np.where(keep[..., j], (p8 * dscale).astype(F), F(0))
            else:
                pdj = p8
            ds[..., j] = np.where(vis[..., j], (p * (dp - delta).astype(F)).astype(F), F(0))
            pd[..., j] = np.where(vis[..., j], pdj, F(0))
    # dS: E5M2 with the current scale of every ds of the call.
    s_ds = F(scale_from_amax_ref(amax_ref(ds), E5M2_MAX))
    inv_ds = F(F(1) / s_ds)
    ds8 = _q8(ds, s_ds, "e5m2")
    c_dq = F(F(inv_ds * inv_k) * scale)
    c_dk = F(F(inv_ds * inv_q) * scale)
    acc_q = np.zeros((b, h, s_q, d), F)
    for j in range(s_kv):
        term = (ds8[..., j][..., None] * k32[:, :, j][:, :, None, :]).astype(F)
        acc_q = np.where(vis[..., j][..., None], acc_q + term, acc_q).astype(F)
    dq = (acc_q * c_dq).astype(F)
    acc_k = np.zeros((b, h_kv, s_kv, d), F)
    acc_v = np.zeros((b, h_kv, s_kv, d_v), F)
    for hh in range(group):
        for i in range(s_q):
            heads = np.arange(h_kv) * group + hh
            vis_i = vis[:, heads, i, :][..., None]
            qi = q32[:, heads, i, :][:, :, None, :]
            doi = do32[:, heads, i, :][:, :, None, :]
            acc_k = np.where(vis_i, acc_k + (ds8[:, heads, i, :][..., None] * qi).astype(F), acc_k).astype(F)
            acc_v = np.where(vis_i, acc_v + (pd[:, heads, i, :][..., None] * doi).astype(F), acc_v).astype(F)
    dk = (acc_k * c_dk).astype(F)
    dv = (acc_v * c_dv).astype(F)
    return (round_to_dtype_ref(np.moveaxis(dq, 1, 2), dtype), round_to_dtype_ref(np.moveaxis(dk, 1, 2), dtype),
            round_to_dtype_ref(np.moveaxis(dv, 1, 2), dtype))

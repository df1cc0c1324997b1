"""Independent NumPy reference of LayerNorm, RMSNorm and L2Normalization (NUMERICS.md §11).

Written from the spec only; never imports twinengine's kernels or frontends, torch
or jax (it builds on the independent twinengine.testing.reference). Every operand is float32, so
each NumPy operation is exactly one fp32 rounding (`fl()` in the spec), and no FMA can occur.
Inputs x, dy, γ, β are float32 / ml_dtypes.bfloat16 / float16 arrays, widened exactly; results
are rounded RNE to the dtype the spec names (y, dx: x's; dγ, dβ: γ's).
"""

from __future__ import annotations

import numpy as np

from twinengine.testing.reference import round_to_dtype_ref, to_fp32
from .sums import canonical_sum_ref


def _rows(x) -> tuple[np.ndarray, tuple[int, ...], int]:
    """(fp32 copy as (R, K), x.shape, K)."""
    x = np.asarray(x)
    k = x.shape[-1]
    return to_fp32(x).reshape(-1, k), x.shape, k


def _gain(gamma, zero_centered_gamma: bool) -> np.ndarray:
    g = to_fp32(gamma)
    return np.float32(1.0) + g if zero_centered_gamma else g


def _rstd(var: np.ndarray, eps: float) -> np.ndarray:
    """fl(1 / fl(sqrt(fl(var + ε)))) with ε rounded to fp32 first; np.sqrt is correctly rounded."""
    return np.float32(1.0) / np.sqrt(var + np.float32(eps))


def layernorm_fwd_ref(x, gamma, beta, eps: float, zero_centered_gamma: bool):
    """(y, mu, rstd): y in x's dtype and shape, mu / rstd float32 of shape x.shape[:-1]."""
    with np.errstate(all="ignore"):
        x32, shape, k = _rows(x)
        kf = np.float32(k)
        mu = canonical_sum_ref(x32) / kf
        d = x32 - mu[:, None]
        var = canonical_sum_ref(d * d) / kf
        rstd = _rstd(var, eps)
        xhat = d * rstd[:, None]
        y = xhat * _gain(gamma, zero_centered_gamma) + to_fp32(beta)  # two roundings: fl(fl(x̂·g') + β)
        return (round_to_dtype_ref(y, np.asarray(x).dtype.name).reshape(shape), mu.reshape(shape[:-1]),
                rstd.reshape(shape[:-1]))


def layernorm_bwd_ref(dy, x, mu, rstd, gamma, zero_centered_gamma: bool):
    """(dx, dgamma, dbeta): dx in x's dtype, dγ = Σc_rows fl(dy·x̂), dβ = Σc_rows dy in γ's dtype."""
    with np.errstate(all="ignore"):
        x32, shape, k = _rows(x)
        dy32 = to_fp32(dy).reshape(-1, k)
        kf = np.float32(k)
        mu = np.asarray(mu, np.float32).reshape(-1, 1)
        rstd = np.asarray(rstd, np.float32).reshape(-1, 1)
        xhat = (x32 - mu) * rstd
        ghat = dy32 * _gain(gamma, zero_centered_gamma)
        a = (canonical_sum_ref(ghat) / kf)[:, None]
        b = (canonical_sum_ref(ghat * xhat) / kf)[:, None]
        dx = rstd * ((ghat - a) - xhat * b)
        dgamma = canonical_sum_ref(dy32 * xhat, axis=0)
        dbeta = canonical_sum_ref(dy32, axis=0)
        pdt = np.asarray(gamma).dtype.name
        return (round_to_dtype_ref(dx, np.asarray(x).dtype.name).reshape(shape), round_to_dtype_ref(dgamma, pdt),
                round_to_dtype_ref(dbeta, pdt))


def rmsnorm_fwd_ref(x, gamma, eps: float, zero_centered_gamma: bool):
    """(y, rstd): y = fl(fl(x · rstd) · g') in x's dtype, rstd float32 of shape x.shape[:-1]."""
    with np.errstate(all="ignore"):
        x32, shape, k = _rows(x)
        ms = canonical_sum_ref(x32 * x32) / np.float32(k)
        rstd = _rstd(ms, eps)
        y = (x32 * rstd[:, None]) * _gain(gamma, zero_centered_gamma)
        return round_to_dtype_ref(y, np.asarray(x).dtype.name).reshape(shape), rstd.reshape(shape[:-1])


def rmsnorm_bwd_ref(dy, x, rstd, gamma, zero_centered_gamma: bool):
    """(dx, dgamma): dx = fl(rstd · fl(ĝ − fl(x̂ · b))), dγ = Σc_rows fl(dy·x̂)."""
    with np.errstate(all="ignore"):
        x32, shape, k = _rows(x)
        dy32 = to_fp32(dy).reshape(-1, k)
        rstd = np.asarray(rstd, np.float32).reshape(-1, 1)
        xhat = x32 * rstd
        ghat = dy32 * _gain(gamma, zero_centered_gamma)
        b = (canonical_sum_ref(ghat * xhat) / np.float32(k))[:, None]
        dx = rstd * (ghat - xhat * b)
        dgamma = canonical_sum_ref(dy32 * xhat, axis=0)
        return (round_to_dtype_ref(dx, np.asarray(x).dtype.name).reshape(shape),
                round_to_dtype_ref(dgamma, np.asarray(gamma).dtype.name))


def l2norm_fwd_ref(x, eps: float):
    """(y, rstd): rstd = fl(1 / fl(sqrt(fl(Σc fl(x·x) + ε)))), y = fl(x · rstd) in x's dtype."""
    with np.errstate(all="ignore"):
        x32, shape, _ = _rows(x)
        rstd = _rstd(canonical_sum_ref(x32 * x32), eps)
        y = x32 * rstd[:, None]
        return round_to_dtype_ref(y, np.asarray(x).dtype.name).reshape(shape), rstd.reshape(shape[:-1])


def l2norm_bwd_ref(dy, x, rstd):
    """dx = fl(rstd · fl(dy − fl(y · fl(Σc fl(dy·y))))) with y = fl(x · rstd) in fp32."""
    with np.errstate(all="ignore"):
        x32, shape, k = _rows(x)
        dy32 = to_fp32(dy).reshape(-1, k)
        rstd = np.asarray(rstd, np.float32).reshape(-1, 1)
        y = x32 * rstd
        s = canonical_sum_ref(dy32 * y)[:, None]
        dx = rstd * (dy32 - y * s)
        return round_to_dtype_ref(dx, np.asarray(x).dtype.name).reshape(shape)

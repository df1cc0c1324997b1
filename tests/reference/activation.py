"""Independent NumPy reference of the activations and their gradients (NUMERICS.md §11).

Written from the spec only; never imports twinengine's kernels or frontends, torch
or jax (it builds on the independent twinengine.testing.reference). Two references:

* ``activation_fwd_ref`` / ``activation_bwd_ref``: the spec's fp32 step sequence, every
  written step one fp32 rounding (NumPy float32 arithmetic is IEEE round-to-nearest, no FMA),
  with ``exp`` / ``tanh`` evaluated in float64 and rounded once to fp32 (the correctly rounded
  transcendental). For ReLU / SReLU / ReGLU / SReGLU (no transcendental) this defines the
  bytes; elsewhere a kernel differs from it only through its exp / tanh error.
* ``activation_fwd_f64``: the mathematical function in float64 (no intermediate rounding),
  for a sanity bound of the whole fp32 evaluation.

Both take x as float32 / bfloat16 / float16 (widened exactly) and return float32 (rounded to
the output dtype by ``round_to_dtype_ref``).
"""

from __future__ import annotations

import numpy as np

from twinengine.testing.reference import round_to_dtype_ref, to_fp32

GATED = ("geglu", "qgeglu", "reglu", "sreglu", "swiglu", "clamped_swiglu")
BASE = {"gelu": "gelu", "geglu": "gelu", "qgelu": "qgelu", "qgeglu": "qgelu", "relu": "relu", "reglu": "relu",
        "srelu": "srelu", "sreglu": "srelu", "silu": "silu", "swiglu": "silu", "clamped_swiglu": "clamped"}

F = np.float32
_GELU_K = F(0.7978845608)
_GELU_C = F(0.044715)
_GELU_DC = F(0.1070322243)
_QGELU_ALPHA = F(1.702)


def exp32(z: np.ndarray) -> np.ndarray:
    """Correctly rounded fp32 e^z (float64 exp, one rounding)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(np.asarray(z, np.float64)).astype(np.float32)


def tanh32(z: np.ndarray) -> np.ndarray:
    """Correctly rounded fp32 tanh(z)."""
    return np.tanh(np.asarray(z, np.float64)).astype(np.float32)


def _sigmoid(z):
    e = exp32(-z)
    return (F(1) / (F(1) + e)).astype(np.float32)


def _sigmoid_linear(x, alpha):
    """(x·σ(z), fl(fl(fl(z·s)·fl(1 − s)) + s)) with z = fl(alpha·x)."""
    z = (alpha * x).astype(np.float32)
    s = _sigmoid(z)
    return (x * s).astype(np.float32), ((z * s) * (F(1) - s) + s).astype(np.float32)


def _gelu(x):
    u = (_GELU_K * x) * (F(1) + _GELU_C * (x * x))
    t = tanh32(u)
    half_x = F(0.5) * x
    one_plus = F(1) + t
    value = half_x * one_plus
    deriv = half_x * ((F(1) - t * t) * (_GELU_K + _GELU_DC * (x * x))) + F(0.5) * one_plus
    return value.astype(np.float32), deriv.astype(np.float32)


def _relu(x):
    return np.where((x > 0) | np.isnan(x), x, F(0)).astype(np.float32)


def _base(kind: str, x: np.ndarray, alpha: np.float32):
    """(value, derivative) of the base activation (ReLU types: derivative for x > 0)."""
    base = BASE[kind]
    if base == "gelu":
        return _gelu(x)
    if base == "qgelu":
        return _sigmoid_linear(x, _QGELU_ALPHA)
    if base == "silu":
        return _sigmoid_linear(x, F(1))
    if base == "clamped":
        return _sigmoid_linear(x, alpha)
    r = _relu(x)
    if base == "relu":
        return r, np.ones_like(r)
    return (r * r).astype(np.float32), (F(2) * r).astype(np.float32)


def _halves(x: np.ndarray):
    k = x.shape[-1]
    return x[..., : k // 2], x[..., k // 2:]


def activation_fwd_ref(x, kind: str, limit: float = 7.0, alpha: float = 1.702) -> np.ndarray:
    """fp32 act(x) per NUMERICS.md §11 (before rounding to the output dtype)."""
    x = to_fp32(x)
    lim, al = F(limit), F(alpha)
    with np.errstate(all="ignore"):
        if kind not in GATED:
            return _base(kind, x, al)[0]
        a, b = _halves(x)
        if kind == "clamped_swiglu":
            ac = np.where(a > lim, lim, a).astype(np.float32)
            bc = np.where(b < -lim, -lim, np.where(b > lim, lim, b)).astype(np.float32)
            return (_sigmoid_linear(ac, al)[0] * (bc + F(1))).astype(np.float32)
        return (_base(kind, a, al)[0] * b).astype(np.float32)


def activation_bwd_ref(dy, x, kind: str, limit: float = 7.0, alpha: float = 1.702) -> np.ndarray:
    """fp32 dx per NUMERICS.md §11: dx = fl(act'(x)·dy); gated da = fl(fl(act'(a)·dy)·g),
    db = fl(dy·act(a)) (g = b, ClampedSwiGLU fl(b' + 1)); ReLU types give +0 for x <= 0, clamps
    pass the gradient at their bounds and give +0 outside; a NaN input gives a NaN gradient."""
    x, dy = to_fp32(x), to_fp32(dy)
    lim, al = F(limit), F(alpha)
    relu_type = BASE[kind] in ("relu", "srelu")
    with np.errstate(all="ignore"):
        if kind not in GATED:
            _, d = _base(kind, x, al)
            dx = (d * dy).astype(np.float32)
            if relu_type:
                dx = np.where(x > 0, dx, np.where(np.isnan(x), x, F(0)))
            return dx.astype(np.float32)
        a, b = _halves(x)
        if kind == "clamped_swiglu":
            ac = np.where(a > lim, lim, a).astype(np.float32)
            bc = np.where(b < -lim, -lim, np.where(b > lim, lim, b)).astype(np.float32)
            v, d = _sigmoid_linear(ac, al)
            da = np.where(a > lim, F(0), (d * dy) * (bc + F(1)))
            db = np.where(np.isnan(b), b, np.where((b < -lim) | (b > lim), F(0), dy * v))
        else:
            v, d = _base(kind, a, al)
            da = (d * dy) * b
            if relu_type:
                da = np.where(a > 0, da, np.where(np.isnan(a), a, F(0)))
            db = dy * v
        return np.concatenate([da.astype(np.float32), db.astype(np.float32)], axis=-1)


def activation_fwd_f64(x, kind: str, limit: float = 7.0, alpha: float = 1.702) -> np.ndarray:
    """The mathematical act(x) in float64 with the spec's constants (no intermediate rounding)."""
    x = to_fp32(x).astype(np.float64)

    def sig(z):
        return 1.0 / (1.0 + np.exp(-z))

    def base(kind, v):
        b = BASE[kind]
        if b == "gelu":
            return 0.5 * v * (1.0 + np.tanh(0.7978845608 * v * (1.0 + 0.044715 * v * v)))
        if b == "qgelu":
            return v * sig(1.702 * v)
        if b == "silu":
            return v * sig(v)
        r = np.where(v > 0, v, 0.0)
        return r if b == "relu" else r * r

    with np.errstate(all="ignore"):
        if kind not in GATED:
            return base(kind, x)
        a, b = _halves(x)
        if kind == "clamped_swiglu":
            ac, bc = np.minimum(a, limit), np.clip(b, -limit, limit)
            return ac * sig(alpha * ac) * (bc + 1.0)
        return base(kind, a) * b


def round_output(y_fp32, dtype_name: str) -> np.ndarray:
    """The fp32 result rounded (RNE) to the output dtype."""
    return round_to_dtype_ref(y_fp32, dtype_name)

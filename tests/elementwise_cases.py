"""Inputs and bounds shared by the activation / dropout / bias tests (torch, JAX, parity, GPU).

The activation error bound (docs/numerics_transcendentals.md): a kernel result y and the
reference y* (the spec's fp32 steps with correctly rounded exp / tanh, or the float64 function)
satisfy  |y − y*| <= ACT_ULPS · (ulp(y*) + ulp(m))  in the output dtype, where m is the
magnitude of the operands the last steps combine (``operand_magnitude``). The ulp(m) term is
the absolute error an exp / tanh ulp leaves where the result cancels (GELU's 1 + tanh for
negative x, the zero of σ-type derivatives); elsewhere the bound is ACT_ULPS ulps of y*.
"""

from __future__ import annotations

import numpy as np
from reference import activation as ref_act

import twinengine as te
from quantize_block_cases import RNG_STATE

DTYPES = ["float32", "bfloat16", "float16"]

ACT_ULPS = 3
"""The documented bound (see the module docstring and docs/numerics_transcendentals.md, which
lists the measured maxima per kind: at most 2.0 against the fp32-step reference and 1.45
against float64)."""

EXACT_KINDS = ("relu", "reglu", "srelu", "sreglu")
"""Kinds without a transcendental: bytes defined by NUMERICS.md, compared exactly."""

_MANT_BITS = {"float32": 23, "bfloat16": 7, "float16": 10}
_MIN_EXP = {"float32": -126, "bfloat16": -126, "float16": -14}

FUSED_QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3"),
    te.Float8CurrentScalingQuantizer("e5m2", force_pow_2_scales=True),
    te.Float8DelayedScalingQuantizer("e4m3"),
    te.MXFP8Quantizer("e4m3"),
    te.MXFP8Quantizer("e5m2", with_2d_quantization=True),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    te.NVFP4Quantizer(),
    te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
]
"""One or two quantizers of every family (current, delayed with scale, MXFP8, FP8 block, NVFP4
incl. RHT + stochastic rounding) for the fused-quantize tests; inputs are bf16 (128, 256)."""

DELAYED_SCALE = np.array([0.3712], np.float32)


def quantize_extras(q: te.Quantizer) -> dict[str, np.ndarray | None]:
    """The scale= / rng= arrays a quantize call with `q` takes."""
    return {"scale": DELAYED_SCALE if q.scaling_mode == "fp8_delayed" else None,
            "rng": RNG_STATE if getattr(q, "stochastic_rounding", False) else None}


def ulp(v: np.ndarray, dtype: str) -> np.ndarray:
    """ulp of |v| in `dtype` (float64 result; subnormal spacing below the smallest normal)."""
    a = np.abs(np.asarray(v, np.float64))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.maximum(a, 2.0 ** _MIN_EXP[dtype])))
    return 2.0 ** (e - _MANT_BITS[dtype])


def sweep_input(n: int, dtype: str, seed: int = 0, lo: float = 1e-30, hi: float = 120.0) -> np.ndarray:
    """n values, log-uniform magnitudes in [lo, hi], random signs, rounded to `dtype`."""
    rng = np.random.default_rng(seed)
    mag = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    x = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    return ref_act.round_output(x, dtype)


SPECIAL_VALUES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 6e4, -6e4, 1e-30, -1e-30, 1e-40, -1e-40,
                           7.0, -7.0, 7.0000005, -7.0000005, 1.0, -1.0, 88.72, -88.72, 104.0, -104.0, 9.02, -9.02,
                           0.625, -0.625, 2e-38, -2e-38], np.float32)
"""Zeros, infinities, NaN, huge (overflowing fp16/bf16), tiny and subnormal values, the clamp
bounds ±7 (the default limit) and their neighbours, the exp / tanh range ends."""


def operand_magnitude(x: np.ndarray, kind: str, dy: np.ndarray | None = None, limit: float = 7.0,
                      alpha: float = 1.702) -> np.ndarray:
    """m of the error bound: forward |x| (gated max(|a|, 2^-126)·|g|, g = b or ClampedSwiGLU's b' + 1);
    backward |dy|·max(1, |s·x|)^p with s the sigmoid slope (1.702 QGELU, alpha ClampedSwiGLU,
    else 1) and p = 3 for GELU types, 1 otherwise; gated da times |g|."""
    with np.errstate(all="ignore"):
        return _operand_magnitude(np.asarray(x, np.float64), kind, dy, limit, alpha)


def _operand_magnitude(x: np.ndarray, kind: str, dy, limit: float, alpha: float) -> np.ndarray:
    base = ref_act.BASE[kind]
    p = 3 if base == "gelu" else 1
    slope = {"qgelu": 1.702, "clamped": alpha}.get(base, 1.0)
    if kind not in ref_act.GATED:
        return np.abs(x) if dy is None else np.abs(np.asarray(dy, np.float64)) * np.maximum(1.0, np.abs(slope * x)) ** p
    k = x.shape[-1] // 2
    a, b = x[..., :k], x[..., k:]
    if kind == "clamped_swiglu":
        a, g = np.minimum(a, limit), np.clip(b, -limit, limit) + 1.0
    else:
        g = b
    if dy is None:  # act(a) rounds on the fp32 grid (spacing 2^-149 below 2^-126) before the product
        return np.maximum(np.abs(a), 2.0**-126) * np.abs(g)
    d = np.abs(np.asarray(dy, np.float64)) * np.maximum(1.0, np.abs(slope * a)) ** p
    return np.concatenate([d * np.abs(g), d], axis=-1)


def assert_within_bound(got: np.ndarray, want: np.ndarray, m: np.ndarray, dtype: str, what: str,
                        ulps: float = ACT_ULPS) -> None:
    """NaN where want is NaN; equal infinities; elsewhere |got − want| <= ulps·(ulp(want) + ulp(m))."""
    g = np.asarray(got).astype(np.float64)
    w = np.asarray(want).astype(np.float64)
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan), f"{what}: NaN at {np.flatnonzero(np.isnan(g) != nan)[:5]}"
    inf = np.isinf(w) | np.isinf(g)
    assert np.array_equal(g[inf], w[inf]), f"{what}: infinities differ at {np.flatnonzero(inf)[:5]}"
    ok = ~nan & ~inf
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g - w)[ok]
        bound = ulps * (ulp(w, dtype) + ulp(np.asarray(m, np.float64), dtype))[ok]
    bad = np.flatnonzero(err > bound)
    assert bad.size == 0, (f"{what}: {bad.size} values beyond {ulps}·(ulp(ref) + ulp(m)); first got {g[ok][bad[0]]!r} "
                           f"want {w[ok][bad[0]]!r}")


def canonical_nans(a: np.ndarray) -> np.ndarray:
    """`a` with every NaN replaced by the positive quiet NaN: IEEE leaves the sign and payload of
    a NaN result unspecified (x86 gives the first operand's NaN or a negative default NaN, CUDA
    a canonical one), so NaNs are compared by predicate, everything else by bytes."""
    a = np.array(a, copy=True)
    if np.issubdtype(a.dtype, np.integer):
        return a
    a[np.isnan(a.astype(np.float32))] = np.nan
    return a


def assert_bytes_equal_nan(actual, expected, name: str) -> None:
    """assert_bytes_equal after canonical_nans on both sides."""
    from helpers import assert_bytes_equal

    assert_bytes_equal(canonical_nans(np.asarray(actual)), canonical_nans(np.asarray(expected)), name)

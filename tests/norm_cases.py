"""Norm cases shared by the pytorch, jax, parity and gpu norm tests: inputs with the edge rows
NUMERICS.md §11 cares about, and the quantizers the fused forward is tested with."""

from __future__ import annotations

import numpy as np
from helpers import NUMPY_DTYPES, assert_bytes_equal
from reference import norm as ref

import twinengine as te

NORMS = ("layernorm", "rmsnorm", "l2norm")
DTYPES = ("float32", "bfloat16", "float16")
KS = (1, 7, 32, 33, 100, 1024)
EPS = 1e-5  # not an fp32 value: the kernels and the reference both round it to fp32 first


def assert_norm_equal(actual, expected, name: str) -> None:
    """Byte equality except that NaNs compare by predicate: same positions, any sign or payload.

    NUMERICS.md §11 fixes every rounding but not the NaN a NaN-producing operation returns: x86
    keeps one operand's payload (which one depends on how the compiler ordered a commutative add)
    and CUDA returns its canonical NaN. Every non-NaN element must match bit for bit.
    """
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.shape == e.shape, f"{name}: shape {a.shape} != expected {e.shape}"
    a_nan, e_nan = np.isnan(a.astype(np.float32)), np.isnan(e.astype(np.float32))
    bad = np.flatnonzero(a_nan.reshape(-1) != e_nan.reshape(-1))
    assert bad.size == 0, f"{name}: NaN positions differ ({bad.size} elements, first flat index {bad[0]})"
    zero = np.zeros((), a.dtype)
    assert_bytes_equal(np.where(a_nan, zero, a), np.where(e_nan, np.zeros((), e.dtype), e), name)


def param_dtype(x_dtype: str, shift: int) -> str:
    """A parameter dtype that differs from x's for odd `shift` (mixed-precision parameters)."""
    return DTYPES[(DTYPES.index(x_dtype) + shift) % len(DTYPES)]


def make_rows(rows: int, k: int, dtype: str, family: str, seed: int = 0) -> np.ndarray:
    """x of shape (rows, k). family "mixed": normal rows at mixed scales plus a row of constants, a
    subnormal row and a row near the dtype's overflow; "nan_inf": NaN, ±inf rows among normal ones."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x *= (np.float32(10.0) ** rng.integers(-3, 4, (rows, 1))).astype(np.float32)
    x += rng.standard_normal((rows, 1)).astype(np.float32)  # non-zero means
    special = {"mixed": [np.full(k, 3.25, np.float32), rng.standard_normal(k).astype(np.float32) * np.float32(1e-40),
                         rng.standard_normal(k).astype(np.float32) * np.float32(3e4)],
               "nan_inf": [np.where(np.arange(k) % 3 == 0, np.float32(np.nan), np.float32(1.5)),
                           np.where(np.arange(k) == 0, np.float32(np.inf), np.float32(-2.0)),
                           np.where(np.arange(k) % 2 == 0, np.float32(-np.inf), np.float32(np.inf))]}[family]
    for i, row in enumerate(special[:rows]):
        x[(3 * i + 1) % rows] = row
    if dtype == "float16":  # keep the large row finite where fp16 can hold it
        x = np.clip(x, np.float32(-6e4), np.float32(6e4)) if family == "mixed" else x
    with np.errstate(over="ignore"):
        return x.astype(NUMPY_DTYPES[dtype])


def make_param(k: int, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(100 + seed)
    return (rng.standard_normal(k).astype(np.float32) * np.float32(0.5)).astype(NUMPY_DTYPES[dtype])


def make_case(norm: str, dtype: str, k: int, rows: int, family: str, shift: int, seed: int = 0):
    """(x, weight, bias, dy) NumPy inputs of `norm` (weight / bias None where the norm has none);
    the parameters' dtype is param_dtype(dtype, shift)."""
    x = make_rows(rows, k, dtype, family, seed)
    pdt = param_dtype(dtype, shift)
    weight = make_param(k, pdt, seed) if norm != "l2norm" else None
    bias = make_param(k, pdt, seed + 1) if norm == "layernorm" else None
    dy = make_rows(rows, k, dtype, "mixed", seed + 2)
    return x, weight, bias, dy


def reference_fwd(norm: str, x, weight, bias, zero_centered_gamma: bool):
    """The reference forward outputs of `norm`, in the frontends' order (without qt)."""
    if norm == "layernorm":
        return ref.layernorm_fwd_ref(x, weight, bias, EPS, zero_centered_gamma)
    if norm == "rmsnorm":
        return ref.rmsnorm_fwd_ref(x, weight, EPS, zero_centered_gamma)
    return ref.l2norm_fwd_ref(x, EPS)


def reference_bwd(norm: str, dy, x, saved, weight, zero_centered_gamma: bool):
    """The reference backward outputs of `norm` from the forward's saved stats, as a tuple."""
    if norm == "layernorm":
        return ref.layernorm_bwd_ref(dy, x, saved[0], saved[1], weight, zero_centered_gamma)
    if norm == "rmsnorm":
        return ref.rmsnorm_bwd_ref(dy, x, saved[0], weight, zero_centered_gamma)
    return (ref.l2norm_bwd_ref(dy, x, saved[0]),)


def run_norm(api, norm: str, x, weight, bias, zero_centered_gamma: bool, dy, **quantize):
    """Forward then backward through one frontend's norm API (a module with *_fwd / *_bwd):
    returns (forward outputs without qt, qt, backward outputs)."""
    if norm == "layernorm":
        y, mu, rstd, qt = api.layernorm_fwd(x, weight, bias, EPS, zero_centered_gamma, **quantize)
        return (y, mu, rstd), qt, api.layernorm_bwd(dy, x, mu, rstd, weight, zero_centered_gamma)
    if norm == "rmsnorm":
        y, rstd, qt = api.rmsnorm_fwd(x, weight, EPS, zero_centered_gamma, **quantize)
        return (y, rstd), qt, api.rmsnorm_bwd(dy, x, rstd, weight, zero_centered_gamma)
    y, rstd, qt = api.l2norm_fwd(x, EPS, **quantize)
    return (y, rstd), qt, (api.l2norm_bwd(dy, x, rstd),)


RNG_STATE = np.array([0x1234ABCD, 4_000_000_007], np.uint32)
DELAYED_SCALE = np.array([0.3712], np.float32)

FUSED_QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3"),
    te.Float8CurrentScalingQuantizer("e5m2", force_pow_2_scales=True, columnwise=False),
    te.Float8DelayedScalingQuantizer("e4m3"),
    te.MXFP8Quantizer("e4m3"),
    te.MXFP8Quantizer("e4m3", with_2d_quantization=True),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    te.NVFP4Quantizer(),
    te.NVFP4Quantizer(with_2d_quantization=True),
    te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
]
"""One or more quantizers of every family; shape FUSED_SHAPE suits all of them."""

FUSED_SHAPE = (2, 64, 128)


def fused_dtype(q: te.Quantizer) -> str:
    """bf16 for the RHT (defined for bf16 input only), else fp16 (a dtype y is rounded to)."""
    return "bfloat16" if getattr(q, "with_rht", False) else "float16"


def quantize_kwargs(q: te.Quantizer, to_array) -> dict:
    """scale= / rng= for quantizer `q`, converted with `to_array`."""
    kwargs = {}
    if q.scaling_mode == "fp8_delayed":
        kwargs["scale"] = to_array(DELAYED_SCALE)
    if getattr(q, "stochastic_rounding", False):
        kwargs["rng"] = to_array(RNG_STATE.astype(np.int64))
    return kwargs


def case_id(value) -> str:
    if isinstance(value, te.Quantizer):
        return value.__fx_repr__()[0].replace(" ", "")
    return str(value)

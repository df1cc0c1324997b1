"""PyTorch activation family: forward / backward within the documented bound of the NumPy
references (bytes for the ReLU kinds), special values and kinks, the fused quantize and
bias-gradient paths against the separate ops, compile, opcheck, bad input."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from elementwise_cases import (DTYPES, EXACT_KINDS, FUSED_QUANTIZERS, SPECIAL_VALUES, assert_within_bound,
                               operand_magnitude, quantize_extras, sweep_input)
from helpers import assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch, no_recompiles, to_torch
from quantize_cases import case_id
from reference import activation as ref_act
from reference import bias as ref_bias

import twinengine as te
from twinengine.pytorch import quantize
from twinengine.pytorch._ops import activation as A
from twinengine.pytorch._ops import bias as B

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _t(a) -> torch.Tensor | None:
    return None if a is None else to_torch(np.asarray(a))


def _check_fwd(x: np.ndarray, kind: str, dtype: str, vs_float64: bool = True, **params) -> None:
    y = from_torch(A.activation_fwd(to_torch(x), kind, **params)[0])
    want = ref_act.round_output(ref_act.activation_fwd_ref(x, kind, **params), dtype)
    if kind in EXACT_KINDS:
        assert_bytes_equal(y, want, f"{kind} {dtype} forward")
        return
    m = operand_magnitude(x, kind, limit=params.get("limit", 7.0), alpha=params.get("alpha", 1.702))
    assert_within_bound(y, want, m, dtype, f"{kind} {dtype} forward vs fp32-step reference")
    if dtype == "float32" and vs_float64:  # fp32 overflow (inf·0 = NaN) is no float64 behaviour
        exact = ref_act.activation_fwd_f64(x, kind, **params)
        assert_within_bound(y, exact, m, dtype, f"{kind} forward vs float64")


def _check_bwd(x: np.ndarray, dy: np.ndarray, kind: str, dtype: str, **params) -> None:
    dx = from_torch(A.activation_bwd(to_torch(dy), to_torch(x), kind, **params))
    want = ref_act.round_output(ref_act.activation_bwd_ref(dy, x, kind, **params), dtype)
    if kind in EXACT_KINDS:
        assert_bytes_equal(dx, want, f"{kind} {dtype} backward")
        return
    m = operand_magnitude(x, kind, dy=dy, limit=params.get("limit", 7.0), alpha=params.get("alpha", 1.702))
    assert_within_bound(dx, want, m, dtype, f"{kind} {dtype} backward")


def _dy_for(x: np.ndarray, kind: str, dtype: str, seed: int = 3) -> np.ndarray:
    shape = x.shape[:-1] + ((x.shape[-1] // 2,) if kind in ref_act.GATED else (x.shape[-1],))
    return ref_act.round_output(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", A.ACTIVATIONS)
def test_activation_matches_reference(kind, dtype):
    x = sweep_input(1 << 16, dtype, seed=11).reshape(-1, 64)
    _check_fwd(x, kind, dtype)
    _check_bwd(x, _dy_for(x, kind, dtype), kind, dtype)


@pytest.mark.parametrize("kind", ["gelu", "qgelu", "silu"])
def test_activation_transcendentals_big_sweep(kind):
    """exp / tanh through SiLU, QGELU and GELU on 2^20 fp32 inputs over the whole range where
    the results are finite, subnormal, or under/overflow (|x| up to 120)."""
    x = sweep_input(1 << 20, "float32", seed=5, lo=1e-40, hi=120.0).reshape(-1, 256)
    _check_fwd(x, kind, "float32")
    dense = np.linspace(-12.0, 12.0, 1 << 18, dtype=np.float32).reshape(-1, 256)  # the curved part, densely
    _check_fwd(dense, kind, "float32")
    _check_bwd(dense, _dy_for(dense, kind, "float32"), kind, "float32")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", A.ACTIVATIONS)
def test_activation_special_values(kind, dtype):
    v = ref_act.round_output(SPECIAL_VALUES, dtype)
    # Every pair (a, b) of special values, so the gated kinds see each one in both halves.
    a, b = np.meshgrid(v, v, indexing="ij")
    x = np.concatenate([a.reshape(-1, 1), b.reshape(-1, 1)], axis=1) if kind in ref_act.GATED else v.reshape(-1, 1)
    _check_fwd(x, kind, dtype, vs_float64=False)
    _check_bwd(x, _dy_for(x, kind, dtype, seed=4), kind, dtype)


def test_activation_kinks_follow_pytorch():
    x = torch.tensor([[0.0, -0.0, 1e-30, -1e-30, 2.0, -2.0]])
    dy = torch.full_like(x, 3.0)
    zero = torch.zeros_like(x)
    assert torch.equal(A.activation_bwd(dy, x, "relu"), torch.where(x > 0, dy, zero))
    assert torch.equal(A.activation_bwd(dy, x, "srelu"), torch.where(x > 0, (2 * x) * dy, zero))
    assert not A.activation_bwd(dy, x, "relu")[0, :2].signbit().any()  # +0 at both zeros
    # torch's own ReLU gradient agrees at the kink and elsewhere
    xr = x.clone().requires_grad_()
    torch.relu(xr).backward(dy)
    assert torch.equal(A.activation_bwd(dy, x, "relu"), xr.grad)
    # ReGLU: da = 0 at a = 0; db = dy·relu(a)
    g = A.activation_bwd(torch.ones(1, 1), torch.tensor([[0.0, 5.0]]), "reglu")
    assert g.tolist() == [[0.0, 0.0]]
    # ClampedSwiGLU: the gradient passes at a = limit and b = ±limit, is 0 beyond
    limit = 7.0
    xs = torch.tensor([[limit, np.nextafter(np.float32(limit), np.float32(20)).item(), 0.5, 0.5],
                       [0.5, 0.5, limit, -limit], [0.5, 0.5, 7.5, -7.5]])
    d = A.activation_bwd(torch.ones(3, 2), xs, "clamped_swiglu", limit=limit)
    assert d[0, 0] != 0 and d[0, 1] == 0 and d[1, 2] != 0 and d[1, 3] != 0 and d[2, 2] == 0 and d[2, 3] == 0


def test_activation_clamped_swiglu_params():
    x = sweep_input(4096, "float32", seed=9, lo=1e-3, hi=20.0).reshape(-1, 64)
    _check_fwd(x, "clamped_swiglu", "float32", limit=3.5, alpha=1.25)
    _check_bwd(x, _dy_for(x, "clamped_swiglu", "float32"), "clamped_swiglu", "float32", limit=3.5, alpha=1.25)


@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_zero_rows(dtype):
    x = torch.empty(0, 3, 8, dtype=TORCH_DTYPES[dtype])
    y, qt = A.activation_fwd(x, "swiglu")
    assert y.shape == (0, 3, 4) and y.dtype == x.dtype and qt is None
    assert A.activation_bwd(torch.empty(0, 3, 4, dtype=x.dtype), x, "swiglu").shape == (0, 3, 8)
    dx, db, _ = A.activation_bwd_dbias(torch.empty(0, 3, 8, dtype=x.dtype), x, "gelu", bias_dtype=torch.float32)
    assert dx.shape == (0, 3, 8) and torch.equal(db, torch.zeros(8))


def _fused_input(kind: str) -> np.ndarray:
    k = 512 if kind in ref_act.GATED else 256
    return ref_act.round_output(np.random.default_rng(2).standard_normal((128, k)).astype(np.float32) * 3, "bfloat16")


@pytest.mark.parametrize("kind", ["swiglu", "gelu"])
@pytest.mark.parametrize("q", FUSED_QUANTIZERS, ids=case_id)
def test_activation_fused_quantize_matches_separate(q, kind):
    x = to_torch(_fused_input(kind))
    extras = {name: _t(v) for name, v in quantize_extras(q).items()}
    y, qt = A.activation_fwd(x, kind, quantizer=q, **extras)
    y_sep, none = A.activation_fwd(x, kind)
    assert none is None
    assert_bytes_equal(from_torch(y), from_torch(y_sep), "y")
    sep = quantize(y_sep, q, **extras)
    assert qt.quantizer == q and qt.shape == tuple(y.shape) and qt.dtype == "bfloat16"
    assert_quantized_equal(fields_as_numpy(qt), fields_as_numpy(sep), f"fused {kind} {case_id(q)}")


@pytest.mark.parametrize("q", [None] + FUSED_QUANTIZERS, ids=case_id)
def test_activation_bwd_dbias_matches_separate(q):
    kind = "geglu" if q is None or q.scaling_mode != "nvfp4" else "srelu"
    x = _fused_input(kind)
    dy = _dy_for(x, kind, "bfloat16")
    extras = {name: _t(v) for name, v in quantize_extras(q).items()} if q is not None else {}
    dx, db, qt = A.activation_bwd_dbias(to_torch(dy), to_torch(x), kind, bias_dtype=torch.float32, quantizer=q,
                                        **extras)
    dx_sep = A.activation_bwd(to_torch(dy), to_torch(x), kind)
    assert_bytes_equal(from_torch(dx), from_torch(dx_sep), "dx")
    assert_bytes_equal(from_torch(db), from_torch(B.bias_grad(dx_sep, torch.float32)), "dbias vs bias_grad")
    assert_bytes_equal(from_torch(db), ref_bias.bias_grad_ref(from_torch(dx_sep), "float32"), "dbias vs reference")
    if q is None:
        assert qt is None
    else:
        assert_quantized_equal(fields_as_numpy(qt), fields_as_numpy(quantize(dx_sep, q, **extras)), "quantized dx")


def test_activation_bwd_dbias_mixed_dtypes():
    x = sweep_input(64 * 96, "float16", seed=1, lo=1e-3, hi=10).reshape(2, 32, 96)
    dy = _dy_for(x, "qgelu", "float16")
    for bias_dtype in (torch.float32, torch.bfloat16, torch.float16):
        dx, db, _ = A.activation_bwd_dbias(to_torch(dy), to_torch(x), "qgelu", bias_dtype=bias_dtype)
        name = str(bias_dtype).removeprefix("torch.")
        assert_bytes_equal(from_torch(db), ref_bias.bias_grad_ref(from_torch(dx), name), f"dbias {name}")


def _step(x, dy, q):
    y, qt = A.activation_fwd(x, "swiglu", quantizer=q)
    dx, db, qdx = A.activation_bwd_dbias(dy, x, "swiglu", bias_dtype=torch.float32, quantizer=q)
    return y, qt.rowwise_data, dx, db, qdx.rowwise_data


_COMPILED_STEP = torch.compile(_step, fullgraph=True, dynamic=True)


def test_activation_compiled_matches_eager_dynamic_batch():
    q = te.Float8CurrentScalingQuantizer("e4m3")
    rng = np.random.default_rng(0)
    for i, rows in enumerate((48, 80, 16)):
        x = torch.from_numpy(rng.standard_normal((rows, 64)).astype(np.float32)).to(torch.bfloat16)
        dy = torch.from_numpy(rng.standard_normal((rows, 32)).astype(np.float32)).to(torch.bfloat16)
        with no_recompiles() if i else contextlib.nullcontext():
            got = _COMPILED_STEP(x, dy, q)
        for a, b in zip(got, _step(x, dy, q)):
            assert_bytes_equal(from_torch(a), from_torch(b), f"compiled vs eager rows={rows}")


# test_schema is left out where float8 tensors are outputs (see test_quantize.py).
FP8_OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_activation_opcheck():
    x, dy = torch.randn(32, 64), torch.randn(32, 32)
    q = te.MXFP8Quantizer("e4m3")
    torch.library.opcheck(torch.ops.twinengine.activation_fwd.default, (x, "geglu", 7.0, 1.702))
    torch.library.opcheck(torch.ops.twinengine.activation_bwd.default, (dy, x, "clamped_swiglu", 5.0, 1.5))
    torch.library.opcheck(torch.ops.twinengine.activation_bwd_dbias.default, (dy, x, "swiglu", 7.0, 1.702, "bfloat16"))
    torch.library.opcheck(torch.ops.twinengine.activation_fwd_quantize.default, (x, "relu", 7.0, 1.702, q, None, None),
                          test_utils=FP8_OPCHECK_UTILS)
    torch.library.opcheck(torch.ops.twinengine.activation_bwd_dbias_quantize.default,
                          (torch.randn(32, 64), x, "silu", 7.0, 1.702, "float32", q, None, None),
                          test_utils=FP8_OPCHECK_UTILS)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: A.activation_fwd(torch.randn(4, 7), "swiglu"), ValueError,
     r"twinengine.activation_fwd: gated activation 'swiglu' splits the last dimension into two halves"),
    (lambda: A.activation_fwd(torch.randn(4, 8), "gelu2"), ValueError, r"twinengine.activation_fwd: unknown activation 'gelu2'"),
    (lambda: A.activation_fwd(torch.randn(4, 8).double(), "gelu"), TypeError,
     r"twinengine.activation_fwd: x must be float32, bfloat16 or float16, got float64"),
    (lambda: A.activation_fwd(torch.randn(4, 8), "gelu", scale=torch.ones(1)), ValueError,
     r"twinengine.activation_fwd: scale= and rng= belong to the fused quantization"),
    (lambda: A.activation_bwd(torch.randn(4, 8), torch.randn(4, 8), "geglu"), ValueError,
     r"twinengine.activation_bwd: dy must have the shape of the activation output \(4, 4\)"),
    (lambda: A.activation_bwd(torch.randn(4, 8).half(), torch.randn(4, 8), "gelu"), TypeError,
     r"twinengine.activation_bwd: dy must have the dtype of x \(float32\), got float16"),
    (lambda: A.activation_bwd_dbias(torch.randn(4, 8), torch.randn(4, 8), "gelu", bias_dtype=torch.int32), TypeError,
     r"twinengine.activation_bwd_dbias: bias_dtype must be float32, bfloat16 or float16, got int32"),
    (lambda: A.activation_fwd(torch.randn(4, 8), "gelu", quantizer=te.MXFP8Quantizer()), ValueError,
     r"twinengine.quantize: MXFP8 needs the flattened \(R, K\) shape"),
    (lambda: A.activation_fwd(torch.randn(4, 8), "clamped_swiglu", limit=float("nan")), ValueError,
     r"twinengine.activation_fwd: limit must not be NaN"),
])
def test_activation_rejects_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()

"""PyTorch norm ops: bytes vs the NumPy reference (forward and backward), fused quantize ==
norm-then-quantize, compile, dynamic batch, opcheck, errors, gradients vs float64."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch, no_recompiles, to_torch
from norm_cases import (DTYPES, EPS, FUSED_QUANTIZERS, FUSED_SHAPE, KS, NORMS, assert_norm_equal, case_id, fused_dtype,
                        make_case, make_param, quantize_kwargs, reference_bwd, reference_fwd, run_norm)

import twinengine as te
import twinengine.pytorch as tep
from twinengine.pytorch._ops import norm as tn


def _case_params():
    """(norm, dtype, K, zero_centered_gamma, family), zero_centered_gamma only where the norm has a gain."""
    out = []
    for norm in NORMS:
        for dtype in DTYPES:
            for k in KS:
                for zcg in ((False, True) if norm != "l2norm" else (False,)):
                    for family in ("mixed", "nan_inf"):
                        out.append((norm, dtype, k, zcg, family))
    return out


def _torch(a):
    return None if a is None else to_torch(a)


def _check_against_reference(norm, x, weight, bias, zcg, dy, context):
    fwd, qt, bwd = run_norm(tn, norm, _torch(x), _torch(weight), _torch(bias), zcg, _torch(dy))
    assert qt is None
    expected_fwd = reference_fwd(norm, x, weight, bias, zcg)
    for i, (got, want) in enumerate(zip(fwd, expected_fwd, strict=True)):
        assert_norm_equal(from_torch(got), want, f"{context} forward output {i}")
    expected_bwd = reference_bwd(norm, dy, x, expected_fwd[1:], weight, zcg)
    for i, (got, want) in enumerate(zip(bwd, expected_bwd, strict=True)):
        assert_norm_equal(from_torch(got), want, f"{context} backward output {i}")


@pytest.mark.parametrize("norm,dtype,k,zcg,family", _case_params())
def test_norm_matches_reference(norm, dtype, k, zcg, family):
    # 37 rows: the column sums of dγ / dβ wrap around the 32 lanes.
    x, weight, bias, dy = make_case(norm, dtype, k, 37, family, shift=KS.index(k))
    _check_against_reference(norm, x, weight, bias, zcg, dy, f"{norm} {dtype} K={k} zcg={zcg} {family}")


@pytest.mark.parametrize("shape", [(0, 33), (1, 33), (1, 1), (33,), (2, 3, 40), (0, 2, 7)])
@pytest.mark.parametrize("norm", NORMS)
def test_norm_small_and_empty_shapes_match_reference(norm, shape):
    k, rows = shape[-1], int(np.prod(shape[:-1]))
    x, weight, bias, dy = make_case(norm, "bfloat16", k, max(rows, 1), "mixed", shift=1)
    x, dy = x[:rows].reshape(shape), dy[:rows].reshape(shape)
    _check_against_reference(norm, x, weight, bias, True, dy, f"{norm} {shape}")


@pytest.mark.parametrize("norm", NORMS)
def test_norm_empty_rows_give_zero_parameter_gradients(norm):
    x, weight, bias, dy = (_torch(a) for a in make_case(norm, "float32", 16, 1, "mixed", shift=0))
    x, dy = x[:0], dy[:0]
    fwd, _, bwd = run_norm(tn, norm, x, weight, bias, False, dy)
    assert fwd[0].shape == (0, 16) and all(t.shape == (0,) for t in fwd[1:])
    assert bwd[0].shape == (0, 16)
    for grad in bwd[1:]:
        assert grad.shape == (16,) and torch.equal(grad, torch.zeros(16, dtype=grad.dtype))


def _unfused_then_quantize(norm, x, weight, bias, q, kwargs):
    fwd, _, _ = run_norm(tn, norm, x, weight, bias, False, x)
    return fwd, tep.quantize(fwd[0], q, **kwargs)


@pytest.mark.parametrize("q", FUSED_QUANTIZERS, ids=case_id)
@pytest.mark.parametrize("norm", NORMS)
def test_norm_fused_quantize_matches_norm_then_quantize(norm, q):
    dtype = fused_dtype(q)
    x, weight, bias, _ = (_torch(a) for a in make_case(norm, dtype, FUSED_SHAPE[-1], 128, "mixed", shift=1))
    x = x.reshape(FUSED_SHAPE)
    kwargs = quantize_kwargs(q, torch.from_numpy)
    fused_fwd, qt, _ = run_norm(tn, norm, x, weight, bias, False, x, quantizer=q, **kwargs)
    unfused_fwd, expected = _unfused_then_quantize(norm, x, weight, bias, q, kwargs)
    for got, want in zip(fused_fwd, unfused_fwd, strict=True):
        assert_bytes_equal(from_torch(got), from_torch(want), f"{norm} fused forward output")
    assert qt.quantizer == q and qt.shape == FUSED_SHAPE and qt.dtype == dtype
    assert_quantized_equal(fields_as_numpy(qt), fields_as_numpy(expected), f"{norm} fused {case_id(q)}")


# One compiled function per norm: forward (optionally quantized) and backward.
def _fwd_bwd(norm, x, weight, bias, dy, q, scale, rng):
    kwargs = {"quantizer": q, "scale": scale, "rng": rng}
    fwd, qt, bwd = run_norm(tn, norm, x, weight, bias, True, dy, **kwargs)
    return fwd, qt, bwd


def _layernorm_fwd_bwd(*args):
    return _fwd_bwd("layernorm", *args)


def _rmsnorm_fwd_bwd(*args):
    return _fwd_bwd("rmsnorm", *args)


def _l2norm_fwd_bwd(*args):
    return _fwd_bwd("l2norm", *args)


# Separate functions: each has its own compile cache (one graph per quantizer).
_COMPILED = {norm: torch.compile(fn, fullgraph=True, backend="inductor")
             for norm, fn in zip(NORMS, (_layernorm_fwd_bwd, _rmsnorm_fwd_bwd, _l2norm_fwd_bwd))}

COMPILE_QUANTIZERS = [None, te.Float8DelayedScalingQuantizer("e4m3"), te.MXFP8Quantizer("e4m3"),
                      te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True)]


@pytest.mark.parametrize("q", COMPILE_QUANTIZERS, ids=case_id)
@pytest.mark.parametrize("norm", NORMS)
def test_norm_compiled_matches_eager(norm, q):
    x, weight, bias, dy = (_torch(a) for a in make_case(norm, "bfloat16", 64, 64, "mixed", shift=1))
    kwargs = quantize_kwargs(q, torch.from_numpy) if q is not None else {}
    args = (x, weight, bias, dy, q, kwargs.get("scale"), kwargs.get("rng"))
    eager, compiled = _fwd_bwd(norm, *args), _COMPILED[norm](*args)
    for part in (0, 2):
        for got, want in zip(compiled[part], eager[part], strict=True):
            assert_bytes_equal(from_torch(got), from_torch(want), f"{norm} compiled vs eager")
    if q is not None:
        assert_quantized_equal(fields_as_numpy(compiled[1]), fields_as_numpy(eager[1]), "compiled qt")


def test_norm_dynamic_batch_does_not_recompile():
    q = te.Float8CurrentScalingQuantizer("e4m3")

    def step(x, weight, bias, dy):
        y, mu, rstd, qt = tn.layernorm_fwd(x, weight, bias, EPS, False, quantizer=q)
        dx, dw, db = tn.layernorm_bwd(dy, x, mu, rstd, weight, False)
        r_y, r_rstd, _ = tn.rmsnorm_fwd(x, weight, EPS, True)
        return y, qt.rowwise_data, dx, dw, db, r_y, tn.rmsnorm_bwd(dy, x, r_rstd, weight, True)[0]

    fn = torch.compile(step, fullgraph=True, dynamic=True, backend="inductor")
    weight, bias = torch.randn(64), torch.randn(64)
    for rows in (32, 48, 96):
        x, dy = torch.randn(rows, 64), torch.randn(rows, 64)
        with no_recompiles() if rows != 32 else contextlib.nullcontext():
            got = fn(x, weight, bias, dy)
        for a, b in zip(got, step(x, weight, bias, dy), strict=True):
            assert_bytes_equal(from_torch(a), from_torch(b), f"dynamic rows={rows}")


# test_schema is left out where float8 tensors are outputs (SchemaCheckMode multiplies them, which
# CPU float8 tensors do not support), as in test_quantize.py.
FP8_OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_norm_opcheck_plain_ops():
    x, w, b, dy = torch.randn(5, 40, dtype=torch.bfloat16), torch.randn(40), torch.randn(40), torch.randn(5, 40)
    ops = torch.ops.twinengine
    torch.library.opcheck(ops.layernorm_fwd.default, (x, w, b, 1e-5, True))
    torch.library.opcheck(ops.rmsnorm_fwd.default, (x, w, 1e-5, False))
    torch.library.opcheck(ops.l2norm_fwd.default, (x, 1e-6))
    _, mu, rstd, _ = tn.layernorm_fwd(x, w, b, 1e-5, True)
    torch.library.opcheck(ops.layernorm_bwd.default, (dy, x, mu, rstd, w, True))
    _, rstd, _ = tn.rmsnorm_fwd(x, w, 1e-5, False)
    torch.library.opcheck(ops.rmsnorm_bwd.default, (dy, x, rstd, w, False))
    _, rstd, _ = tn.l2norm_fwd(x, 1e-6)
    torch.library.opcheck(ops.l2norm_bwd.default, (dy, x, rstd))


@pytest.mark.parametrize("q", [te.MXFP8Quantizer("e4m3"), te.Float8DelayedScalingQuantizer("e5m2"),
                               te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True)], ids=case_id)
def test_norm_opcheck_quantized_ops(q):
    x, w, b = torch.randn(64, 64, dtype=torch.bfloat16), torch.randn(64), torch.randn(64)
    kwargs = quantize_kwargs(q, torch.from_numpy)
    scale, rng = kwargs.get("scale"), kwargs.get("rng")
    utils = FP8_OPCHECK_UTILS if q.scaling_mode != "nvfp4" else None
    ops = torch.ops.twinengine
    check = (lambda op, args: torch.library.opcheck(op, args, test_utils=utils)) if utils else torch.library.opcheck
    check(ops.layernorm_fwd_quantized.default, (x, w, b, 1e-5, False, q, scale, rng))
    check(ops.rmsnorm_fwd_quantized.default, (x, w, 1e-5, True, q, scale, rng))
    check(ops.l2norm_fwd_quantized.default, (x, 0.0, q, scale, rng))


def test_norm_rejects_unsupported_device():
    with pytest.raises(ValueError, match="twinengine.rmsnorm_fwd: x is on device 'meta'"):
        tn.rmsnorm_fwd(torch.empty(4, 8, device="meta"), torch.ones(8), EPS, False)


# ---- gradients against float64 autograd ---------------------------------------------------

def _float64_reference(norm, x, weight, bias, zcg):
    x = x.double().requires_grad_()
    w = None if weight is None else weight.double().requires_grad_()
    b = None if bias is None else bias.double().requires_grad_()
    eps = float(np.float32(EPS))
    if norm == "layernorm":
        y = torch.nn.functional.layer_norm(x, (x.shape[-1],), (1 + w) if zcg else w, b, eps)
    elif norm == "rmsnorm":
        y = torch.nn.functional.rms_norm(x, (x.shape[-1],), (1 + w) if zcg else w, eps)
    else:
        y = x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)
    return y, [t for t in (x, w, b) if t is not None]


@pytest.mark.parametrize("zcg", [False, True])
@pytest.mark.parametrize("norm", NORMS)
def test_norm_gradients_match_float64_autograd(norm, zcg):
    # Plain normal rows (no constant or subnormal rows, whose gradients a tolerance cannot judge).
    gen = torch.Generator().manual_seed(1)
    x, dy = torch.randn(6, 24, generator=gen) * 3 + 1, torch.randn(6, 24, generator=gen)
    weight = _torch(make_param(24, "float32", 5)) if norm != "l2norm" else None
    bias = _torch(make_param(24, "float32", 6)) if norm == "layernorm" else None
    fwd, _, bwd = run_norm(tn, norm, x, weight, bias, zcg, dy)
    y64, leaves = _float64_reference(norm, x, weight, bias, zcg)
    torch.testing.assert_close(fwd[0].double(), y64.detach(), rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(y64, leaves, dy.double())
    for got, want in zip(bwd, grads, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)

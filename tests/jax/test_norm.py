"""JAX norm functions: bytes vs the NumPy reference (forward and backward), fused quantize ==
norm-then-quantize, jit == eager, vmap, zero rows."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_bytes_equal, assert_quantized_equal, fields_as_numpy
from norm_cases import (DTYPES, EPS, FUSED_QUANTIZERS, FUSED_SHAPE, KS, NORMS, assert_norm_equal, case_id, fused_dtype,
                        make_case, make_param, make_rows, quantize_kwargs, reference_bwd, reference_fwd, run_norm)

import twinengine.jax as tej
from twinengine.jax._ops import norm as jn


def _jnp(a):
    return None if a is None else jnp.asarray(a)


def _case_params():
    out = []
    for norm in NORMS:
        for dtype in DTYPES:
            for i, k in enumerate(KS):
                zcg = norm != "l2norm" and i % 2 == 1
                for family in ("mixed", "nan_inf"):
                    out.append((norm, dtype, k, zcg, family))
    return out


@pytest.mark.parametrize("norm,dtype,k,zcg,family", _case_params())
def test_norm_matches_reference(norm, dtype, k, zcg, family):
    x, weight, bias, dy = make_case(norm, dtype, k, 37, family, shift=KS.index(k) + 1)
    fwd, qt, bwd = run_norm(jn, norm, _jnp(x), _jnp(weight), _jnp(bias), zcg, _jnp(dy))
    assert qt is None
    expected_fwd = reference_fwd(norm, x, weight, bias, zcg)
    for i, (got, want) in enumerate(zip(fwd, expected_fwd, strict=True)):
        assert_norm_equal(np.asarray(got), want, f"forward output {i}")
    for i, (got, want) in enumerate(zip(bwd, reference_bwd(norm, dy, x, expected_fwd[1:], weight, zcg), strict=True)):
        assert_norm_equal(np.asarray(got), want, f"backward output {i}")


@pytest.mark.parametrize("shape", [(0, 33), (1, 1), (33,), (0, 2, 7)])
@pytest.mark.parametrize("norm", NORMS)
def test_norm_small_and_empty_shapes_match_reference(norm, shape):
    k, rows = shape[-1], int(np.prod(shape[:-1]))
    x, weight, bias, dy = make_case(norm, "float16", k, max(rows, 1), "mixed", shift=2)
    x, dy = x[:rows].reshape(shape), dy[:rows].reshape(shape)
    fwd, _, bwd = run_norm(jn, norm, _jnp(x), _jnp(weight), _jnp(bias), True, _jnp(dy))
    expected_fwd = reference_fwd(norm, x, weight, bias, True)
    for got, want in zip(fwd, expected_fwd, strict=True):
        assert_norm_equal(np.asarray(got), want, f"{norm} {shape} forward")
    for got, want in zip(bwd, reference_bwd(norm, dy, x, expected_fwd[1:], weight, True), strict=True):
        assert_norm_equal(np.asarray(got), want, f"{norm} {shape} backward")


@pytest.mark.parametrize("q", FUSED_QUANTIZERS, ids=case_id)
@pytest.mark.parametrize("norm", NORMS)
def test_norm_fused_quantize_matches_norm_then_quantize(norm, q):
    dtype = fused_dtype(q)
    x, weight, bias, _ = make_case(norm, dtype, FUSED_SHAPE[-1], 128, "mixed", shift=1)
    x = jnp.asarray(x.reshape(FUSED_SHAPE))
    kwargs = quantize_kwargs(q, jnp.asarray)
    fused, qt, _ = run_norm(jn, norm, x, _jnp(weight), _jnp(bias), False, x, quantizer=q, **kwargs)
    plain, _, _ = run_norm(jn, norm, x, _jnp(weight), _jnp(bias), False, x)
    for got, want in zip(fused, plain, strict=True):
        assert_bytes_equal(np.asarray(got), np.asarray(want), f"{norm} fused forward output")
    expected = tej.quantize(plain[0], q, **kwargs)
    assert qt.quantizer == q and qt.shape == FUSED_SHAPE and qt.dtype == dtype
    assert_quantized_equal(fields_as_numpy(qt), fields_as_numpy(expected), f"{norm} fused {case_id(q)}")


@functools.partial(jax.jit, static_argnums=(0, 6))
def _jitted(norm, x, weight, bias, dy, scale_rng, q):
    kwargs = {"quantizer": q}
    kwargs.update(scale_rng)
    return run_norm(jn, norm, x, weight, bias, True, dy, **kwargs)


@pytest.mark.parametrize("q", [None, FUSED_QUANTIZERS[2], FUSED_QUANTIZERS[4], FUSED_QUANTIZERS[-1]], ids=case_id)
@pytest.mark.parametrize("norm", NORMS)
def test_norm_jit_matches_eager(norm, q):
    x, weight, bias, dy = (_jnp(a) for a in make_case(norm, "bfloat16", 64, 64, "nan_inf", shift=1, seed=3))
    scale_rng = quantize_kwargs(q, jnp.asarray) if q is not None else {}
    jitted = _jitted(norm, x, weight, bias, dy, scale_rng, q)
    eager = run_norm(jn, norm, x, weight, bias, True, dy, quantizer=q, **scale_rng)
    for part in (0, 2):
        for got, want in zip(jitted[part], eager[part], strict=True):
            assert_bytes_equal(np.asarray(got), np.asarray(want), f"{norm} jit vs eager")
    if q is not None:
        assert_quantized_equal(fields_as_numpy(jitted[1]), fields_as_numpy(eager[1]), "jit qt")


@pytest.mark.parametrize("norm", NORMS)
def test_norm_vmap_matches_per_element_calls(norm):
    x, weight, bias, dy = make_case(norm, "float32", 33, 12, "mixed", shift=1, seed=4)
    x, dy = x.reshape(3, 4, 33), dy.reshape(3, 4, 33)

    def fwd_bwd(xi, dyi):
        fwd, _, bwd = run_norm(jn, norm, xi, _jnp(weight), _jnp(bias), False, dyi)
        return fwd, bwd

    batched = jax.jit(jax.vmap(fwd_bwd))(jnp.asarray(x), jnp.asarray(dy))
    for b in range(3):
        single = fwd_bwd(jnp.asarray(x[b]), jnp.asarray(dy[b]))
        for got, want in zip(jax.tree_util.tree_leaves(batched), jax.tree_util.tree_leaves(single), strict=True):
            assert_bytes_equal(np.asarray(got)[b], np.asarray(want), f"{norm} vmap element {b}")


def test_norm_vmap_of_fused_quantize_quantizes_each_element():
    q = FUSED_QUANTIZERS[3]  # MXFP8 1D
    x = make_rows(96, 64, "bfloat16", "mixed", seed=6).reshape(3, 32, 64)
    weight = jnp.asarray(make_param(64, "float32", 6))
    batched = jax.vmap(lambda xi: jn.rmsnorm_fwd(xi, weight, EPS, False, quantizer=q))(jnp.asarray(x))
    for b in range(3):
        y, rstd, qt = jn.rmsnorm_fwd(jnp.asarray(x[b]), weight, EPS, False, quantizer=q)
        assert_bytes_equal(np.asarray(batched[0])[b], np.asarray(y), "vmap y")
        element = {name: arr[b] for name, arr in fields_as_numpy(batched[2]).items()}
        assert_quantized_equal(element, fields_as_numpy(qt), f"vmap qt element {b}")


def _plain(norm, x, weight, bias, zcg):
    """The norm written with jnp (float32, XLA's own order): a gradient reference at tolerance."""
    eps = np.float32(EPS)
    gain = (1 + weight) if zcg and weight is not None else weight
    if norm == "layernorm":
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * gain + bias
    if norm == "rmsnorm":
        return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * gain
    return x / jnp.sqrt((x * x).sum(-1, keepdims=True) + eps)


@pytest.mark.parametrize("zcg", [False, True])
@pytest.mark.parametrize("norm", NORMS)
def test_norm_gradients_match_autograd_of_plain_jax(norm, zcg):
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.standard_normal((6, 24)).astype(np.float32) * 3 + 1)
    dy = jnp.asarray(rng.standard_normal((6, 24)).astype(np.float32))
    weight = jnp.asarray(rng.standard_normal(24).astype(np.float32)) if norm != "l2norm" else None
    bias = jnp.asarray(rng.standard_normal(24).astype(np.float32)) if norm == "layernorm" else None
    fwd, _, bwd = run_norm(jn, norm, x, weight, bias, zcg, dy)
    params = [p for p in (weight, bias) if p is not None]
    y, vjp = jax.vjp(lambda x, *p: _plain(norm, x, *(list(p) + [None] * (2 - len(p))), zcg), x, *params)
    np.testing.assert_allclose(np.asarray(fwd[0]), np.asarray(y), rtol=1e-5, atol=1e-5)
    for got, want in zip(bwd, vjp(dy), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)

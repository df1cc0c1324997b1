"""JAX activation family: bounds vs the NumPy references, fused quantize / dbias vs the
separate ops, jit and vmap vs eager, zero rows, bad input (same text as torch)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from elementwise_cases import (DTYPES, EXACT_KINDS, FUSED_QUANTIZERS, assert_within_bound, operand_magnitude,
                               quantize_extras, sweep_input)
from helpers import assert_bytes_equal, assert_quantized_equal, fields_as_numpy
from quantize_cases import case_id
from reference import activation as ref_act
from reference import bias as ref_bias

from twinengine.jax import quantize
from twinengine.jax._ops import activation as A
from twinengine.jax._ops import bias as B


def _dy_for(x: np.ndarray, kind: str, dtype: str, seed: int = 3) -> np.ndarray:
    shape = x.shape[:-1] + ((x.shape[-1] // 2,) if kind in ref_act.GATED else (x.shape[-1],))
    return ref_act.round_output(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", A.ACTIVATIONS)
def test_activation_matches_reference(kind, dtype):
    x = sweep_input(1 << 14, dtype, seed=12).reshape(-1, 64)
    dy = _dy_for(x, kind, dtype)
    y = np.asarray(A.activation_fwd(jnp.asarray(x), kind)[0])
    dx = np.asarray(A.activation_bwd(jnp.asarray(dy), jnp.asarray(x), kind))
    y_ref = ref_act.round_output(ref_act.activation_fwd_ref(x, kind), dtype)
    dx_ref = ref_act.round_output(ref_act.activation_bwd_ref(dy, x, kind), dtype)
    if kind in EXACT_KINDS:
        assert_bytes_equal(y, y_ref, "y")
        assert_bytes_equal(dx, dx_ref, "dx")
    else:
        assert_within_bound(y, y_ref, operand_magnitude(x, kind), dtype, f"{kind} forward")
        assert_within_bound(dx, dx_ref, operand_magnitude(x, kind, dy=dy), dtype, f"{kind} backward")


_JIT_ALL = jax.jit(lambda x, dy, kind: (A.activation_fwd(x, kind)[0], A.activation_bwd(dy, x, kind),
                                        A.activation_bwd_dbias(dy, x, kind, bias_dtype=jnp.float32)[:2]),
                   static_argnums=2)


@pytest.mark.parametrize("kind", A.ACTIVATIONS)
def test_activation_jit_and_vmap_match_eager(kind):
    x = sweep_input(4 * 8 * 32, "bfloat16", seed=2, lo=1e-3, hi=30).reshape(4, 8, 32)
    dy = _dy_for(x, kind, "bfloat16")
    xj, dyj = jnp.asarray(x), jnp.asarray(dy)
    eager = (A.activation_fwd(xj, kind)[0], A.activation_bwd(dyj, xj, kind),
             A.activation_bwd_dbias(dyj, xj, kind, bias_dtype=jnp.float32)[:2])
    jitted = _JIT_ALL(xj, dyj, kind)
    for a, b in zip(jax.tree_util.tree_leaves(jitted), jax.tree_util.tree_leaves(eager)):
        assert_bytes_equal(np.asarray(a), np.asarray(b), f"jit {kind}")
    vm_y = jax.vmap(lambda v: A.activation_fwd(v, kind)[0])(xj)
    vm_dx = jax.vmap(lambda d, v: A.activation_bwd(d, v, kind))(dyj, xj)
    assert_bytes_equal(np.asarray(vm_y), np.asarray(eager[0]), "vmap y")
    assert_bytes_equal(np.asarray(vm_dx), np.asarray(eager[1]), "vmap dx")


@pytest.mark.parametrize("q", FUSED_QUANTIZERS, ids=case_id)
def test_activation_fused_quantize_matches_separate(q):
    x = ref_act.round_output(np.random.default_rng(2).standard_normal((128, 512)).astype(np.float32) * 3, "bfloat16")
    extras = {k: None if v is None else jnp.asarray(v) for k, v in quantize_extras(q).items()}
    xj = jnp.asarray(x)
    y, qt = jax.jit(lambda v, s, r: A.activation_fwd(v, "swiglu", quantizer=q, scale=s, rng=r))(xj, extras["scale"],
                                                                                               extras["rng"])
    y_sep, _ = A.activation_fwd(xj, "swiglu")
    assert_bytes_equal(np.asarray(y), np.asarray(y_sep), "y")
    assert_quantized_equal(fields_as_numpy(qt), fields_as_numpy(quantize(y_sep, q, **extras)), f"fused {case_id(q)}")
    dy = jnp.asarray(_dy_for(x, "swiglu", "bfloat16"))
    dx, db, qdx = A.activation_bwd_dbias(dy, xj, "swiglu", bias_dtype=jnp.float32, quantizer=q, **extras)
    dx_sep = A.activation_bwd(dy, xj, "swiglu")
    assert_bytes_equal(np.asarray(dx), np.asarray(dx_sep), "dx")
    assert_bytes_equal(np.asarray(db), np.asarray(B.bias_grad(dx_sep, jnp.float32)), "dbias")
    assert_bytes_equal(np.asarray(db), ref_bias.bias_grad_ref(np.asarray(dx_sep), "float32"), "dbias vs reference")
    assert_quantized_equal(fields_as_numpy(qdx), fields_as_numpy(quantize(dx_sep, q, **extras)), "quantized dx")


def test_activation_zero_rows():
    x = jnp.zeros((0, 8), jnp.bfloat16)
    y, _ = A.activation_fwd(x, "geglu")
    assert y.shape == (0, 4) and y.dtype == jnp.bfloat16
    dx, db, _ = A.activation_bwd_dbias(jnp.zeros((0, 4), jnp.bfloat16), x, "geglu", bias_dtype=jnp.float16)
    assert dx.shape == (0, 8) and db.dtype == jnp.float16 and not np.asarray(db, np.float32).any()


@pytest.mark.parametrize("call,exc,match", [
    (lambda: A.activation_fwd(jnp.ones((4, 7)), "swiglu"), ValueError,
     r"twinengine.activation_fwd: gated activation 'swiglu' splits the last dimension into two halves"),
    (lambda: A.activation_fwd(jnp.ones((4, 8)), "gelu2"), ValueError, r"twinengine.activation_fwd: unknown activation 'gelu2'"),
    (lambda: A.activation_fwd(jnp.ones((4, 8), jnp.int32), "gelu"), TypeError,
     r"twinengine.activation_fwd: x must be float32, bfloat16 or float16, got int32"),
    (lambda: A.activation_bwd(jnp.ones((4, 8)), jnp.ones((4, 8)), "geglu"), ValueError,
     r"twinengine.activation_bwd: dy must have the shape of the activation output \(4, 4\)"),
    (lambda: A.activation_bwd(jnp.ones((4, 8), jnp.float16), jnp.ones((4, 8)), "gelu"), TypeError,
     r"twinengine.activation_bwd: dy must have the dtype of x \(float32\), got float16"),
])
def test_activation_rejects_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()

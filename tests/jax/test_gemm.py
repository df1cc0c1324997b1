"""twinengine.jax.gemm: reference, jit, vmap and error text (NUMERICS.md §8)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import twinengine.jax as tj
from twinengine.quantizers import Float8CurrentScalingQuantizer, MXFP8Quantizer
from reference.gemm import gemm_ref, gemm_tolerance_ref, mxfp8_operand_ref

RNG = np.random.default_rng(3)
X = RNG.standard_normal((64, 96)).astype(np.float32)
W = RNG.standard_normal((32, 96)).astype(np.float32)


def test_gemm_mxfp8_matches_reference():
    q = MXFP8Quantizer()
    qx, qw = tj.quantize(X, q), tj.quantize(W, q)
    out = np.asarray(tj.gemm(qx, qw))
    a = mxfp8_operand_ref(np.asarray(qx.rowwise_data).view(np.uint8), "e4m3", np.asarray(qx.rowwise_scale_inv), False)
    b = mxfp8_operand_ref(np.asarray(qw.rowwise_data).view(np.uint8), "e4m3", np.asarray(qw.rowwise_scale_inv), False)
    exact, magnitude = gemm_ref(a, b)
    assert np.all(np.abs(out - exact) <= gemm_tolerance_ref(exact, magnitude, 96, "float32"))


def test_gemm_jit_matches_eager():
    q = Float8CurrentScalingQuantizer()

    def f(x, w, bias):
        return tj.gemm(tj.quantize(x, q), tj.quantize(w, q), bias, out_dtype=jnp.bfloat16)

    bias = jnp.arange(32, dtype=jnp.float32)
    eager = np.asarray(f(X, W, bias))
    jitted = np.asarray(jax.jit(f)(X, W, bias))
    assert np.array_equal(eager.view(np.uint16), jitted.view(np.uint16))


def test_gemm_vmap_matches_loop():
    xs = np.stack([X, X * 2])
    out = jax.vmap(lambda x: tj.gemm(x, W))(xs)
    for i in range(2):
        assert np.array_equal(np.asarray(out[i]), np.asarray(tj.gemm(xs[i], W)))


def test_gemm_rejects_contraction_mismatch():
    with pytest.raises(ValueError, match="twinengine.gemm: a and b disagree on the contraction dimension"):
        tj.gemm(jnp.ones((4, 8)), jnp.ones((4, 9)))

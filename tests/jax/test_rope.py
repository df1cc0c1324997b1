"""JAX rope family: apply_rotary_pos_emb bit-exact against the NumPy reference (forward and the
custom_vjp backward), under jit, grad and vmap; RotaryPositionEmbedding's angles; bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from elementwise_cases import DTYPES, assert_bytes_equal_nan
from helpers import assert_bytes_equal, make_input
from reference import rope as ref

import twinengine.jax as tej

CU = np.array([0, 3, 3, 10, 17], np.int32)


def _case(tensor_format, dtype, d2, seed=0):
    shape = {"sbhd": (7, 3, 2, 16), "bshd": (3, 7, 2, 16), "thd": (19, 2, 16)}[tensor_format]
    t = make_input("normal_1e3", shape, dtype, seed=seed)
    freqs = (make_input("normal_1", (9, 1, 1, d2), "float32", seed=seed + 1) * np.float32(50)).astype(np.float32)
    return t, freqs, (CU if tensor_format == "thd" else None)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
def test_rope_forward_and_vjp_match_reference(tensor_format, dtype, interleaved):
    for d2 in (16, 6):
        t, freqs, cu = _case(tensor_format, dtype, d2)
        cu_j = None if cu is None else jnp.asarray(cu)

        def f(x):
            return tej.apply_rotary_pos_emb(x, jnp.asarray(freqs), tensor_format, interleaved, cu_seqlens=cu_j)

        y, vjp = jax.vjp(jax.jit(f), jnp.asarray(t))
        assert_bytes_equal_nan(np.asarray(y), ref.rope_ref(t, freqs, tensor_format, interleaved, cu), f"fwd {d2}")
        dy = make_input("normal_1", t.shape, dtype, seed=7)
        (dx,) = vjp(jnp.asarray(dy))
        want = ref.rope_ref(dy, freqs, tensor_format, interleaved, cu, backward=True)
        assert_bytes_equal_nan(np.asarray(dx), want, f"bwd {d2}")


def test_rope_grad_and_vmap():
    freqs = tej.RotaryPositionEmbedding(8, rotary_percent=0.5)(6)
    x = jnp.asarray(make_input("normal_1", (4, 6, 2, 8), "float32", seed=2))

    def loss(v):
        return jnp.sum(tej.apply_rotary_pos_emb(v, freqs, "bshd") ** 2)

    g = jax.jit(jax.grad(loss))(x)
    y = tej.apply_rotary_pos_emb(x, freqs, "bshd")
    want = ref.rope_ref(np.asarray(2 * y), np.asarray(freqs), "bshd", backward=True)
    assert_bytes_equal(np.asarray(g), want, "grad")
    # vmap over a leading batch of sbhd tensors == the loop.
    xs = jnp.asarray(make_input("normal_1", (3, 6, 1, 2, 8), "bfloat16", seed=4))
    got = jax.vmap(lambda v: tej.apply_rotary_pos_emb(v, freqs))(xs)
    for i in range(3):
        assert_bytes_equal(np.asarray(got[i]), np.asarray(tej.apply_rotary_pos_emb(xs[i], freqs)), f"vmap {i}")


@pytest.mark.parametrize("kw", [
    dict(dim=16), dict(dim=64, rotary_percent=0.5, rotary_base=500000.0), dict(dim=8, interleaved=True),
    dict(dim=12, seq_len_interpolation_factor=4.0)])
def test_rotary_position_embedding_matches_reference(kw):
    got = tej.RotaryPositionEmbedding(**kw)(37, offset=3)
    assert got.dtype == jnp.float32
    assert_bytes_equal(np.asarray(got), ref.rotary_freqs_ref(max_seq_len=37, offset=3, **kw), f"freqs {kw}")


@pytest.mark.parametrize("call,exc,match", [
    (lambda: tej.apply_rotary_pos_emb(jnp.zeros((4, 2, 3, 8)), jnp.zeros((4, 1, 1, 8)), "sbhd",
                                      cu_seqlens=jnp.zeros(3, jnp.int32)),
     ValueError, "cu_seqlens is only used with tensor_format 'thd'"),
    (lambda: tej.apply_rotary_pos_emb(jnp.zeros((5, 2, 3, 8)), jnp.zeros((4, 1, 1, 8))), ValueError,
     r"t has sequence length 5, longer than freqs \(4 positions\)"),
    (lambda: tej.apply_rotary_pos_emb(jnp.zeros((4, 2, 3, 8)), jnp.zeros((4, 1, 1, 8), jnp.bfloat16)), TypeError,
     "freqs must be float32"),
    (lambda: tej.apply_rotary_pos_emb(jnp.zeros((4, 2, 3, 8)), jnp.zeros((4, 8))), ValueError,
     r"freqs must have shape \(s, 1, 1, d2\)"),
    (lambda: tej.apply_rotary_pos_emb(jnp.zeros((4, 2, 3, 8)), jnp.zeros((4, 1, 1, 8)), "hbsd"), ValueError,
     "tensor_format must be"),
    (lambda: tej.RotaryPositionEmbedding(10, rotary_percent=0.3), ValueError,
     r"the rotary dimension int\(dim \* rotary_percent\) = 3 must be even"),
])
def test_rope_rejects_bad_input(call, exc, match):
    with pytest.raises(exc, match="twinengine.(apply_rotary_pos_emb|RotaryPositionEmbedding): " + match):
        call()

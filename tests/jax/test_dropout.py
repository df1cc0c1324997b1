"""JAX dropout: masks and values vs the NumPy Philox reference, jit and vmap, bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from elementwise_cases import DTYPES, assert_bytes_equal_nan
from helpers import assert_bytes_equal, make_input
from reference import dropout as ref

from twinengine.jax._ops import dropout as D

SEED, OFFSET = 0x1234ABCD, 4_000_000_007
RNG = np.array([SEED, OFFSET], np.uint32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 96), (3, 5, 7), (13,)])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.9])
def test_dropout_matches_reference(p, shape, dtype):
    x = make_input("nan_inf", shape, dtype, seed=3)
    y, mask = D.dropout_fwd(jnp.asarray(x), p, jnp.asarray(RNG))
    y_ref, mask_ref = ref.dropout_fwd_ref(x, p, SEED, OFFSET, dtype)
    assert_bytes_equal(np.asarray(mask), mask_ref, "mask")
    assert_bytes_equal_nan(np.asarray(y), y_ref, "y")
    dy = make_input("mixed_scales", shape, dtype, seed=4)
    assert_bytes_equal_nan(np.asarray(D.dropout_bwd(jnp.asarray(dy), mask, p)), ref.dropout_bwd_ref(dy, mask_ref, p, dtype),
                           "dx")


def test_dropout_jit_and_vmap():
    x = jnp.asarray(make_input("normal_1", (4, 16, 8), "float32"))
    fwd = jax.jit(lambda v, r: D.dropout_fwd(v, 0.25, r))
    for offset in (0, 1, 2):  # a new offset is a new input, not a retrace
        rng = jnp.asarray(np.array([7, offset], np.uint32))
        y, mask = fwd(x, rng)
        y_e, mask_e = D.dropout_fwd(x, 0.25, rng)
        assert_bytes_equal(np.asarray(y), np.asarray(y_e), "jit y")
        assert_bytes_equal(np.asarray(mask), np.asarray(mask_e), "jit mask")
    assert fwd._cache_size() == 1
    # vmap: each batch element is dropped on its own (element indices restart per slice)
    rng = jnp.asarray(np.array([7, 0], np.uint32))
    vy, vmask = jax.vmap(lambda v: D.dropout_fwd(v, 0.25, rng))(x)
    for b in range(4):
        y_b, mask_b = D.dropout_fwd(x[b], 0.25, rng)
        assert_bytes_equal(np.asarray(vy[b]), np.asarray(y_b), "vmap y")
        assert_bytes_equal(np.asarray(vmask[b]), np.asarray(mask_b), "vmap mask")


@pytest.mark.parametrize("call,exc,match", [
    (lambda: D.dropout_fwd(jnp.ones(4), 1.0, jnp.asarray(RNG)), ValueError, r"twinengine.dropout_fwd: p must be in \[0, 1\)"),
    (lambda: D.dropout_fwd(jnp.ones(4), float("nan"), jnp.asarray(RNG)), ValueError, r"twinengine.dropout_fwd: p must be in"),
    (lambda: D.dropout_fwd(jnp.ones(4), 0.5, None), ValueError, r"twinengine.dropout_fwd: dropout needs rng="),
    (lambda: D.dropout_bwd(jnp.ones(20), jnp.zeros(2, jnp.uint8), 0.5), ValueError,
     r"twinengine.dropout_bwd: mask must have shape \(3,\)"),
])
def test_dropout_rejects_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()

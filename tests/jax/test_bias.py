"""JAX bias family: bytes vs the NumPy fp32 emulation, jit and vmap, zero rows, bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from elementwise_cases import DTYPES, assert_bytes_equal_nan
from helpers import assert_bytes_equal, make_input
from reference import bias as ref

from twinengine.jax._ops import bias as B

JNP = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@pytest.mark.parametrize("bias_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 96), (3, 5, 7), (129,)])
def test_bias_ops_match_reference(shape, dtype, bias_dtype):
    x = make_input("nan_inf", shape, dtype, seed=1)
    b = make_input("mixed_scales", shape[-1:], bias_dtype, seed=2)
    y = make_input("normal_1e3", shape, bias_dtype, seed=3)
    assert_bytes_equal_nan(np.asarray(B.bias_add(jnp.asarray(x), jnp.asarray(b))), ref.bias_add_ref(x, b, dtype), "bias_add")
    assert_bytes_equal_nan(np.asarray(B.add(jnp.asarray(x), jnp.asarray(y))), ref.add_ref(x, y, dtype), "add")
    assert_bytes_equal_nan(np.asarray(B.scale(jnp.asarray(x), 1 / 3)), ref.scale_ref(x, 1 / 3, dtype), "scale")
    assert_bytes_equal_nan(np.asarray(B.bias_grad(jnp.asarray(x), JNP[bias_dtype])), ref.bias_grad_ref(x, bias_dtype),
                           "bias_grad")


def test_bias_jit_and_vmap():
    x = jnp.asarray(make_input("normal_1", (4, 40, 16), "bfloat16"))
    b = jnp.asarray(make_input("normal_1", (16,), "float32"))
    f = jax.jit(lambda v, c: (B.scale(B.add(B.bias_add(v, c), v), 0.5), B.bias_grad(v, jnp.float32)))
    e = (B.scale(B.add(B.bias_add(x, b), x), 0.5), B.bias_grad(x, jnp.float32))
    for got, want in zip(f(x, b), e):
        assert_bytes_equal(np.asarray(got), np.asarray(want), "jit")
    vg = jax.vmap(lambda v: B.bias_grad(v, jnp.float32))(x)
    for i in range(4):
        assert_bytes_equal(np.asarray(vg[i]), np.asarray(B.bias_grad(x[i], jnp.float32)), "vmap bias_grad")
    vb = jax.vmap(lambda v: B.bias_add(v, b))(x)
    assert_bytes_equal(np.asarray(vb), np.asarray(B.bias_add(x, b)), "vmap bias_add")


def test_bias_zero_rows():
    x = jnp.zeros((0, 7), jnp.float16)
    assert B.bias_add(x, jnp.ones(7)).shape == (0, 7)
    db = B.bias_grad(x, jnp.bfloat16)
    assert db.shape == (7,) and db.dtype == jnp.bfloat16 and not np.asarray(db, np.float32).any()


@pytest.mark.parametrize("call,exc,match", [
    (lambda: B.bias_add(jnp.ones((4, 8)), jnp.ones(7)), ValueError,
     r"twinengine.bias_add: bias must have shape \(8,\) \(the last dimension of x"),
    (lambda: B.add(jnp.ones((4, 8)), jnp.ones((4, 7))), ValueError, r"twinengine.add: x and y must have the same shape"),
    (lambda: B.bias_grad(jnp.ones((4, 8)), jnp.int32), TypeError, r"twinengine.bias_grad: dtype must be float32"),
])
def test_bias_rejects_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()

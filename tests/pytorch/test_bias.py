"""PyTorch bias family: bias add, residual add, constant scale and the bias gradient bit-exact
against the NumPy fp32 emulation (incl. mixed dtypes and zero rows), compile, opcheck, bad input."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from elementwise_cases import DTYPES, assert_bytes_equal_nan
from helpers import INPUT_FAMILIES, assert_bytes_equal, from_torch, make_input, no_recompiles, to_torch
from reference import bias as ref

from twinengine.pytorch._ops import bias as B

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHAPES = [(64, 96), (3, 5, 7), (1, 1), (129,), (1000, 33)]


@pytest.mark.parametrize("bias_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["normal_1", "nan_inf", "mixed_scales", "subnormal"])
@pytest.mark.parametrize("shape", SHAPES)
def test_bias_add_and_add_match_reference(shape, family, dtype, bias_dtype):
    x = make_input(family, shape, dtype, seed=1)
    b = make_input("mixed_scales", shape[-1:], bias_dtype, seed=2)
    assert_bytes_equal_nan(from_torch(B.bias_add(to_torch(x), to_torch(b))), ref.bias_add_ref(x, b, dtype), "bias_add")
    y = make_input("normal_1e3", shape, bias_dtype, seed=3)
    assert_bytes_equal_nan(from_torch(B.add(to_torch(x), to_torch(y))), ref.add_ref(x, y, dtype), "add")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("c", [0.5, 1 / 3, -7.25, 1e30, 0.0])
def test_scale_matches_reference(c, family, dtype):
    x = make_input(family, (33, 17), dtype, seed=5)
    assert_bytes_equal_nan(from_torch(B.scale(to_torch(x), c)), ref.scale_ref(x, c, dtype), f"scale {c}")


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("shape", [(64, 96), (3, 5, 7), (1, 1), (129,), (1000, 33), (31, 300), (33, 2)])
def test_bias_grad_matches_reference(shape, family, dtype, out_dtype):
    dy = make_input(family, shape, dtype, seed=6)
    db = B.bias_grad(to_torch(dy), TORCH_DTYPES[out_dtype])
    assert db.shape == (shape[-1],) and db.dtype == TORCH_DTYPES[out_dtype]
    assert_bytes_equal_nan(from_torch(db), ref.bias_grad_ref(dy, out_dtype), "bias_grad")


def test_bias_grad_uses_the_canonical_order():
    """A sequential sum and the 32-lane sum differ on this column; the kernel gives the latter."""
    dy = np.full((4096, 1), 1e-4, np.float32)
    dy[0] = 1e4
    db = from_torch(B.bias_grad(to_torch(dy), torch.float32))
    sequential = np.float32(0)
    for v in dy[:, 0]:
        sequential = np.float32(sequential + v)
    assert db[0] != sequential
    assert_bytes_equal(db, ref.bias_grad_ref(dy, "float32"), "canonical")


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_zero_rows(dtype):
    x = torch.empty(0, 7, dtype=TORCH_DTYPES[dtype])
    assert B.bias_add(x, torch.ones(7)).shape == (0, 7)
    assert B.add(x, x).shape == (0, 7) and B.scale(x, 2.0).shape == (0, 7)
    assert torch.equal(B.bias_grad(x, torch.bfloat16), torch.zeros(7, dtype=torch.bfloat16))


def _step(x, b, r):
    y = B.scale(B.add(B.bias_add(x, b), r), 0.5)
    return y, B.bias_grad(y, torch.float32)


_COMPILED = torch.compile(_step, fullgraph=True, dynamic=True)


def test_bias_compiled_matches_eager_dynamic_batch():
    for i, rows in enumerate((24, 40, 8)):
        x, r = torch.randn(rows, 16, dtype=torch.bfloat16), torch.randn(rows, 16)
        b = torch.randn(16, dtype=torch.float16)
        with no_recompiles() if i else contextlib.nullcontext():
            got = _COMPILED(x, b, r)
        for a, e in zip(got, _step(x, b, r)):
            assert_bytes_equal(from_torch(a), from_torch(e), f"compiled vs eager rows={rows}")


def test_bias_opcheck():
    x = torch.randn(8, 13)
    torch.library.opcheck(torch.ops.twinengine.bias_add.default, (x, torch.randn(13, dtype=torch.bfloat16)))
    torch.library.opcheck(torch.ops.twinengine.add.default, (x, torch.randn(8, 13)))
    torch.library.opcheck(torch.ops.twinengine.scale.default, (x, 0.25))
    torch.library.opcheck(torch.ops.twinengine.bias_grad.default, (x, "bfloat16"))


@pytest.mark.parametrize("call,exc,match", [
    (lambda: B.bias_add(torch.randn(4, 8), torch.randn(7)), ValueError,
     r"twinengine.bias_add: bias must have shape \(8,\) \(the last dimension of x"),
    (lambda: B.bias_add(torch.randn(4, 8), torch.randn(8).double()), TypeError,
     r"twinengine.bias_add: bias must be float32, bfloat16 or float16, got float64"),
    (lambda: B.add(torch.randn(4, 8), torch.randn(4, 7)), ValueError, r"twinengine.add: x and y must have the same shape"),
    (lambda: B.scale(torch.randn(4).int(), 2.0), TypeError, r"twinengine.scale: x must be float32, bfloat16 or float16"),
    (lambda: B.bias_grad(torch.randn(4, 8), torch.int32), TypeError, r"twinengine.bias_grad: dtype must be float32"),
])
def test_bias_rejects_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()

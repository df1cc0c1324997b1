"""PyTorch dropout: masks bit-exact against the NumPy Philox reference, kept values byte-exact,
p = 0, offsets, backward from the mask, compile, opcheck, bad input."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from elementwise_cases import DTYPES, assert_bytes_equal_nan
from helpers import assert_bytes_equal, from_torch, make_input, no_recompiles, to_torch
from reference import dropout as ref

from twinengine.pytorch._ops import dropout as D

SEED, OFFSET = 0x1234ABCD, 4_000_000_007


def _rng(seed=SEED, offset=OFFSET, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor([seed, offset], dtype=torch.int64).to(dtype) if dtype != torch.int32 else \
        torch.tensor(np.array([seed, offset], np.uint32).view(np.int32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 96), (3, 5, 7), (1,), (13,), (1000, 33)])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_dropout_matches_reference(p, shape, dtype):
    x = make_input("nan_inf", shape, dtype, seed=3)
    y, mask = D.dropout_fwd(to_torch(x), p, _rng())
    y_ref, mask_ref = ref.dropout_fwd_ref(x, p, SEED, OFFSET, dtype)
    assert_bytes_equal(from_torch(mask), mask_ref, "mask")
    assert_bytes_equal_nan(from_torch(y), y_ref, "y")
    dy = make_input("mixed_scales", shape, dtype, seed=4)
    dx = D.dropout_bwd(to_torch(dy), mask, p)
    assert_bytes_equal_nan(from_torch(dx), ref.dropout_bwd_ref(dy, mask_ref, p, dtype), "dx")


def test_dropout_p_zero_keeps_everything():
    x = make_input("normal_1", (37, 11), "float32")
    y, mask = D.dropout_fwd(to_torch(x), 0.0, _rng())
    assert_bytes_equal(from_torch(y), x, "y")  # fl(x·1) = x
    assert from_torch(mask).tolist()[:-1] == [255] * (mask.numel() - 1)
    assert from_torch(mask)[-1] == (1 << (37 * 11 % 8)) - 1  # padding bits stay 0


def test_dropout_keep_fraction_and_scale():
    x = torch.ones(1 << 16)
    y, mask = D.dropout_fwd(x, 0.25, _rng(7, 0))
    kept = np.unpackbits(from_torch(mask), bitorder="little").astype(bool)
    assert abs(kept.mean() - 0.75) < 0.01
    assert set(y.unique().tolist()) == {0.0, float(np.float32(1) / np.float32(0.75))}


def test_dropout_offsets_and_seeds_differ_and_rng_dtypes_agree():
    x = torch.randn(4096)
    _, m0 = D.dropout_fwd(x, 0.5, _rng(5, 0))
    _, m1 = D.dropout_fwd(x, 0.5, _rng(5, 1))
    _, m2 = D.dropout_fwd(x, 0.5, _rng(6, 0))
    assert not torch.equal(m0, m1) and not torch.equal(m0, m2)
    for dtype in (torch.int32, torch.uint32):
        _, m = D.dropout_fwd(x, 0.5, _rng(SEED, OFFSET, dtype))
        _, m64 = D.dropout_fwd(x, 0.5, _rng(SEED, OFFSET))
        assert torch.equal(m, m64)


def test_dropout_zero_size():
    y, mask = D.dropout_fwd(torch.empty(0, 5), 0.3, _rng())
    assert y.shape == (0, 5) and mask.shape == (0,)
    assert D.dropout_bwd(torch.empty(0, 5), mask, 0.3).shape == (0, 5)


def _step(x, rng, dy):
    y, mask = D.dropout_fwd(x, 0.3, rng)
    return y, mask, D.dropout_bwd(dy, mask, 0.3)


_COMPILED = torch.compile(_step, fullgraph=True, dynamic=True)


def test_dropout_compiled_matches_eager_dynamic_batch():
    for i, rows in enumerate((24, 40, 8)):
        x, dy = torch.randn(rows, 16, dtype=torch.bfloat16), torch.randn(rows, 16, dtype=torch.bfloat16)
        rng = _rng(3, rows)  # a new offset is a new input value, not a recompile
        with no_recompiles() if i else contextlib.nullcontext():
            got = _COMPILED(x, rng, dy)
        for a, b in zip(got, _step(x, rng, dy)):
            assert_bytes_equal(from_torch(a), from_torch(b), f"compiled vs eager rows={rows}")


def test_dropout_opcheck():
    x = torch.randn(8, 13)
    torch.library.opcheck(torch.ops.twinengine.dropout_fwd.default, (x, 0.4, _rng()))
    _, mask = D.dropout_fwd(x, 0.4, _rng())
    torch.library.opcheck(torch.ops.twinengine.dropout_bwd.default, (x, mask, 0.4))


@pytest.mark.parametrize("call,exc,match", [
    (lambda: D.dropout_fwd(torch.randn(4), 1.0, _rng()), ValueError, r"twinengine.dropout_fwd: p must be in \[0, 1\)"),
    (lambda: D.dropout_fwd(torch.randn(4), -0.1, _rng()), ValueError, r"twinengine.dropout_fwd: p must be in \[0, 1\)"),
    (lambda: D.dropout_fwd(torch.randn(4), float("nan"), _rng()), ValueError, r"twinengine.dropout_fwd: p must be in"),
    (lambda: D.dropout_fwd(torch.randn(4), 1 - 2**-26, _rng()), ValueError, r"after rounding to float32"),
    (lambda: D.dropout_fwd(torch.randn(4), 0.5, None), ValueError, r"twinengine.dropout_fwd: dropout needs rng="),
    (lambda: D.dropout_fwd(torch.randn(4), 0.5, torch.zeros(2)), TypeError, r"rng must have dtype uint32, int32 or int64"),
    (lambda: D.dropout_fwd(torch.randn(4), 0.5, torch.zeros(3, dtype=torch.int64)), ValueError, r"rng must have shape \(2,\)"),
    (lambda: D.dropout_fwd(torch.randn(4).double(), 0.5, _rng()), TypeError, r"x must be float32, bfloat16 or float16"),
    (lambda: D.dropout_bwd(torch.randn(20), torch.zeros(2, dtype=torch.uint8), 0.5), ValueError,
     r"twinengine.dropout_bwd: mask must have shape \(3,\)"),
    (lambda: D.dropout_bwd(torch.randn(20), torch.zeros(3, dtype=torch.int32), 0.5), TypeError,
     r"twinengine.dropout_bwd: mask must have dtype uint8"),
])
def test_dropout_rejects_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()

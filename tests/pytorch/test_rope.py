"""PyTorch rope family: apply_rotary_pos_emb bit-exact against the NumPy reference (sbhd / bshd /
thd, interleaved, partial rotary, every dtype, forward and backward), RotaryPositionEmbedding's
angles, compile == eager (fullgraph, dynamic sequence length, no recompile), opcheck, bad input."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from elementwise_cases import DTYPES, assert_bytes_equal_nan
from helpers import assert_bytes_equal, from_torch, make_input, no_recompiles, to_torch
from reference import rope as ref

import twinengine.pytorch as tep

CU = np.array([0, 3, 3, 10, 17], np.int32)  # an empty sequence and a 2-token tail outside every sequence


def _case(tensor_format, dtype, d=16, d2=12, seed=0, family="normal_1e3"):
    shape = {"sbhd": (7, 3, 2, d), "bshd": (3, 7, 2, d), "thd": (19, 2, d)}[tensor_format]
    t = make_input(family, shape, dtype, seed=seed)
    freqs = (make_input("normal_1", (9, 1, 1, d2), "float32", seed=seed + 1) * np.float32(50)).astype(np.float32)
    cu = CU if tensor_format == "thd" else None
    return t, freqs, cu


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
def test_rope_forward_backward_match_reference(tensor_format, dtype, interleaved):
    for d2 in (16, 6):  # full and partial rotary
        t, freqs, cu = _case(tensor_format, dtype, d2=d2)
        cu_t = None if cu is None else torch.from_numpy(cu)
        x = to_torch(t).requires_grad_(True)
        y = tep.apply_rotary_pos_emb(x, torch.from_numpy(freqs), tensor_format, interleaved, cu_seqlens=cu_t)
        assert_bytes_equal_nan(from_torch(y), ref.rope_ref(t, freqs, tensor_format, interleaved, cu), f"fwd {d2}")
        dy = make_input("normal_1", t.shape, dtype, seed=7)
        (dx,) = torch.autograd.grad(y, x, to_torch(dy))
        want = ref.rope_ref(dy, freqs, tensor_format, interleaved, cu, backward=True)
        assert_bytes_equal_nan(from_torch(dx), want, f"bwd {d2}")


def test_rope_special_values_and_large_angles():
    """NaN / inf / huge angles and NaN / inf inputs follow the reference bit for bit."""
    angles = np.array([0.0, -0.0, 1e-30, np.pi / 4, 1e4, 123456.7, 16777215.0, 16777216.0, 3e38, np.inf, -np.inf,
                       np.nan, -2.5, 7.0], np.float32)
    freqs = np.stack([angles, angles[::-1]], axis=-1).reshape(-1, 1, 1, 2).astype(np.float32)
    freqs = np.concatenate([freqs, freqs], axis=-1)
    t = make_input("nan_inf", (14, 2, 1, 6), "float32", seed=3)
    y = tep.apply_rotary_pos_emb(to_torch(t), torch.from_numpy(freqs))
    assert_bytes_equal_nan(from_torch(y), ref.rope_ref(t, freqs), "special")


def test_rope_backward_is_rotation_by_negative_angle():
    """With TE's freqs (each angle on both channels of a pair) the backward equals the forward by −angle."""
    freqs = tep.RotaryPositionEmbedding(8)(5)
    dy = torch.randn(5, 2, 3, 8)
    dx = torch.ops.twinengine.rope_bwd(dy, freqs, None, "sbhd", False)
    assert torch.equal(dx, tep.apply_rotary_pos_emb(dy, -freqs))


def test_rope_sincos_error_bound():
    """The binary64 sin / cos before the final rounding are within 2^-48 relative of NumPy's libm."""
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.uniform(-10, 10, 20000), rng.uniform(-2**24, 2**24, 20000),
                        np.arange(-3000, 3000) * np.pi / 2]).astype(np.float32)
    s, c = ref.sincos_f64_ref(a)
    a64 = a.astype(np.float64)
    for got, want in ((s, np.sin(a64)), (c, np.cos(a64))):
        err = np.abs(got - want) / np.maximum(np.abs(want), 2.0**-60)
        assert err.max() < 2.0**-48, err.max()


@pytest.mark.parametrize("kw", [
    dict(dim=16), dict(dim=64, rotary_percent=0.5, rotary_base=500000.0), dict(dim=8, interleaved=True),
    dict(dim=12, seq_len_interpolation_factor=4.0)])
def test_rotary_position_embedding_matches_reference(kw):
    module = tep.RotaryPositionEmbedding(**kw)
    got = module(37, offset=3)
    assert got.dtype == torch.float32 and got.shape[:3] == (37, 1, 1)
    assert_bytes_equal(from_torch(got), ref.rotary_freqs_ref(max_seq_len=37, offset=3, **kw), f"freqs {kw}")
    assert "inv_freq" in module.state_dict()


def _fwd(x, freqs):
    return tep.apply_rotary_pos_emb(x, freqs, "bshd", interleaved=False)


def test_rope_compiled_matches_eager_dynamic_seq():
    """Compiled forward and (AOT-compiled) backward == eager, across sequence lengths, no recompile."""
    compiled = torch.compile(_fwd, fullgraph=True, dynamic=True)
    emb = tep.RotaryPositionEmbedding(16, rotary_percent=0.75)
    for i, s in enumerate((5, 9, 12)):
        x = torch.randn(2, s, 3, 16, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(2, s, 3, 16, dtype=torch.bfloat16)
        freqs = emb(s)
        with no_recompiles() if i else contextlib.nullcontext():
            y = compiled(x, freqs)
        (dx,) = torch.autograd.grad(y, x, dy)
        y_e = _fwd(x, freqs)
        (dx_e,) = torch.autograd.grad(y_e, x, dy)
        assert_bytes_equal(from_torch(y.detach()), from_torch(y_e.detach()), f"compiled forward s={s}")
        assert_bytes_equal(from_torch(dx), from_torch(dx_e), f"compiled backward s={s}")


def test_rope_thd_compiled_matches_eager():
    def fn(x, freqs, cu):
        return tep.apply_rotary_pos_emb(x, freqs, "thd", interleaved=True, cu_seqlens=cu)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    t, freqs, cu = _case("thd", "float16")
    args = (to_torch(t), torch.from_numpy(freqs), torch.from_numpy(cu))
    assert_bytes_equal(from_torch(compiled(*args)), from_torch(fn(*args)), "thd compiled")


def test_rotary_position_embedding_compiles():
    emb = tep.RotaryPositionEmbedding(16, seq_len_interpolation_factor=2.0)
    compiled = torch.compile(lambda n: emb(n), fullgraph=True)
    assert_bytes_equal(from_torch(compiled(11)), from_torch(emb(11)), "compiled freqs")


def test_rope_opcheck():
    freqs = tep.RotaryPositionEmbedding(8)(6)
    x = torch.randn(6, 2, 3, 10, requires_grad=True)
    torch.library.opcheck(torch.ops.twinengine.rope_fwd.default, (x, freqs, None, "sbhd", False))
    torch.library.opcheck(torch.ops.twinengine.rope_bwd.default, (x.detach(), freqs, None, "bshd", True))
    xt = torch.randn(9, 2, 8, requires_grad=True)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    torch.library.opcheck(torch.ops.twinengine.rope_fwd.default, (xt, freqs, cu, "thd", False))


def test_rope_thd_cpu_checks_cu_seqlens_values():
    freqs = tep.RotaryPositionEmbedding(8)(4)
    x = torch.randn(9, 2, 8)
    with pytest.raises(ValueError, match="twinengine.rope_fwd: a sequence of 9 tokens is longer than freqs"):
        tep.apply_rotary_pos_emb(x, freqs, "thd", cu_seqlens=torch.tensor([0, 9], dtype=torch.int32))
    with pytest.raises(ValueError, match="twinengine.rope_fwd: cu_seqlens must be non-decreasing"):
        tep.apply_rotary_pos_emb(x, freqs, "thd", cu_seqlens=torch.tensor([0, 4, 2], dtype=torch.int32))

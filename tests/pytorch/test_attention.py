"""torch attention ops: exact bytes vs the fp32 emulation of docs/attention.md, closeness to
float64 for every mask type / GQA / padding / window / dropout case, compile == eager without
recompiles per sequence length, opcheck, and the error texts."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from attention_cases import BY_NAME, CASE_IDS, CASES, THD_CASES, THD_IDS, TOLERANCE
from helpers import assert_bytes_equal, from_torch, no_recompiles, to_torch
from reference import attention as ref

from twinengine.pytorch._ops import attention as ta


def _torch_kwargs(kw: dict) -> dict:
    return {name: (torch.from_numpy(value) if isinstance(value, np.ndarray) else value) for name, value in kw.items()}


def _run(case):
    a = case.inputs()
    kw = case.kwargs()
    tkw = _torch_kwargs(kw)
    q, k, v, dout = (to_torch(a[n]) for n in ("q", "k", "v", "dout"))
    out, lse = ta.attention_fwd(q, k, v, **tkw)
    grads = ta.attention_bwd(dout, q, k, v, out, lse, **tkw)
    return a, kw, out, lse, grads


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_attention_matches_emulation_bytes(case):
    a, _, out, lse, grads = _run(case)
    b = {name: case.layout(x) for name, x in a.items()}  # bshd for the reference
    kw = case.ref_kwargs()
    want_out, want_lse = ref.attention_fwd_emul(b["q"], b["k"], b["v"], **kw)
    assert_bytes_equal(from_torch(out), case.layout(want_out), f"{case.name} out")
    assert_bytes_equal(from_torch(lse), want_lse, f"{case.name} lse")
    want = ref.attention_bwd_emul(b["dout"], b["q"], b["k"], b["v"], case.layout(from_torch(out)), from_torch(lse),
                                  **kw)
    for name, got, expect in zip(("dq", "dk", "dv"), grads, want, strict=True):
        assert_bytes_equal(from_torch(got), case.layout(expect), f"{case.name} {name}")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_attention_close_to_float64(case):
    a, _, out, lse, grads = _run(case)
    a = {name: case.layout(x) for name, x in a.items()}  # bshd for the reference
    kw = case.ref_kwargs()
    tol = TOLERANCE[case.dtype]
    want_out, want_lse = ref.attention_fwd_f64(a["q"], a["k"], a["v"], **kw)
    np.testing.assert_allclose(case.layout(from_torch(out)).astype(np.float64), want_out, atol=tol, rtol=tol)
    got_lse = from_torch(lse).astype(np.float64)
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(want_lse)), "fully masked rows must give lse = -inf"
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(got_lse[finite], want_lse[finite], atol=2e-5, rtol=2e-6)
    want = ref.attention_bwd_f64(a["dout"], a["q"], a["k"], a["v"], **kw)
    for name, got, expect in zip(("dq", "dk", "dv"), grads, want, strict=True):
        scale = max(1.0, float(np.abs(expect).max()))
        np.testing.assert_allclose(case.layout(from_torch(got)).astype(np.float64), expect, atol=4 * tol * scale,
                                   rtol=4 * tol,
                                   err_msg=f"{case.name} {name}")


def test_attention_fully_masked_rows_are_zero():
    case = BY_NAME["padding_zero_lengths"]
    _, _, out, lse, grads = _run(case)
    assert torch.all(out[1:, 7:] == 0) and torch.all(out[1, :] == 0)  # batch 1 has no queries, batch 2 no keys
    assert torch.all(torch.isneginf(lse[1])) and torch.all(torch.isneginf(lse[2]))
    dq, dk, dv = grads
    assert torch.all(dq[1] == 0) and torch.all(dq[2] == 0) and torch.all(dk[1, 5:] == 0) and torch.all(dv[2] == 0)


def test_attention_dropout_changes_with_rng_and_is_reproducible():
    case = BY_NAME["dropout"]
    a = case.inputs()
    q, k, v = (to_torch(a[n]) for n in ("q", "k", "v"))
    first = ta.attention_fwd(q, k, v, mask_type="causal", dropout_p=0.25, rng=torch.tensor([1, 2]))[0]
    again = ta.attention_fwd(q, k, v, mask_type="causal", dropout_p=0.25, rng=torch.tensor([1, 2]))[0]
    other = ta.attention_fwd(q, k, v, mask_type="causal", dropout_p=0.25, rng=torch.tensor([1, 3]))[0]
    assert torch.equal(first, again) and not torch.equal(first, other)


def _step(q, k, v, dout, cu):
    out, lse = ta.attention_fwd(q, k, v, mask_type="causal")
    dq, dk, dv = ta.attention_bwd(dout, q, k, v, out, lse, mask_type="causal")
    out2, _ = ta.attention_fwd(q, k, v, mask_type="no_mask", window_size=(3, 2), dropout_p=0.1,
                               rng=torch.tensor([5, 6]))
    thd = dict(mask_type="padding_causal", qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    out3, lse3 = ta.attention_fwd(q[0], k[0], v[0], **thd)
    dq3 = ta.attention_bwd(dout[0], q[0], k[0], v[0], out3, lse3, **thd)[0]
    return out, lse, dq, dk, dv, out2, out3, dq3


def test_attention_compiled_matches_eager_without_recompiles_per_length():
    fn = torch.compile(_step, fullgraph=True, dynamic=True, backend="inductor")
    for seq in (17, 40, 65):
        q, k, v, dout = torch.randn(2, seq, 4, 8), torch.randn(2, seq, 2, 8), torch.randn(2, seq, 2, 8), \
            torch.randn(2, seq, 4, 8)
        cu = torch.tensor([0, 9, seq], dtype=torch.int32)
        with no_recompiles() if seq != 17 else contextlib.nullcontext():
            got = fn(q, k, v, dout, cu)
        for i, (x, y) in enumerate(zip(got, _step(q, k, v, dout, cu), strict=True)):
            assert_bytes_equal(from_torch(x), from_torch(y), f"compiled output {i} seq={seq}")


def test_attention_opcheck():
    q, k, v = torch.randn(2, 9, 4, 8), torch.randn(2, 11, 2, 8), torch.randn(2, 11, 2, 8)
    lens = torch.tensor([9, 3], dtype=torch.int32), torch.tensor([11, 0], dtype=torch.int32)
    args = (q, k, v, *lens, torch.tensor([1, 2]), "padding_causal_bottom_right", -1, 0, 0.35, 0.2, "bshd", None,
            None)
    torch.library.opcheck(torch.ops.twinengine.attention_fwd.default, args)
    out, lse = torch.ops.twinengine.attention_fwd(*args)
    torch.library.opcheck(torch.ops.twinengine.attention_bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, *args[3:]))
    torch.library.opcheck(torch.ops.twinengine.attention_fwd.default,
                          (q.transpose(0, 1).contiguous().bfloat16(), k.transpose(0, 1).contiguous().bfloat16(),
                           v.transpose(0, 1).contiguous().bfloat16(), None, None, None, "no_mask", 2, 2, 0.5, 0.0,
                           "sbhd", None, None))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 6, 11], dtype=torch.int32)
    thd = (q[0], k[0], v[0], None, None, None, "padding_causal", -1, 0, 0.35, 0.0, "thd", *cu)
    torch.library.opcheck(torch.ops.twinengine.attention_fwd.default, thd)
    out, lse = torch.ops.twinengine.attention_fwd(*thd)
    torch.library.opcheck(torch.ops.twinengine.attention_bwd.default, (torch.randn_like(out), *thd[:3], out, lse,
                                                                        *thd[3:]))


def test_attention_seqlens_out_of_range_raise():
    q = torch.randn(2, 5, 2, 8)
    with pytest.raises(ValueError, match=r"seqlens_kv\[1\] = 6 is outside \[0, 5\]"):
        ta.attention_fwd(q, q, q, mask_type="padding", seqlens_kv=torch.tensor([5, 6], dtype=torch.int32))


@pytest.mark.parametrize("case", THD_CASES, ids=THD_IDS)
def test_attention_thd_matches_emulation_and_float64(case):
    a, kw = case.inputs(), case.kwargs()
    tkw = _torch_kwargs(kw)
    q, k, v, dout = (to_torch(a[n]) for n in ("q", "k", "v", "dout"))
    out, lse = ta.attention_fwd(q, k, v, **tkw)
    grads = ta.attention_bwd(dout, q, k, v, out, lse, **tkw)
    assert tuple(out.shape) == (case.t_q, case.heads, case.d) and tuple(lse.shape) == (case.heads, case.t_q)
    # The references see thd as one bshd batch of packed tokens with a block-diagonal mask.
    b = {n: x[None] for n, x in a.items()}
    vis = ref.visible_thd_ref(case.mask_type, case.window_size, case.cu_q, case.cu_kv, case.t_q, case.t_kv)
    rkw = {"mask_type": case.mask_type, "dropout_p": case.dropout_p, "rng": kw.get("rng"), "visible": vis}
    want_out, want_lse = ref.attention_fwd_emul(b["q"], b["k"], b["v"], **rkw)
    assert_bytes_equal(from_torch(out), want_out[0], f"{case.name} out")
    assert_bytes_equal(from_torch(lse), want_lse[0], f"{case.name} lse")
    want = ref.attention_bwd_emul(b["dout"], b["q"], b["k"], b["v"], from_torch(out)[None], from_torch(lse)[None],
                                  **rkw)
    for name, got, expect in zip(("dq", "dk", "dv"), grads, want, strict=True):
        assert_bytes_equal(from_torch(got), expect[0], f"{case.name} {name}")
    f64_out, _ = ref.attention_fwd_f64(b["q"], b["k"], b["v"], **rkw)
    np.testing.assert_allclose(from_torch(out).astype(np.float64), f64_out[0], atol=2e-5, rtol=2e-5)
    f64_grads = ref.attention_bwd_f64(b["dout"], b["q"], b["k"], b["v"], **rkw)
    for name, got, expect in zip(("dq", "dk", "dv"), grads, f64_grads, strict=True):
        scale = max(1.0, float(np.abs(expect).max()))
        np.testing.assert_allclose(from_torch(got).astype(np.float64), expect[0], atol=8e-5 * scale, rtol=8e-5,
                                   err_msg=f"{case.name} {name}")


def test_attention_thd_bad_offsets_raise_from_the_kernel():
    q = torch.randn(6, 2, 8)
    with pytest.raises(ValueError, match=r"cu_seqlens_kv must be non-decreasing offsets in \[0, 6\]"):
        ta.attention_fwd(q, q, q, mask_type="padding", qkv_format="thd",
                         cu_seqlens_q=torch.tensor([0, 3, 6], dtype=torch.int32),
                         cu_seqlens_kv=torch.tensor([0, 4, 2], dtype=torch.int32))


def test_attention_zero_dropout_ignores_rng():
    q, k, v = torch.randn(1, 9, 2, 8), torch.randn(1, 9, 2, 8), torch.randn(1, 9, 2, 8)
    plain = ta.attention_fwd(q, k, v, mask_type="causal")
    with_rng = ta.attention_fwd(q, k, v, mask_type="causal", dropout_p=0.0, rng=torch.tensor([1, 2]))
    for a, b in zip(plain, with_rng, strict=True):
        assert torch.equal(a, b)

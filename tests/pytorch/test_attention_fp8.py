"""FP8 attention (docs/attention.md §9) in the torch frontend: exact bytes vs the NumPy
emulation (forward and backward, every mask type / GQA / padding / window / dropout / layout /
thd case), error vs float64 attention within the stated FP8 tolerance, opcheck, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attention_cases import BY_NAME, CASE_IDS, CASES, THD_CASES, THD_IDS
from helpers import assert_bytes_equal, from_torch, to_torch
from reference import attention as ref

from twinengine.pytorch._ops import attention as ta

# FP8 vs float64 attention on standard-normal inputs (docs/attention.md §9 "Error bounds"): out
# within FWD_TOL · max(1, max|out|); gradients within BWD_TOL · max|grad| (E5M2 dO / dS carry
# 2 mantissa bits, so the gradients are far coarser than the output); lse within LSE_TOL absolute.
# Measured maxima over these cases: out 0.061, lse 0.14, dq 0.20, dk 0.16, dv 0.091.
FWD_TOL = 0.1
LSE_TOL = 0.25
BWD_TOL = 0.3


def _torch_kwargs(kw: dict) -> dict:
    return {name: (torch.from_numpy(value) if isinstance(value, np.ndarray) else value) for name, value in kw.items()}


def _run(a: dict, kw: dict):
    tkw = _torch_kwargs(kw)
    q, k, v, dout = (to_torch(a[n]) for n in ("q", "k", "v", "dout"))
    out, lse = ta.attention_fwd(q, k, v, **tkw, fp8=True)
    grads = ta.attention_bwd(dout, q, k, v, out, lse, **tkw, fp8=True)
    return out, lse, grads


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_attention_fp8_matches_emulation_bytes(case):
    a = case.inputs()
    out, lse, grads = _run(a, case.kwargs())
    b = {name: case.layout(x) for name, x in a.items()}  # bshd for the reference
    kw = case.ref_kwargs()
    want_out, want_lse = ref.attention_fp8_fwd_emul(b["q"], b["k"], b["v"], **kw)
    assert_bytes_equal(from_torch(out), case.layout(want_out), f"{case.name} out")
    assert_bytes_equal(from_torch(lse), want_lse, f"{case.name} lse")
    want = ref.attention_fp8_bwd_emul(b["dout"], b["q"], b["k"], b["v"], case.layout(from_torch(out)),
                                      from_torch(lse), **kw)
    for name, got, expect in zip(("dq", "dk", "dv"), grads, want, strict=True):
        assert_bytes_equal(from_torch(got), case.layout(expect), f"{case.name} {name}")


@pytest.mark.parametrize("case", THD_CASES, ids=THD_IDS)
def test_attention_fp8_thd_matches_emulation_bytes(case):
    a, kw = case.inputs(), case.kwargs()
    out, lse, grads = _run(a, kw)
    vis = ref.visible_thd_ref(case.mask_type, case.window_size, case.cu_q, case.cu_kv, case.t_q, case.t_kv)
    rkw = {"mask_type": case.mask_type, "dropout_p": case.dropout_p, "rng": kw.get("rng"), "visible": vis}
    b = {name: x[None] for name, x in a.items()}  # one bshd batch of packed tokens
    want_out, want_lse = ref.attention_fp8_fwd_emul(b["q"], b["k"], b["v"], **rkw)
    assert_bytes_equal(from_torch(out), want_out[0], f"{case.name} out")
    assert_bytes_equal(from_torch(lse), want_lse[0], f"{case.name} lse")
    want = ref.attention_fp8_bwd_emul(b["dout"], b["q"], b["k"], b["v"], from_torch(out)[None],
                                      from_torch(lse)[None], **rkw)
    for name, got, expect in zip(("dq", "dk", "dv"), grads, want, strict=True):
        assert_bytes_equal(from_torch(got), expect[0], f"{case.name} {name}")


@pytest.mark.parametrize("name", ["no_mask", "causal_gqa", "sliding_window", "padding_causal", "bf16",
                                  "seq1_query_long_kv"])
def test_attention_fp8_close_to_float64(name):
    case = BY_NAME[name]
    a = case.inputs()
    out, lse, grads = _run(a, case.kwargs())
    a = {n: case.layout(x) for n, x in a.items()}
    kw = case.ref_kwargs()
    want_out, want_lse = ref.attention_fwd_f64(a["q"], a["k"], a["v"], **kw)
    got = case.layout(from_torch(out)).astype(np.float64)
    np.testing.assert_allclose(got, want_out, atol=FWD_TOL * max(1.0, float(np.abs(want_out).max())), rtol=0)
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(from_torch(lse).astype(np.float64)[finite], want_lse[finite], atol=LSE_TOL, rtol=0)
    want = ref.attention_bwd_f64(a["dout"], a["q"], a["k"], a["v"], **kw)
    for grad_name, g, expect in zip(("dq", "dk", "dv"), grads, want, strict=True):
        scale = max(1e-6, float(np.abs(expect).max()))
        np.testing.assert_allclose(case.layout(from_torch(g)).astype(np.float64), expect, atol=BWD_TOL * scale,
                                   rtol=0, err_msg=f"{name} {grad_name}")
    # ...and it really is a different (quantized) computation from the high-precision kernel.
    hp_out, _ = ta.attention_fwd(*(to_torch(case.layout(a[n])) for n in ("q", "k", "v")),
                                 **_torch_kwargs(case.kwargs()))
    assert not torch.equal(hp_out, out)


def test_attention_fp8_scales_are_per_tensor_current():
    # Scaling every input by a power of two scales the per-tensor scales exactly: out scales by
    # the v factor only, and the bytes are otherwise unchanged (no state, no history).
    case = BY_NAME["causal_gqa"]
    a = case.inputs()
    kw = _torch_kwargs(case.kwargs())
    q, k, v = (to_torch(a[n]) for n in ("q", "k", "v"))
    out, lse = ta.attention_fwd(q, k, v, **kw, fp8=True)
    out2, lse2 = ta.attention_fwd(q * 4, k * 0.25, v * 8, **kw, fp8=True)
    assert torch.equal(out2, out * 8) and torch.equal(lse2, lse)
    again, _ = ta.attention_fwd(q, k, v, **kw, fp8=True)
    assert torch.equal(again, out)


def test_attention_fp8_opcheck_and_bad_flag():
    case = BY_NAME["causal_gqa"]
    a = case.inputs()
    q, k, v = (to_torch(a[n]) for n in ("q", "k", "v"))
    args = (q, k, v, None, None, None, "causal", -1, 0, 0.25, 0.0, "bshd", None, None, True)
    torch.library.opcheck(torch.ops.twinengine.attention_fwd.default, args)
    out, lse = torch.ops.twinengine.attention_fwd(*args)
    torch.library.opcheck(torch.ops.twinengine.attention_bwd.default, (torch.randn_like(out), q, k, v, out, lse,
                                                                        *args[3:]))
    with pytest.raises(TypeError, match="fp8 must be a bool, got 1"):
        ta.attention_fwd(q, k, v, mask_type="causal", fp8=1)


def _fp8_step(q, k, v, dout):
    out, lse = ta.attention_fwd(q, k, v, mask_type="causal", fp8=True)
    return (out, lse) + tuple(ta.attention_bwd(dout, q, k, v, out, lse, mask_type="causal", fp8=True))


def test_attention_fp8_compiled_matches_eager():
    fn = torch.compile(_fp8_step, fullgraph=True, backend="inductor")
    q, k, v, dout = torch.randn(1, 21, 2, 8), torch.randn(1, 21, 1, 8), torch.randn(1, 21, 1, 8), \
        torch.randn(1, 21, 2, 8)
    for i, (x, y) in enumerate(zip(fn(q, k, v, dout), _fp8_step(q, k, v, dout), strict=True)):
        assert_bytes_equal(from_torch(x), from_torch(y), f"compiled fp8 output {i}")

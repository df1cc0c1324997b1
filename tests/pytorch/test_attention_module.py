"""tep.DotProductAttention module: autograd gradients vs a float64 torch reference, layouts, GQA,
padding via attention_mask, dropout rng handling and bad-input errors."""

import pytest
import torch

import twinengine.pytorch as tep


def _ref(q, k, v, causal, scale, seqlens=None):
    # q (B,S,H,D) float64, causal top-left, GQA by repeat
    h, hk = q.shape[2], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    sq, sk = q.shape[1], k.shape[1]
    mask = torch.zeros(sq, sk, dtype=torch.bool)
    if causal:
        mask = torch.ones(sq, sk, dtype=torch.bool).triu(1)
    mask = mask.expand(q.shape[0], 1, sq, sk).clone()
    if seqlens is not None:
        for b, n in enumerate(seqlens):
            mask[b, :, :, n:] = True
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask_type,hk,s", [("causal", 4, 70), ("no_mask", 2, 1), ("causal", 1, 9)])
def test_grads_vs_float64(fmt, mask_type, hk, s):
    torch.manual_seed(0)
    b, h, d = 2, 4, 16
    q = torch.randn(b, s, h, d)
    k = torch.randn(b, s, hk, d)
    v = torch.randn(b, s, hk, d)
    g = torch.randn(b, s, h, d)
    mod = tep.DotProductAttention(h, d, num_gqa_groups=hk, attn_mask_type=mask_type, qkv_format=fmt)
    tr = (lambda x: x.transpose(0, 1).contiguous()) if fmt == "sbhd" else (lambda x: x)
    qs, ks, vs = (tr(x).clone().requires_grad_() for x in (q, k, v))
    out = mod(qs, ks, vs)
    assert out.shape == tr(q).shape[:2] + (h * d,)
    out.backward(tr(g).reshape(out.shape))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = _ref(q64, k64, v64, mask_type == "causal", d ** -0.5)
    ref.backward(g.double())
    torch.testing.assert_close(tr(out.reshape(tr(q).shape)).double() if fmt == "bshd" else
                               out.reshape(tr(q).shape).transpose(0, 1).double(), ref, atol=2e-5, rtol=1e-5)
    for got, want in ((qs.grad, q64.grad), (ks.grad, k64.grad), (vs.grad, v64.grad)):
        got = got.transpose(0, 1) if fmt == "sbhd" else got
        torch.testing.assert_close(got.double(), want, atol=5e-5, rtol=1e-4)


def test_padding_attention_mask():
    torch.manual_seed(1)
    b, s, h, d = 2, 10, 2, 8
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.float32) for _ in range(3))
    lens = [10, 6]
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    for i, n in enumerate(lens):
        mask[i, ..., :n] = False
    mod = tep.DotProductAttention(h, d, attn_mask_type="padding")
    out = mod(q, k, v, attention_mask=mask).reshape(b, s, h, d)
    ref = _ref(q.double(), k.double(), v.double(), False, d ** -0.5, lens)
    torch.testing.assert_close(out[0].double(), ref[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :6].double(), ref[1, :6], atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        mod(q, k, v, attention_mask=mask[:, :, :, :5])


def test_dropout_rng_advances_and_replays():
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 8, 2, 8, requires_grad=True) for _ in range(3))
    mod = tep.DotProductAttention(2, 8, attention_dropout=0.5, seed=7)
    a = mod(q, k, v)
    assert mod.rng_state.tolist() == [7, 1]
    b = mod(q, k, v)
    assert not torch.equal(a, b)
    mod.rng_state[1] = 0
    c = mod(q, k, v)
    assert torch.equal(a, c)
    c.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    mod.eval()
    torch.testing.assert_close(mod(q, k, v), tep.DotProductAttention(2, 8)(q, k, v), atol=0, rtol=0)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="divisible"):
        tep.DotProductAttention(6, 8, num_gqa_groups=4)
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError):
        tep.DotProductAttention(2, 8, qkv_format="thd")(q[0], q[0], q[0])
    with pytest.raises(ValueError):
        tep.DotProductAttention(2, 8, attn_mask_type="causal", window_size=(2, 2))(q, q, q)


def test_compile_fullgraph_equals_eager_dynamic_seq():
    import torch._dynamo as dynamo
    import torch._dynamo.testing
    dynamo.reset()
    mod = tep.DotProductAttention(4, 8, num_gqa_groups=2, attn_mask_type="causal")
    counter = dynamo.testing.CompileCounterWithBackend("aot_eager")

    def fwd(q, k, v):
        return mod(q, k, v).square().sum()

    compiled_fwd = torch.compile(fwd, fullgraph=True, backend=counter)

    def step(f, q, k, v):
        out = f(q, k, v)
        return out, torch.autograd.grad(out, (q, k, v))

    for s in (5, 70, 33):
        torch.manual_seed(s)
        q = torch.randn(2, s, 4, 8, requires_grad=True)
        k = torch.randn(2, s, 2, 8, requires_grad=True)
        v = torch.randn(2, s, 2, 8, requires_grad=True)
        for x in (q, k, v):
            torch._dynamo.mark_dynamic(x, 1)
        out_c, grads_c = step(compiled_fwd, q, k, v)
        out_e, grads_e = step(fwd, q, k, v)
        torch.testing.assert_close(out_c, out_e, atol=0, rtol=0)
        for a, b in zip(grads_c, grads_e):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert counter.frame_count == 1


def test_compiled_same_tensor_for_q_k_v_and_one_cu_seqlens():
    """Self-attention passes one tensor as q, k and v and one cu_seqlens for q and kv:
    torch.compile(fullgraph=True) traces it (no duplicate-input graph break), same bytes as eager."""
    mod = tep.DotProductAttention(2, 8, attn_mask_type="padding_causal", qkv_format="thd")
    cu = torch.tensor([0, 3, 9], dtype=torch.int32)

    def fwd(x):
        return mod(x, x, x, cu_seqlens_q=cu, cu_seqlens_kv=cu)

    compiled = torch.compile(fwd, fullgraph=True, backend="aot_eager")
    x = torch.randn(9, 2, 8)
    outs = []
    for fn in (fwd, compiled):
        xs = x.clone().requires_grad_()
        y = fn(xs)
        y.square().sum().backward()
        outs.append((y.detach(), xs.grad))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=0, rtol=0)

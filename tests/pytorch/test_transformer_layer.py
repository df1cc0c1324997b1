"""tep.MultiheadAttention and tep.TransformerLayer: forward and gradients vs a float64 plain-torch
reference (masks, GQA/MQA, layouts, norms, activations, hidden dropout from the NumPy Philox
reference), every recipe eager == compiled bytes, torch.compile(fullgraph=True) with a dynamic
sequence length, TE's parameter names, bad-argument errors."""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import twinengine as te
import twinengine.pytorch as tep
from helpers import assert_bytes_equal, no_recompiles
from reference.attention import visible_ref, visible_thd_ref


def _norm64(x, w, b, normalization, eps, zero_centered_gamma):
    g = 1 + w if zero_centered_gamma else w
    if normalization == "LayerNorm":
        return F.layer_norm(x, (x.shape[-1],), g, b, eps)
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * g


def _attention64(q, k, v, visible, scale):
    """q (B,S,H,D), k/v (B,S,G,D), visible bool (B,S_q,S_kv); fully masked rows give 0."""
    h, g = q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(h // g, dim=2), v.repeat_interleave(h // g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s = s.masked_fill(~visible[:, None], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def _rope64(t, freqs, positions):
    """TE's rotary embedding (non-interleaved) in float64: t (B,S,H,D), freqs (S_f,1,1,d2) fp32
    angles, positions (S,) the row of freqs each token uses."""
    d2 = freqs.shape[-1]
    angle = freqs.double()[positions.long(), 0, 0][None, :, None, :]
    x, rest = t[..., :d2], t[..., d2:]
    rotated = torch.cat([-x[..., d2 // 2:], x[..., :d2 // 2]], dim=-1)
    return torch.cat([x * angle.cos() + rotated * angle.sin(), rest], dim=-1)


def _mha64(x, p, *, heads, groups, d, visible, fmt, prefix, input_layernorm=True, normalization="LayerNorm",
           eps=1e-5, zero_centered_gamma=False, freqs=None, positions=None):
    """Float64 MultiheadAttention on x in layout fmt; p: the module's named parameters (float64);
    freqs: rotary angles for Q and K, or a (q, k) pair."""
    if fmt == "sbhd":
        x = x.transpose(0, 1)
    if fmt == "thd":
        x = x[None]
    if input_layernorm:
        h = _norm64(x, p[prefix + "layernorm_qkv.layer_norm_weight"],
                    p.get(prefix + "layernorm_qkv.layer_norm_bias"), normalization, eps, zero_centered_gamma)
        qkv = F.linear(h, p[prefix + "layernorm_qkv.weight"], p.get(prefix + "layernorm_qkv.bias"))
    else:
        qkv = F.linear(x, p[prefix + "qkv.weight"], p.get(prefix + "qkv.bias"))
    q, k, v = qkv.split([heads * d, groups * d, groups * d], dim=-1)
    b, s = x.shape[:2]
    q, k, v = q.reshape(b, s, heads, d), k.reshape(b, s, groups, d), v.reshape(b, s, groups, d)
    if freqs is not None:
        q_freqs, k_freqs = freqs if isinstance(freqs, tuple) else (freqs, freqs)
        positions = torch.arange(s) if positions is None else positions
        q, k = _rope64(q, q_freqs, positions), _rope64(k, k_freqs, positions)
    ctx = _attention64(q, k, v, visible, d ** -0.5)
    out = F.linear(ctx.reshape(b, s, heads * d), p[prefix + "proj.weight"], p.get(prefix + "proj.bias"))
    if fmt == "sbhd":
        out = out.transpose(0, 1)
    return out[0] if fmt == "thd" else out


def _params64(module):
    return {n: t.detach().double().requires_grad_() for n, t in module.named_parameters()}


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in module.parameters():
            t.copy_(torch.rand(t.shape, generator=g, dtype=torch.float64).mul(1.0).sub(0.5).to(t.dtype))


def _check_grads(module, p64, x, x64, out, ref, atol=5e-5, rtol=1e-4):
    torch.testing.assert_close(out.double(), ref.detach(), atol=atol, rtol=rtol)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    out.backward(dy.to(out.dtype))
    ref.backward(dy)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=atol, rtol=rtol)
    for name, t in module.named_parameters():
        torch.testing.assert_close(t.grad.double(), p64[name].grad, atol=atol, rtol=rtol, msg=name)


def _lens_mask(lens, s):
    """TE's padding attention_mask (B,1,1,S), True = masked."""
    mask = torch.ones(len(lens), 1, 1, s, dtype=torch.bool)
    for i, n in enumerate(lens):
        mask[i, ..., :n] = False
    return mask


MHA_CASES = [
    # (mask_type, window, heads, groups, input_layernorm, normalization, lens)
    ("causal", None, 4, 4, True, "LayerNorm", None),
    ("no_mask", None, 4, 2, False, None, None),
    ("padding", None, 4, 1, True, "RMSNorm", (9, 5)),
    ("padding_causal", None, 4, 2, True, "LayerNorm", (7, 9)),
    ("causal_bottom_right", None, 2, 1, False, None, None),
    ("causal", (3, 0), 4, 2, True, "RMSNorm", None),
    ("no_mask", (2, 1), 2, 2, True, "LayerNorm", None),
]


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("case", MHA_CASES, ids=lambda c: f"{c[0]}-w{c[1]}-h{c[2]}g{c[3]}-{c[5]}")
def test_multihead_attention_matches_float64(fmt, case):
    mask_type, window, heads, groups, ln, normalization, lens = case
    b, s, d = 2, 9, 8
    hidden = heads * d
    mha = tep.MultiheadAttention(hidden, heads, num_gqa_groups=groups, attention_dropout=0.0,
                                 attn_mask_type=mask_type, window_size=window, input_layernorm=ln,
                                 normalization=normalization or "LayerNorm", qkv_format=fmt)
    _randomize(mha)
    p64 = _params64(mha)
    x_bshd = torch.randn(b, s, hidden, generator=torch.Generator().manual_seed(1))
    x = (x_bshd.transpose(0, 1) if fmt == "sbhd" else x_bshd).contiguous().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    kw = {}
    if lens is not None:
        kw["attention_mask"] = _lens_mask(lens, s)
    out = mha(x, **kw)
    visible = torch.from_numpy(visible_ref(mask_type, window, s, s, lens, lens, batch=b))
    ref = _mha64(x64, p64, heads=heads, groups=groups, d=d, visible=visible, fmt=fmt, prefix="",
                 input_layernorm=ln, normalization=normalization)
    assert out.shape == x.shape
    _check_grads(mha, p64, x, x64, out, ref)


def test_multihead_attention_thd_packed_sequences():
    heads, groups, d, cu = 4, 2, 8, [0, 5, 12, 13]
    hidden = heads * d
    mha = tep.MultiheadAttention(hidden, heads, num_gqa_groups=groups, attention_dropout=0.0,
                                 attn_mask_type="padding_causal", input_layernorm=True, qkv_format="thd")
    _randomize(mha, 3)
    p64 = _params64(mha)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    x = torch.randn(cu[-1], hidden, generator=torch.Generator().manual_seed(2)).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    out = mha(x, cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t)
    visible = torch.from_numpy(visible_thd_ref("padding_causal", None, cu, cu, cu[-1], cu[-1]))
    ref = _mha64(x64, p64, heads=heads, groups=groups, d=d, visible=visible, fmt="thd", prefix="")
    _check_grads(mha, p64, x, x64, out, ref)


@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_multihead_attention_rotary_matches_float64(fmt):
    """rotary_pos_emb (TE's freqs (S_f,1,1,d2), here partial: d2 = d/2) rotates Q and K; a
    (q_freqs, k_freqs) pair rotates each by its own angles; thd positions restart per sequence."""
    heads, groups, d, b, s = 4, 2, 16, 2, 9
    hidden = heads * d
    mha = tep.MultiheadAttention(hidden, heads, num_gqa_groups=groups, attention_dropout=0.0, input_layernorm=True,
                                 attn_mask_type="padding_causal" if fmt == "thd" else "causal", qkv_format=fmt)
    _randomize(mha, 12)
    rope = tep.RotaryPositionEmbedding(d, rotary_percent=0.5)
    pair = (rope(16), rope(16, offset=3))
    for freqs in (rope(12), pair):
        p64 = _params64(mha)
        kw, positions = {}, None
        if fmt == "thd":
            cu = [0, 5, 12, 13]
            cu_t = torch.tensor(cu, dtype=torch.int32)
            kw = {"cu_seqlens_q": cu_t, "cu_seqlens_kv": cu_t}
            x = torch.randn(cu[-1], hidden, generator=torch.Generator().manual_seed(2))
            visible = torch.from_numpy(visible_thd_ref("padding_causal", None, cu, cu, cu[-1], cu[-1]))
            positions = torch.cat([torch.arange(cu[i + 1] - cu[i]) for i in range(len(cu) - 1)])
        else:
            x_bshd = torch.randn(b, s, hidden, generator=torch.Generator().manual_seed(2))
            x = (x_bshd.transpose(0, 1) if fmt == "sbhd" else x_bshd).contiguous()
            visible = torch.from_numpy(visible_ref("causal", None, s, s, batch=b))
        x = x.requires_grad_()
        x64 = x.detach().double().requires_grad_()
        for t in mha.parameters():
            t.grad = None
        out = mha(x, rotary_pos_emb=freqs, **kw)
        ref = _mha64(x64, p64, heads=heads, groups=groups, d=d, visible=visible, fmt=fmt, prefix="", freqs=freqs,
                     positions=positions)
        _check_grads(mha, p64, x, x64, out, ref)
    plain = mha(x.detach(), **kw)
    assert not torch.equal(plain, out.detach())


def _interleave_rows(t, heads, groups, d):
    """[Q; K; V] rows -> TE's qkv_weight_interleaved layout: per group its queries, key, value."""
    q, k, v = t.split([heads * d, groups * d, groups * d])
    per = heads // groups
    blocks = []
    for g in range(groups):
        blocks += [q[g * per * d:(g + 1) * per * d], k[g * d:(g + 1) * d], v[g * d:(g + 1) * d]]
    return torch.cat(blocks)


@pytest.mark.parametrize("heads,groups", [(4, 2), (4, 4), (4, 1)])
def test_multihead_attention_qkv_weight_interleaved_is_a_row_permutation(heads, groups):
    """qkv_weight_interleaved=True (TE's default row order) with the rows of a [Q; K; V] module
    permuted into it: the same bytes out and (permuted) projection gradients; the input gradient
    (and the norm's, which follow from it) sums over the QKV rows in the permuted order, so it
    agrees to rounding."""
    d, hidden = 8, 32
    mods = [tep.MultiheadAttention(hidden, heads, kv_channels=d, num_gqa_groups=groups, attention_dropout=0.0,
                                   input_layernorm=True, qkv_format="bshd", qkv_weight_interleaved=inter)
            for inter in (False, True)]
    _randomize(mods[0], 18)
    with torch.no_grad():
        for name, t in mods[1].named_parameters():
            src = mods[0].get_parameter(name)
            t.copy_(_interleave_rows(src, heads, groups, d) if name.startswith("layernorm_qkv.weight")
                    or name == "layernorm_qkv.bias" else src)
    x = torch.randn(2, 7, hidden, generator=torch.Generator().manual_seed(19))
    dy = torch.randn(2, 7, hidden, generator=torch.Generator().manual_seed(20))
    runs = []
    for mod in mods:
        xs = x.clone().requires_grad_()
        y = mod(xs)
        y.backward(dy)
        runs.append((y.detach(), xs.grad, {n: t.grad for n, t in mod.named_parameters()}))
    (y0, dx0, g0), (y1, dx1, g1) = runs
    assert_bytes_equal(y1.numpy(), y0.numpy(), "out")
    torch.testing.assert_close(dx1, dx0, atol=1e-6, rtol=1e-5)
    for name in g0:
        if name.startswith("layernorm_qkv.layer_norm_"):
            torch.testing.assert_close(g1[name], g0[name], atol=1e-5, rtol=1e-5)
            continue
        want = _interleave_rows(g0[name], heads, groups, d) if name.startswith("layernorm_qkv.") else g0[name]
        assert_bytes_equal(g1[name].numpy(), want.numpy(), f"grad {name}")


def test_multihead_attention_return_layernorm_output():
    mha = tep.MultiheadAttention(16, 2, attention_dropout=0.0, input_layernorm=True, return_layernorm_output=True,
                                 normalization="RMSNorm", qkv_format="bshd")
    x = torch.randn(2, 3, 16)
    out, ln_out = mha(x)
    want = tep.RMSNorm(16)
    with torch.no_grad():
        want.weight.copy_(mha.layernorm_qkv.layer_norm_weight)
    assert_bytes_equal(ln_out.detach().numpy(), want(x).detach().numpy(), "layernorm output")
    assert out.shape == x.shape


# TE's parameter names (transformer_engine.pytorch, fuse_qkv_params=True); the Flax modules mirror them.
TE_MHA_PARAMS = {
    True: ["layernorm_qkv.layer_norm_weight", "layernorm_qkv.layer_norm_bias", "layernorm_qkv.weight",
           "layernorm_qkv.bias", "proj.weight", "proj.bias"],
    False: ["qkv.weight", "qkv.bias", "proj.weight", "proj.bias"],
}


@pytest.mark.parametrize("input_layernorm", [True, False])
def test_multihead_attention_parameter_names_are_te(input_layernorm):
    mha = tep.MultiheadAttention(32, 4, num_gqa_groups=2, kv_channels=16, input_layernorm=input_layernorm)
    names = [n for n, _ in mha.named_parameters()]
    assert sorted(names) == sorted(TE_MHA_PARAMS[input_layernorm])
    qkv = mha.layernorm_qkv if input_layernorm else mha.qkv
    assert tuple(qkv.weight.shape) == ((4 + 2 * 2) * 16, 32)
    assert tuple(mha.proj.weight.shape) == (32, 4 * 16)
    assert set(names) <= set(mha.state_dict())
    rms = tep.MultiheadAttention(32, 4, input_layernorm=True, normalization="RMSNorm", bias=False)
    assert [n for n, _ in rms.named_parameters()] == ["layernorm_qkv.layer_norm_weight", "layernorm_qkv.weight",
                                                      "proj.weight"]


@pytest.mark.parametrize("kwargs,match", [
    (dict(hidden_size=30, num_attention_heads=4), r"hidden_size \(30\) must be divisible by num_attention_heads \(4\)"),
    (dict(hidden_size=32, num_attention_heads=6, kv_channels=8, num_gqa_groups=4),
     r"num_attention_heads \(6\) must be divisible by num_gqa_groups \(4\)"),
    (dict(hidden_size=32, num_attention_heads=0), "num_attention_heads must be a positive int"),
    (dict(hidden_size=32, num_attention_heads=4, qkv_format="bhsd"), "qkv_format must be"),
    (dict(hidden_size=32, num_attention_heads=4, attn_mask_type="diagonal"), "attn_mask_type must be one of"),
    (dict(hidden_size=32, num_attention_heads=4, window_size=(4, 4)), "contradicts mask_type 'causal'"),
    (dict(hidden_size=32, num_attention_heads=4, fuse_qkv_params=False), "fuse_qkv_params must be True"),
    (dict(hidden_size=32, num_attention_heads=4, return_layernorm_output=True), "needs input_layernorm=True"),
    (dict(hidden_size=32, num_attention_heads=4, input_layernorm=True, normalization="BatchNorm"),
     "normalization must be 'LayerNorm' or 'RMSNorm'"),
])
def test_multihead_attention_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match="twinengine.*" + match):
        tep.MultiheadAttention(**kwargs)


def test_multihead_attention_bad_input():
    mha = tep.MultiheadAttention(16, 2, qkv_format="bshd", attn_mask_type="padding")
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        mha(torch.randn(2, 5, 16), attention_mask=torch.zeros(2, 1, 1, 4, dtype=torch.bool))
    with pytest.raises(ValueError):
        mha(torch.randn(2, 5, 12))


# ---- TransformerLayer ----------------------------------------------------------------------

_ACT64 = {
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "srelu": lambda x: F.relu(x).square(),
    "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": F.silu,
}


def _act64(name, x):
    if name in _ACT64:
        return _ACT64[name](x)
    a, b = x.chunk(2, dim=-1)
    base = {"geglu": "gelu", "reglu": "relu", "sreglu": "srelu", "qgeglu": "qgelu", "swiglu": "silu"}[name]
    return _ACT64[base](a) * b


def _dropout64(x, p, seed, offset):
    """Float64 dropout with the keep mask of the NumPy Philox reference (NUMERICS.md §11)."""
    if p == 0.0:
        return x
    from reference.dropout import dropout_keep_ref
    keep = torch.from_numpy(dropout_keep_ref(x.numel(), p, seed, offset).reshape(x.shape))
    return torch.where(keep, x / (1.0 - float(np.float32(p))), torch.zeros((), dtype=x.dtype))


def _layer64(x, p, *, heads, groups, d, visible, fmt, normalization, activation, eps=1e-5, zero_centered_gamma=False,
             hidden_dropout=0.0, seed=0, offset=0, freqs=None):
    attn = _mha64(x, p, heads=heads, groups=groups, d=d, visible=visible, fmt=fmt, prefix="self_attention.",
                  normalization=normalization, eps=eps, zero_centered_gamma=zero_centered_gamma, freqs=freqs)
    x = x + _dropout64(attn, hidden_dropout, seed, offset)
    h = _norm64(x, p["layernorm_mlp.layer_norm_weight"], p.get("layernorm_mlp.layer_norm_bias"), normalization, eps,
                zero_centered_gamma)
    h = F.linear(_act64(activation, F.linear(h, p["layernorm_mlp.fc1_weight"], p.get("layernorm_mlp.fc1_bias"))),
                 p["layernorm_mlp.fc2_weight"], p.get("layernorm_mlp.fc2_bias"))
    return x + _dropout64(h, hidden_dropout, seed, offset + 1)


LAYER_CASES = [
    # (fmt, normalization, activation, heads, groups, mask_type, zero_centered_gamma, bias)
    ("sbhd", "LayerNorm", "gelu", 4, 4, "causal", False, True),
    ("bshd", "RMSNorm", "swiglu", 4, 1, "no_mask", True, False),
    ("bshd", "LayerNorm", "srelu", 4, 2, "causal_bottom_right", False, True),
    ("sbhd", "RMSNorm", "geglu", 2, 2, "padding_causal", False, True),
]


@pytest.mark.parametrize("case", LAYER_CASES, ids=lambda c: "-".join(map(str, c)))
def test_transformer_layer_matches_float64(case):
    fmt, normalization, activation, heads, groups, mask_type, zcg, bias = case
    b, s, d, ffn = 2, 7, 8, 24
    hidden = heads * d
    layer = tep.TransformerLayer(hidden, ffn, heads, num_gqa_groups=groups, hidden_dropout=0.0, attention_dropout=0.0,
                                 self_attn_mask_type=mask_type, normalization=normalization, activation=activation,
                                 zero_centered_gamma=zcg, bias=bias, attn_input_format=fmt, layernorm_epsilon=1e-3)
    _randomize(layer, 4)
    p64 = _params64(layer)
    x_bshd = torch.randn(b, s, hidden, generator=torch.Generator().manual_seed(5))
    x = (x_bshd.transpose(0, 1) if fmt == "sbhd" else x_bshd).contiguous().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    lens = (7, 4) if "padding" in mask_type else None
    out = layer(x, attention_mask=None if lens is None else _lens_mask(lens, s))
    visible = torch.from_numpy(visible_ref(mask_type, None, s, s, lens, lens, batch=b))
    ref = _layer64(x64, p64, heads=heads, groups=groups, d=d, visible=visible, fmt=fmt, normalization=normalization,
                   activation=activation, eps=1e-3, zero_centered_gamma=zcg)
    _check_grads(layer, p64, x, x64, out, ref, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("s", [1, 70])
def test_transformer_layer_sequence_1_and_past_one_key_block(s):
    """Sequence 1 and 70 (> the kernel's 64-key block, not a multiple of it) vs float64."""
    heads, groups, d, b, ffn = 2, 1, 8, 2, 24
    layer = tep.TransformerLayer(heads * d, ffn, heads, num_gqa_groups=groups, hidden_dropout=0.0,
                                 attention_dropout=0.0, attn_input_format="bshd")
    _randomize(layer, 21)
    p64 = _params64(layer)
    x = torch.randn(b, s, heads * d, generator=torch.Generator().manual_seed(22)).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    out = layer(x)
    visible = torch.from_numpy(visible_ref("causal", None, s, s, batch=b))
    ref = _layer64(x64, p64, heads=heads, groups=groups, d=d, visible=visible, fmt="bshd", normalization="LayerNorm",
                   activation="gelu")
    _check_grads(layer, p64, x, x64, out, ref, atol=5e-4, rtol=5e-4)


def test_transformer_layer_rotary_matches_float64():
    heads, groups, d, b, s, ffn = 2, 1, 16, 2, 7, 32
    layer = tep.TransformerLayer(heads * d, ffn, heads, num_gqa_groups=groups, hidden_dropout=0.0,
                                 attention_dropout=0.0, activation="swiglu", normalization="RMSNorm")
    _randomize(layer, 13)
    p64 = _params64(layer)
    freqs = tep.RotaryPositionEmbedding(d)(s)
    x = torch.randn(s, b, heads * d, generator=torch.Generator().manual_seed(14)).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    out = layer(x, rotary_pos_emb=freqs)
    visible = torch.from_numpy(visible_ref("causal", None, s, s, batch=b))
    ref = _layer64(x64, p64, heads=heads, groups=groups, d=d, visible=visible, fmt="sbhd", normalization="RMSNorm",
                   activation="swiglu", freqs=freqs)
    _check_grads(layer, p64, x, x64, out, ref, atol=2e-4, rtol=2e-4)


def test_transformer_layer_hidden_dropout_streams():
    """Training forward n uses offsets 2n (attention residual) and 2n + 1 (MLP residual) of the
    hidden-dropout stream: equal to the float64 layer with those NumPy Philox masks; eval is the
    dropout-free layer; resetting the state replays."""
    heads, d, ffn, s, b, p = 2, 8, 16, 6, 3, 0.25
    layer = tep.TransformerLayer(heads * d, ffn, heads, hidden_dropout=p, attention_dropout=0.0, seed=11,
                                 attn_input_format="bshd")
    _randomize(layer, 6)
    p64 = _params64(layer)
    visible = torch.from_numpy(visible_ref("causal", None, s, s, batch=b))
    x = torch.randn(b, s, heads * d, generator=torch.Generator().manual_seed(7))
    outs = []
    for step in range(2):
        xs = x.clone().requires_grad_()
        x64 = x.double().requires_grad_()
        out = layer(xs)
        ref = _layer64(x64, p64, heads=heads, groups=heads, d=d, visible=visible, fmt="bshd",
                       normalization="LayerNorm", activation="gelu", hidden_dropout=p, seed=11, offset=2 * step)
        _check_grads(layer, p64, xs, x64, out, ref, atol=2e-4, rtol=2e-4)
        for t in list(layer.parameters()) + list(p64.values()):
            t.grad = None
        outs.append(out.detach())
        assert layer.hidden_dropout_op.rng_state.tolist() == [11, 2 * step + 2]
    assert not torch.equal(outs[0], outs[1])
    layer.hidden_dropout_op.rng_state[1] = 0
    assert torch.equal(layer(x), outs[0])
    layer.eval()
    ref = _layer64(x.double(), p64, heads=heads, groups=heads, d=d, visible=visible, fmt="bshd",
                   normalization="LayerNorm", activation="gelu")
    torch.testing.assert_close(layer(x).double(), ref.detach(), atol=2e-4, rtol=2e-4)


def test_transformer_layer_attention_dropout_uses_its_own_stream():
    layer = tep.TransformerLayer(16, 16, 2, hidden_dropout=0.0, attention_dropout=0.5, seed=3,
                                 attn_input_format="bshd")
    x = torch.randn(2, 5, 16)
    a = layer(x)
    assert layer.self_attention.core_attention.rng_state.tolist() == [3, 1]
    assert layer.hidden_dropout_op.rng_state.tolist() == [3, 0]
    assert not torch.equal(a, layer(x))
    layer.self_attention.core_attention.rng_state[1] = 0
    assert torch.equal(a, layer(x))


TE_LAYER_PARAMS = (["self_attention." + n for n in TE_MHA_PARAMS[True]]
                   + ["layernorm_mlp." + n for n in ("layer_norm_weight", "layer_norm_bias", "fc1_weight",
                                                     "fc1_bias", "fc2_weight", "fc2_bias")])


def test_transformer_layer_parameter_names_are_te():
    layer = tep.TransformerLayer(32, 64, 4, num_gqa_groups=1, activation="swiglu")
    names = [n for n, _ in layer.named_parameters()]
    assert sorted(names) == sorted(TE_LAYER_PARAMS)
    assert tuple(layer.self_attention.layernorm_qkv.weight.shape) == ((4 + 2) * 8, 32)
    assert tuple(layer.layernorm_mlp.fc1_weight.shape) == (128, 32)
    assert set(names) <= set(layer.state_dict())


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_gqa_groups=3), r"num_attention_heads \(4\) must be divisible by num_gqa_groups \(3\)"),
    (dict(hidden_dropout=1.0), r"p must be a float in \[0, 1\)"),
    (dict(activation="tanh"), "activation must be one of"),
    (dict(normalization="ScaleNorm"), "normalization must be"),
    (dict(attn_input_format="bhsd"), "qkv_format must be"),
    (dict(self_attn_mask_type="causal", window_size=(2, 2)), "contradicts mask_type 'causal'"),
])
def test_transformer_layer_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match="twinengine.*" + match):
        tep.TransformerLayer(32, 64, 4, **kwargs)


# ---- recipes, torch.compile ------------------------------------------------------------------

RECIPES = {
    "high_precision": None,
    "fp8_delayed": te.recipe.DelayedScaling(amax_history_len=4),
    "fp8_delayed_dpa": te.recipe.DelayedScaling(amax_history_len=4, fp8_dpa=True),
    "fp8_current_mha": te.recipe.Float8CurrentScaling(fp8_mha=True),
    "mxfp8": te.recipe.MXFP8BlockScaling(),
    "fp8_block": te.recipe.Float8BlockScaling(),
    "nvfp4": te.recipe.NVFP4BlockScaling(),
}


def _step(layer, x, recipe):
    with tep.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext():
        return layer(x)


_COMPILED_STEP = torch.compile(_step, fullgraph=True, backend="aot_eager")


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_transformer_layer_recipes_compiled_equals_eager(recipe_name):
    """Every recipe (and FP8 attention): eager and compiled give the same bytes, output, input and
    parameter gradients and buffers, over two steps (DelayedScaling state moves)."""
    recipe = RECIPES[recipe_name]
    dtype = torch.bfloat16 if recipe_name == "nvfp4" else torch.float32
    torch.manual_seed(0)
    layer = tep.TransformerLayer(128, 128, 4, num_gqa_groups=2, hidden_dropout=0.1, attention_dropout=0.1,
                                 activation="swiglu", normalization="RMSNorm", attn_input_format="sbhd",
                                 params_dtype=dtype, amax_history_len=4)
    _randomize(layer, 8)
    x = torch.randn(64, 2, 128, generator=torch.Generator().manual_seed(3)).to(dtype)
    dy = torch.randn(64, 2, 128, generator=torch.Generator().manual_seed(4)).to(dtype)
    runs = []
    for fn, mod in ((_step, layer), (_COMPILED_STEP, copy.deepcopy(layer))):
        got = []
        for _ in range(2):
            xs = x.clone().requires_grad_()
            for t in mod.parameters():
                t.grad = None
            y = fn(mod, xs, recipe)
            y.backward(dy)
            got += [y.detach(), xs.grad] + [t.grad for t in mod.parameters()] + [t.clone() for t in mod.buffers()]
        runs.append(got)
    assert torch.isfinite(runs[0][0].float()).all()
    for i, (a, b) in enumerate(zip(*runs)):
        assert_bytes_equal(b.view(torch.uint8).numpy() if b.dtype == torch.bfloat16 else b.numpy(),
                           a.view(torch.uint8).numpy() if a.dtype == torch.bfloat16 else a.numpy(),
                           f"{recipe_name} tensor {i}")


def test_transformer_layer_compile_dynamic_sequence_no_recompile():
    """torch.compile(fullgraph=True) (inductor) of forward + backward with rotary embeddings, the
    sequence dimension dynamic: new lengths reuse the graph and equal eager bytes."""
    layer = tep.TransformerLayer(32, 48, 4, num_gqa_groups=2, hidden_dropout=0.0, attention_dropout=0.0,
                                 attn_input_format="bshd")
    _randomize(layer, 9)

    compiled = torch.compile(layer, fullgraph=True)
    freqs = tep.RotaryPositionEmbedding(8)(80)

    def step(fn, x, dy):
        y = fn(x, rotary_pos_emb=freqs)
        return (y, *torch.autograd.grad(y, (x, *layer.parameters()), dy))

    for i, s in enumerate((5, 70, 33)):
        x = torch.randn(2, s, 32, generator=torch.Generator().manual_seed(s)).requires_grad_()
        dy = torch.randn(2, s, 32, generator=torch.Generator().manual_seed(s + 1))
        torch._dynamo.mark_dynamic(x, 1)
        with no_recompiles() if i else contextlib.nullcontext():
            got = step(compiled, x, dy)
        want = step(layer, x, dy)
        for j, (a, b) in enumerate(zip(got, want)):
            assert_bytes_equal(a.detach().numpy(), b.detach().numpy(), f"s={s} tensor {j}")


@pytest.mark.parametrize("recipe_name", ["fp8_delayed_dpa", "nvfp4"])
@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_transformer_layer_activation_checkpointing_same_bytes(recipe_name, mode):
    """torch.utils.checkpoint around the layer (hidden and attention dropout, stateful recipes:
    delayed scaling with FP8 attention, NVFP4 stochastic rounding): output, gradients and every
    buffer equal the run without checkpointing, over two steps."""
    from torch.utils.checkpoint import checkpoint

    recipe = RECIPES[recipe_name]
    dtype = torch.bfloat16 if recipe_name == "nvfp4" else torch.float32

    def run(checkpointed):
        torch.manual_seed(0)
        layer = tep.TransformerLayer(128, 128, 4, num_gqa_groups=2, hidden_dropout=0.1, attention_dropout=0.1,
                                     attn_input_format="bshd", params_dtype=dtype, amax_history_len=4, seed=3)
        out = []
        for step in range(2):
            x = torch.randn(2, 64, 128, generator=torch.Generator().manual_seed(step)).to(dtype).requires_grad_()
            layer.zero_grad()
            with tep.autocast(recipe):
                y = checkpoint(layer, x, use_reentrant=mode == "reentrant") if checkpointed else layer(x)
            y.float().square().sum().backward()
            out += [y.detach(), x.grad] + [t.grad for t in layer.parameters()] + [t.clone() for t in layer.buffers()]
        return out

    for i, (a, b) in enumerate(zip(run(True), run(False))):
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.uint8) if b.dtype == torch.bfloat16 else b), f"tensor {i}"


_COMPILED_CALL = torch.compile(lambda module, x, kw: module(x, **kw), fullgraph=True, backend="aot_eager")

COMPILE_CASES = [
    # (fmt, mask_type, window); padding types get an attention_mask, thd cu_seqlens
    ("bshd", "padding", None),
    ("sbhd", "padding_causal", None),
    ("bshd", "causal_bottom_right", None),
    ("sbhd", "no_mask", (3, 2)),
    ("thd", "padding_causal", None),
]


@pytest.mark.parametrize("case", COMPILE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-w{c[2]}")
def test_multihead_attention_compiled_equals_eager(case):
    """torch.compile(fullgraph=True) forward + backward of MultiheadAttention for each mask type
    and layout (padding via attention_mask, thd via cu_seqlens, GQA, rotary, attention dropout):
    the same bytes as eager."""
    fmt, mask_type, window = case
    heads, groups, d, b, s = 4, 2, 8, 2, 10
    mha = tep.MultiheadAttention(heads * d, heads, num_gqa_groups=groups, attention_dropout=0.2, input_layernorm=True,
                                 attn_mask_type=mask_type, window_size=window, qkv_format=fmt, seed=4)
    _randomize(mha, 15)
    kw = {"rotary_pos_emb": tep.RotaryPositionEmbedding(d)(32)}
    if fmt == "thd":
        cu = torch.tensor([0, 7, 7, 19], dtype=torch.int32)
        kw.update(cu_seqlens_q=cu, cu_seqlens_kv=cu)
        shape = (19, heads * d)
    else:
        shape = (b, s, heads * d) if fmt == "bshd" else (s, b, heads * d)
        if "padding" in mask_type:
            kw["attention_mask"] = _lens_mask((10, 6), s)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(16))
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(17))
    runs = []
    for fn, module in ((lambda m, v, k: m(v, **k), mha), (_COMPILED_CALL, copy.deepcopy(mha))):
        xs = x.clone().requires_grad_()
        y = fn(module, xs, kw)
        y.backward(dy)
        runs.append([y.detach(), xs.grad] + [t.grad for t in module.parameters()]
                    + [t.clone() for t in module.buffers()])
    for i, (a, b_) in enumerate(zip(*runs)):
        assert_bytes_equal(a.numpy(), b_.numpy(), f"{case} tensor {i}")

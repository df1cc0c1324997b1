"""Flax MultiHeadAttention / TransformerLayer: parameter tree (torch names), jit + grad + vmap,
forward and gradients vs a float64 plain-jnp reference (tolerance) for LayerNorm / RMSNorm, GQA,
rotary, gated activations, sbhd / bshd / thd; dropout with explicit rngs; the functional forms;
params_from_torch / params_to_torch nesting; bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import twinengine.jax as tej
from twinengine.jax.flax import MultiHeadAttention, TransformerLayer

HIDDEN, FFN, HEADS = 32, 48, 4


def _x(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _init(module, x, seed=0, **kw):
    params = module.init(jax.random.PRNGKey(seed), x, **kw)["params"]
    # non-trivial norm gains / biases so that the reference checks every parameter
    rng = np.random.default_rng(seed + 100)
    return jax.tree_util.tree_map(lambda a: a + jnp.asarray(rng.standard_normal(a.shape) * 0.1, a.dtype), params)


# ---- float64 reference (plain jnp under jax.enable_x64) ----------------------------------------

def _norm(x, p, normalization, eps):
    w = p["layer_norm_weight"]
    if normalization == "RMSNorm":
        return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w
    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * w + p["layer_norm_bias"]


def _act(h, activation):
    def gelu(v):
        return 0.5 * v * (1.0 + jnp.tanh(0.7978845608 * v * (1.0 + 0.044715 * v * v)))

    if activation == "gelu":
        return gelu(h)
    a, b = jnp.split(h, 2, axis=-1)
    return (a * jax.nn.sigmoid(a)) * b if activation == "swiglu" else gelu(a) * b


def _rope(t, freqs):
    f = freqs[: t.shape[0], 0, 0, :]  # sbhd: (s, d2)
    d2 = f.shape[-1]
    shape = (t.shape[0],) + (1,) * (t.ndim - 2) + (d2,)
    c, s = jnp.cos(f).reshape(shape), jnp.sin(f).reshape(shape)
    r, rest = t[..., :d2], t[..., d2:]
    rot = jnp.concatenate([-r[..., d2 // 2:], r[..., : d2 // 2]], -1)
    return jnp.concatenate([r * c + rot * s, rest], -1)


def _reference(x, p, *, heads, groups, normalization="LayerNorm", activation="gelu", freqs=None, eps=1e-5,
               fmt="sbhd", causal=True):
    """TransformerLayer in float64; x (s, b, hidden) or (b, s, hidden)."""
    if fmt == "bshd":
        x = jnp.swapaxes(x, 0, 1)
    a = p["self_attention"]
    ln = _norm(x, a["layernorm_qkv"], normalization, eps)
    qkv = ln @ a["layernorm_qkv"]["weight"].T + a["layernorm_qkv"]["bias"]
    s, b, _ = x.shape
    d = qkv.shape[-1] // (heads + 2 * groups)
    q = qkv[..., : heads * d].reshape(s, b, heads, d)
    k = qkv[..., heads * d: (heads + groups) * d].reshape(s, b, groups, d)
    v = qkv[..., (heads + groups) * d:].reshape(s, b, groups, d)
    if freqs is not None:
        q, k = _rope(q, freqs), _rope(k, freqs)
    k = jnp.repeat(k, heads // groups, axis=2)
    v = jnp.repeat(v, heads // groups, axis=2)
    scores = jnp.einsum("sbhd,tbhd->bhst", q, k) / np.sqrt(d)
    if causal:
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
    ctx = jnp.einsum("bhst,tbhd->sbhd", jax.nn.softmax(scores, -1), v).reshape(s, b, heads * d)
    x1 = x + ctx @ a["proj"]["weight"].T + a["proj"]["bias"]
    m = p["layernorm_mlp"]
    h = _norm(x1, m, normalization, eps) @ m["fc1_weight"].T + m["fc1_bias"]
    out = x1 + _act(h, activation) @ m["fc2_weight"].T + m["fc2_bias"]
    return jnp.swapaxes(out, 0, 1) if fmt == "bshd" else out


CASES = {
    "layernorm_gelu": dict(),
    "rmsnorm_swiglu_gqa_rotary": dict(normalization="RMSNorm", activation="swiglu", num_gqa_groups=2, rotary=True),
    "mqa_partial_rotary_bshd": dict(num_gqa_groups=1, rotary=True, rotary_percent=0.5, fmt="bshd"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_transformer_layer_matches_float64_reference(name):
    c = dict(CASES[name])
    fmt = c.pop("fmt", "sbhd")
    rotary, percent = c.pop("rotary", False), c.pop("rotary_percent", 1.0)
    module = TransformerLayer(hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
                              attn_input_format=fmt, **c)
    s, b = 10, 3
    x = _x((s, b, HIDDEN) if fmt == "sbhd" else (b, s, HIDDEN), seed=1)
    dy = _x(x.shape, seed=2)
    freqs = tej.RotaryPositionEmbedding(HIDDEN // HEADS, rotary_percent=percent)(s) if rotary else None
    params = _init(module, x)

    def loss(p, v):
        return jnp.sum(module.apply({"params": p}, v, rotary_pos_emb=freqs) * dy)

    out = jax.jit(lambda p, v: module.apply({"params": p}, v, rotary_pos_emb=freqs))(params, x)
    gp, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
    with jax.enable_x64(True):
        p64 = jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a), jnp.float64), params)
        x64, dy64 = jnp.asarray(np.asarray(x), jnp.float64), jnp.asarray(np.asarray(dy), jnp.float64)
        f64 = None if freqs is None else jnp.asarray(np.asarray(freqs), jnp.float64)
        kw = dict(heads=HEADS, groups=c.get("num_gqa_groups") or HEADS, normalization=c.get("normalization", "LayerNorm"),
                  activation=c.get("activation", "gelu"), freqs=f64, fmt=fmt)
        want = np.asarray(jax.jit(lambda p, v: _reference(v, p, **kw))(p64, x64))
        wp, wx = jax.jit(jax.grad(lambda p, v: jnp.sum(_reference(v, p, **kw) * dy64), argnums=(0, 1)))(p64, x64)
        wp = jax.tree_util.tree_map(np.asarray, wp)
        wx = np.asarray(wx)

    def close(got, ref, what):
        got = np.asarray(got, np.float64)
        err = np.max(np.abs(got - ref)) / max(1.0, np.max(np.abs(ref)))
        assert err < 2e-5, f"{what}: {err}"

    close(out, want, "out")
    close(gx, wx, "dx")
    for path, g in jax.tree_util.tree_leaves_with_path(gp):
        ref = wp
        for key in path:
            ref = ref[key.key]
        close(g, ref, jax.tree_util.keystr(path))


def test_parameter_tree_has_torch_names_and_round_trips():
    module = TransformerLayer(hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS, num_gqa_groups=2,
                              normalization="RMSNorm", activation="swiglu")
    params = _init(module, _x((5, 2, HIDDEN)))
    d = HIDDEN // HEADS
    assert params["self_attention"]["layernorm_qkv"]["weight"].shape == ((HEADS + 2 * 2) * d, HIDDEN)
    assert set(params["self_attention"]["layernorm_qkv"]) == {"layer_norm_weight", "weight", "bias"}
    assert set(params["self_attention"]["proj"]) == {"weight", "bias"}
    assert params["layernorm_mlp"]["fc1_weight"].shape == (2 * FFN, HIDDEN)
    flat = tej.params_to_torch(params)
    assert "self_attention.layernorm_qkv.layer_norm_weight" in flat and "layernorm_mlp.fc2_bias" in flat
    flat["self_attention.proj.fwd_amax_history"] = flat["self_attention.proj.weight"]  # buffers are dropped
    flat["layernorm_mlp.basic_ops.1.rng_state"] = flat["self_attention.proj.weight"]
    back = tej.params_from_torch(flat)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_transformer_layer_vmap_equals_loop_and_functional_form():
    module = TransformerLayer(hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS)
    xs = _x((3, 7, 2, HIDDEN), seed=5)
    params = _init(module, xs[0])
    freqs = tej.RotaryPositionEmbedding(8)(7)
    got = jax.jit(jax.vmap(lambda v: module.apply({"params": params}, v, rotary_pos_emb=freqs)))(xs)
    for i in range(3):
        one = tej.transformer_layer(xs[i], params, rotary_pos_emb=freqs, hidden_size=HIDDEN, ffn_hidden_size=FFN,
                                    num_attention_heads=HEADS)
        assert np.array_equal(np.asarray(got[i]), np.asarray(one)), i


def test_thd_with_cu_seqlens_equals_separate_sequences():
    """thd packing: each sequence gives the bytes of its own bshd call (attention and rope restart)."""
    kw = dict(hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS, num_gqa_groups=2)
    thd = TransformerLayer(attn_input_format="thd", self_attn_mask_type="padding_causal", **kw)
    bshd = TransformerLayer(attn_input_format="bshd", self_attn_mask_type="causal", **kw)
    x = _x((11, HIDDEN), seed=7)
    cu = jnp.asarray([0, 4, 11], jnp.int32)
    params = _init(bshd, x[None, :4])
    freqs = tej.RotaryPositionEmbedding(8)(8)
    packed = thd.apply({"params": params}, x, rotary_pos_emb=freqs, cu_seqlens_q=cu)
    for a, b in ((0, 4), (4, 11)):
        alone = bshd.apply({"params": params}, x[None, a:b], rotary_pos_emb=freqs)[0]
        np.testing.assert_allclose(np.asarray(packed[a:b]), np.asarray(alone), rtol=0, atol=2e-6)


def test_dropout_uses_explicit_rngs():
    module = TransformerLayer(hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS, hidden_dropout=0.2,
                              attention_dropout=0.1)
    x = _x((6, 2, HIDDEN), seed=3)
    params = _init(module, x)
    rngs = {name: jnp.asarray([i + 1, 7], jnp.uint32) for i, name in enumerate(("attention", "attention_hidden",
                                                                                  "mlp_hidden"))}
    apply = jax.jit(lambda r: module.apply({"params": params}, x, deterministic=False, dropout_rngs=r))
    a, b = apply(rngs), apply(rngs)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    det = module.apply({"params": params}, x)
    assert not np.array_equal(np.asarray(a), np.asarray(det))
    other = dict(rngs, mlp_hidden=jnp.asarray([9, 7], jnp.uint32))
    assert not np.array_equal(np.asarray(apply(other)), np.asarray(a))
    # From the "dropout" stream when no rngs are given.
    c = module.apply({"params": params}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(0)})
    assert c.shape == x.shape and not np.array_equal(np.asarray(c), np.asarray(det))


def test_multi_head_attention_without_input_layernorm_uses_qkv():
    module = MultiHeadAttention(hidden_size=HIDDEN, num_attention_heads=HEADS, input_layernorm=False,
                                attention_dropout=0.0, qkv_format="bshd")
    x = _x((2, 5, HIDDEN))
    params = module.init(jax.random.PRNGKey(0), x)["params"]
    assert set(params) == {"qkv", "proj"} and set(params["qkv"]) == {"weight", "bias"}
    out = tej.multi_head_attention(x, params, hidden_size=HIDDEN, num_attention_heads=HEADS, input_layernorm=False,
                                   qkv_format="bshd")
    assert np.array_equal(np.asarray(out), np.asarray(module.apply({"params": params}, x)))


def test_bad_head_counts():
    module = TransformerLayer(hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS, num_gqa_groups=3)
    with pytest.raises(ValueError, match=r"twinengine.MultiheadAttention: num_attention_heads \(4\) must be divisible "
                                         r"by num_gqa_groups \(3\)"):
        module.init(jax.random.PRNGKey(0), _x((4, 1, HIDDEN)))

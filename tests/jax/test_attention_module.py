"""tej.dot_product_attention (custom_vjp): bytes == tep.DotProductAttention fwd+bwd, jit + grad + vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import twinengine.jax as tej
import twinengine.pytorch as tep


@pytest.mark.parametrize("mask_type,hk,s", [("causal", 2, 70), ("no_mask", 4, 1), ("causal_bottom_right", 1, 9)])
def test_jax_equals_torch_fwd_bwd(mask_type, hk, s):
    rs = np.random.RandomState(s)
    b, h, d = 2, 4, 8
    q, g = (rs.randn(b, s, h, d).astype(np.float32) for _ in range(2))
    k, v = (rs.randn(b, s, hk, d).astype(np.float32) for _ in range(2))

    def loss(q, k, v):
        out = tej.dot_product_attention(q, k, v, attn_mask_type=mask_type)
        return jnp.sum(out * g), out

    (_, out_j), grads_j = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    qt, kt, vt = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    out_t = tep.DotProductAttention(h, d, num_gqa_groups=hk, attn_mask_type=mask_type)(qt, kt, vt)
    out_t.backward(torch.tensor(g).reshape(out_t.shape))
    np.testing.assert_array_equal(np.asarray(out_j).reshape(b, s, h * d), out_t.detach().numpy())
    for a, t in zip(grads_j, (qt, kt, vt)):
        np.testing.assert_array_equal(np.asarray(a), t.grad.numpy())


def test_vmap_grad_and_errors():
    rs = np.random.RandomState(0)
    q = rs.randn(3, 1, 5, 2, 8).astype(np.float32)
    f = lambda x: jnp.sum(tej.dot_product_attention(x, x, x) ** 2)  # noqa: E731
    gv = jax.jit(jax.vmap(jax.grad(f)))(q)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(gv[i]), np.asarray(jax.grad(f)(q[i])))
    with pytest.raises(ValueError):
        tej.dot_product_attention(q[0, 0], q[0, 0], q[0, 0], qkv_format="thd")
    with pytest.raises(ValueError):
        tej.dot_product_attention(q[0], q[0], q[0], window_size=(2, 2))


def test_thd_cu_seqlens_bytes_and_same_error_text():
    rs = np.random.RandomState(3)
    h, d = 2, 8
    cu = np.array([0, 3, 10, 11], dtype=np.int32)
    q, k, v, g = (rs.randn(11, h, d).astype(np.float32) for _ in range(4))

    def loss(q, k, v):
        out = tej.dot_product_attention(q, k, v, attn_mask_type="padding_causal", qkv_format="thd",
                                        cu_seqlens_q=cu, cu_seqlens_kv=cu)
        return jnp.sum(out * g), out

    (_, out_j), grads_j = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    qt, kt, vt = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    mod = tep.DotProductAttention(h, d, attn_mask_type="padding_causal", qkv_format="thd")
    cut = torch.tensor(cu)
    out_t = mod(qt, kt, vt, cu_seqlens_q=cut, cu_seqlens_kv=cut)
    out_t.backward(torch.tensor(g).reshape(out_t.shape))
    np.testing.assert_array_equal(np.asarray(out_j).reshape(11, h * d), out_t.detach().numpy())
    for a, t in zip(grads_j, (qt, kt, vt)):
        np.testing.assert_array_equal(np.asarray(a), t.grad.numpy())
    # bad input: same text from the core checks in both frontends
    bad = [dict(qkv_format="thd"), dict(window_size=(2, 2))]
    for kw in bad:
        x = q if kw.get("qkv_format") == "thd" else q[None]
        with pytest.raises(ValueError) as ej:
            tej.dot_product_attention(x, x, x, **kw)
        with pytest.raises(ValueError) as et:
            tep.DotProductAttention(h, d, **kw)(torch.tensor(x), torch.tensor(x), torch.tensor(x))
        assert str(ej.value) == str(et.value)
    kq = rs.randn(1, 4, 3, d).astype(np.float32)
    kk = rs.randn(1, 4, 2, d).astype(np.float32)
    with pytest.raises(ValueError) as ej:
        tej.dot_product_attention(kq, kk, kk)
    with pytest.raises(ValueError) as et:
        tep.DotProductAttention(3, d, num_gqa_groups=3)(torch.tensor(kq), torch.tensor(kk), torch.tensor(kk))
    assert str(ej.value) == str(et.value) and "divisible" in str(ej.value)


def test_flax_dot_product_attention_dropout_rng():
    from twinengine.jax.flax import DotProductAttention
    rs = np.random.RandomState(4)
    q = rs.randn(1, 8, 2, 8).astype(np.float32)
    m = DotProductAttention(head_dim=8, num_attention_heads=2, attention_dropout=0.5)
    v = m.init(jax.random.PRNGKey(0), q, q, q)
    a = m.apply(v, q, q, q, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
    b = m.apply(v, q, q, q, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
    c = m.apply(v, q, q, q, deterministic=False, rngs={"dropout": jax.random.PRNGKey(2)})
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(c))
    rng = np.array([7, 0], np.uint32)
    d = m.apply(v, q, q, q, deterministic=False, rng=rng)
    mod = tep.DotProductAttention(2, 8, attention_dropout=0.5, seed=7)
    np.testing.assert_array_equal(np.asarray(d).reshape(1, 8, 16), mod(*(torch.tensor(q),) * 3).detach().numpy())
    np.testing.assert_array_equal(np.asarray(m.apply(v, q, q, q)), np.asarray(tej.dot_product_attention(q, q, q)))


@pytest.mark.parametrize("recipe_name", ["DelayedScaling", "Float8CurrentScaling"])
def test_fp8_dpa_recipe_selects_fp8_attention_in_both_modules(recipe_name):
    """Under autocast(recipe with fp8_dpa=True) both modules run FP8 attention (docs/attention.md
    §9): the bytes of attention_fwd/_bwd(fp8=True), torch == JAX; without the flag, high precision."""
    import twinengine as te
    from twinengine.pytorch._ops.attention import attention_bwd, attention_fwd
    rs = np.random.RandomState(11)
    b, s, h, d = 2, 33, 2, 16
    q, k, v, g = (rs.randn(b, s, h, d).astype(np.float32) for _ in range(4))
    recipe = getattr(te.recipe, recipe_name)(fp8_dpa=True)

    def loss(q, k, v):
        out = tej.dot_product_attention(q, k, v, attn_mask_type="causal")
        return jnp.sum(out * g), out

    with tej.autocast(recipe):
        (_, out_j), grads_j = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    qt, kt, vt = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    with tep.autocast(recipe):
        out_t = tep.DotProductAttention(h, d, attn_mask_type="causal")(qt, kt, vt)
    out_t.backward(torch.tensor(g).reshape(out_t.shape))
    out_ref, lse = attention_fwd(*(torch.tensor(x) for x in (q, k, v)), mask_type="causal", fp8=True)
    dq, dk, dv = attention_bwd(torch.tensor(g), *(torch.tensor(x) for x in (q, k, v)), out_ref, lse,
                               mask_type="causal", fp8=True)
    np.testing.assert_array_equal(out_t.detach().numpy(), out_ref.reshape(b, s, h * d).numpy())
    np.testing.assert_array_equal(np.asarray(out_j), out_ref.numpy())
    for a, t, r in zip(grads_j, (qt, kt, vt), (dq, dk, dv)):
        np.testing.assert_array_equal(t.grad.numpy(), r.numpy())
        np.testing.assert_array_equal(np.asarray(a), r.numpy())
    hp, _ = attention_fwd(*(torch.tensor(x) for x in (q, k, v)), mask_type="causal")
    assert not torch.equal(hp, out_ref)  # FP8 attention really differs from high precision

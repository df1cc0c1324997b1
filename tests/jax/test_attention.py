"""JAX attention ops: exact bytes vs the fp32 emulation of docs/attention.md, jit == eager, vmap ==
per-element calls."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import BY_NAME
from helpers import assert_bytes_equal
from reference import attention as ref

from twinengine.jax._ops import attention as ja


def _jax_kwargs(kw: dict) -> dict:
    return {name: (jnp.asarray(value) if isinstance(value, np.ndarray) else value) for name, value in kw.items()}


@pytest.mark.parametrize("name", ["causal_gqa", "padding_causal_bottom_right", "sliding_window", "dropout", "bf16",
                                  "sbhd_gqa_padding"])
def test_attention_matches_emulation_bytes(name):
    case = BY_NAME[name]
    a = case.inputs(seed=1)
    jkw = _jax_kwargs(case.kwargs())
    out, lse = ja.attention_fwd(a["q"], a["k"], a["v"], **jkw)
    b = {n: case.layout(x) for n, x in a.items()}  # bshd for the reference
    kw = case.ref_kwargs()
    want_out, want_lse = ref.attention_fwd_emul(b["q"], b["k"], b["v"], **kw)
    assert_bytes_equal(np.asarray(out), case.layout(want_out), f"{name} out")
    assert_bytes_equal(np.asarray(lse), want_lse, f"{name} lse")
    grads = ja.attention_bwd(jnp.asarray(a["dout"]), jnp.asarray(a["q"]), jnp.asarray(a["k"]), jnp.asarray(a["v"]),
                             out, lse, **jkw)
    want = ref.attention_bwd_emul(b["dout"], b["q"], b["k"], b["v"], case.layout(np.asarray(out)), np.asarray(lse),
                                  **kw)
    for grad_name, got, expect in zip(("dq", "dk", "dv"), grads, want, strict=True):
        assert_bytes_equal(np.asarray(got), case.layout(expect), f"{name} {grad_name}")


def _fwd_bwd(q, k, v, dout, seqlens_kv, rng):
    kw = dict(mask_type="padding_causal_bottom_right", seqlens_kv=seqlens_kv, dropout_p=0.125, rng=rng)
    out, lse = ja.attention_fwd(q, k, v, **kw)
    return (out, lse) + tuple(ja.attention_bwd(dout, q, k, v, out, lse, **kw))


def _inputs(lead=()):
    r = np.random.default_rng(7)
    shapes = ((2, 20, 4, 8), (2, 30, 2, 8), (2, 30, 2, 8), (2, 20, 4, 8))
    return [jnp.asarray(r.standard_normal(lead + s).astype(np.float32)) for s in shapes]


def test_attention_jit_matches_eager():
    q, k, v, dout = _inputs()
    lens, rng = jnp.asarray([30, 9], jnp.int32), jnp.asarray([3, 4], jnp.uint32)
    eager = _fwd_bwd(q, k, v, dout, lens, rng)
    jitted = jax.jit(_fwd_bwd)(q, k, v, dout, lens, rng)
    for i, (a, b) in enumerate(zip(jitted, eager, strict=True)):
        assert_bytes_equal(np.asarray(a), np.asarray(b), f"jit vs eager output {i}")


def test_attention_vmap_matches_per_element_calls():
    q, k, v, dout = _inputs(lead=(3,))
    lens = jnp.asarray([[30, 9], [0, 30], [12, 1]], jnp.int32)
    rng = jnp.asarray([[3, 4], [5, 6], [7, 8]], jnp.uint32)
    batched = jax.jit(jax.vmap(_fwd_bwd))(q, k, v, dout, lens, rng)
    for n in range(3):
        single = _fwd_bwd(q[n], k[n], v[n], dout[n], lens[n], rng[n])
        for i, (a, b) in enumerate(zip(batched, single, strict=True)):
            assert_bytes_equal(np.asarray(a[n]), np.asarray(b), f"vmap element {n} output {i}")


def test_attention_seqlens_out_of_range_raise():
    q = jnp.zeros((2, 5, 2, 8), jnp.float32)
    with pytest.raises(Exception, match=r"seqlens_q\[0\] = 7 is outside \[0, 5\]"):
        jax.block_until_ready(ja.attention_fwd(q, q, q, mask_type="padding_causal",
                                               seqlens_q=jnp.asarray([7, 1], jnp.int32)))


def test_attention_thd_jit_matches_eager():
    r = np.random.default_rng(11)
    q, k, v, dout = (jnp.asarray(r.standard_normal(s).astype(np.float32)) for s in
                     ((40, 4, 8), (50, 2, 8), (50, 2, 8), (40, 4, 8)))
    cu_q, cu_kv = jnp.asarray([0, 15, 38], jnp.int32), jnp.asarray([0, 25, 50], jnp.int32)

    def fwd_bwd(q, k, v, dout, cu_q, cu_kv):
        kw = dict(mask_type="padding_causal_bottom_right", qkv_format="thd", cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
        out, lse = ja.attention_fwd(q, k, v, **kw)
        return (out, lse) + tuple(ja.attention_bwd(dout, q, k, v, out, lse, **kw))

    eager = fwd_bwd(q, k, v, dout, cu_q, cu_kv)
    jitted = jax.jit(fwd_bwd)(q, k, v, dout, cu_q, cu_kv)
    assert eager[0].shape == (40, 4, 8) and eager[1].shape == (4, 40)
    for i, (a, b) in enumerate(zip(jitted, eager, strict=True)):
        assert_bytes_equal(np.asarray(a), np.asarray(b), f"thd jit vs eager output {i}")

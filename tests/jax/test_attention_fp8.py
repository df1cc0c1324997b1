"""FP8 attention (docs/attention.md §9) in the JAX frontend: exact bytes vs the NumPy emulation,
jit == eager, vmap == per-element calls."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import BY_NAME, THD_CASES
from helpers import assert_bytes_equal
from reference import attention as ref

from twinengine.jax._ops import attention as ja


def _jax_kwargs(kw: dict) -> dict:
    return {name: (jnp.asarray(value) if isinstance(value, np.ndarray) else value) for name, value in kw.items()}


@pytest.mark.parametrize("name", ["causal_gqa", "padding_causal_bottom_right", "sliding_window", "dropout", "bf16",
                                  "sbhd_gqa_padding", "causal_bottom_right_mqa"])
def test_attention_fp8_matches_emulation_bytes(name):
    case = BY_NAME[name]
    a = case.inputs(seed=1)
    jkw = _jax_kwargs(case.kwargs())
    out, lse = ja.attention_fwd(a["q"], a["k"], a["v"], **jkw, fp8=True)
    b = {n: case.layout(x) for n, x in a.items()}  # bshd for the reference
    kw = case.ref_kwargs()
    want_out, want_lse = ref.attention_fp8_fwd_emul(b["q"], b["k"], b["v"], **kw)
    assert_bytes_equal(np.asarray(out), case.layout(want_out), f"{name} out")
    assert_bytes_equal(np.asarray(lse), want_lse, f"{name} lse")
    grads = ja.attention_bwd(jnp.asarray(a["dout"]), jnp.asarray(a["q"]), jnp.asarray(a["k"]), jnp.asarray(a["v"]),
                             out, lse, **jkw, fp8=True)
    want = ref.attention_fp8_bwd_emul(b["dout"], b["q"], b["k"], b["v"], case.layout(np.asarray(out)),
                                      np.asarray(lse), **kw)
    for grad_name, got, expect in zip(("dq", "dk", "dv"), grads, want, strict=True):
        assert_bytes_equal(np.asarray(got), case.layout(expect), f"{name} {grad_name}")


def test_attention_fp8_thd_matches_emulation_bytes():
    case = THD_CASES[0]
    a, kw = case.inputs(seed=2), case.kwargs()
    jkw = _jax_kwargs(kw)
    out, lse = ja.attention_fwd(a["q"], a["k"], a["v"], **jkw, fp8=True)
    vis = ref.visible_thd_ref(case.mask_type, case.window_size, case.cu_q, case.cu_kv, case.t_q, case.t_kv)
    rkw = {"mask_type": case.mask_type, "dropout_p": case.dropout_p, "rng": kw.get("rng"), "visible": vis}
    b = {n: x[None] for n, x in a.items()}
    want_out, want_lse = ref.attention_fp8_fwd_emul(b["q"], b["k"], b["v"], **rkw)
    assert_bytes_equal(np.asarray(out), want_out[0], "thd out")
    assert_bytes_equal(np.asarray(lse), want_lse[0], "thd lse")
    grads = ja.attention_bwd(jnp.asarray(a["dout"]), jnp.asarray(a["q"]), jnp.asarray(a["k"]), jnp.asarray(a["v"]),
                             out, lse, **jkw, fp8=True)
    want = ref.attention_fp8_bwd_emul(b["dout"], b["q"], b["k"], b["v"], np.asarray(out)[None],
                                      np.asarray(lse)[None], **rkw)
    for grad_name, got, expect in zip(("dq", "dk", "dv"), grads, want, strict=True):
        assert_bytes_equal(np.asarray(got), expect[0], f"thd {grad_name}")


def _fwd_bwd(q, k, v, dout, seqlens_kv, rng):
    kw = dict(mask_type="padding_causal_bottom_right", seqlens_kv=seqlens_kv, dropout_p=0.125, rng=rng, fp8=True)
    out, lse = ja.attention_fwd(q, k, v, **kw)
    return (out, lse) + tuple(ja.attention_bwd(dout, q, k, v, out, lse, **kw))


def _inputs(lead=()):
    r = np.random.default_rng(7)
    shapes = ((2, 20, 4, 8), (2, 30, 2, 8), (2, 30, 2, 8), (2, 20, 4, 8))
    return [jnp.asarray(r.standard_normal(lead + s).astype(np.float32)) for s in shapes]


def test_attention_fp8_jit_and_vmap():
    q, k, v, dout = _inputs(lead=(2,))
    lens = jnp.asarray([[30, 9], [0, 30]], jnp.int32)
    rng = jnp.asarray([[3, 4], [5, 6]], jnp.uint32)
    batched = jax.jit(jax.vmap(_fwd_bwd))(q, k, v, dout, lens, rng)
    for n in range(2):
        single = _fwd_bwd(q[n], k[n], v[n], dout[n], lens[n], rng[n])  # eager
        jitted = jax.jit(_fwd_bwd)(q[n], k[n], v[n], dout[n], lens[n], rng[n])
        for i, (a, b, c) in enumerate(zip(batched, single, jitted, strict=True)):
            assert_bytes_equal(np.asarray(a[n]), np.asarray(b), f"vmap element {n} output {i}")
            assert_bytes_equal(np.asarray(c), np.asarray(b), f"jit element {n} output {i}")

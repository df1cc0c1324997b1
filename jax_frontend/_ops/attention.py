"""twinengine.jax attention_fwd / attention_bwd (scaled dot-product attention, bshd / sbhd / thd) over
XLA FFI calls. Shapes, checks and errors come from core/ops/attention.py; no custom_vjp here (the
layer functions wrap these)."""

from __future__ import annotations

import jax.numpy as jnp

from ...ops.attention import ATTENTION_BWD, ATTENTION_FWD
from .._library import ffi, meta


def attention_fwd(q, k, v, *, mask_type: str, window_size=None, seqlens_q=None, seqlens_kv=None,
                  softmax_scale: float | None = None, dropout_p: float = 0.0, rng=None, qkv_format: str = "bshd",
                  cu_seqlens_q=None, cu_seqlens_kv=None, fp8: bool = False):
    """Scaled dot-product attention forward (layout bshd, sbhd or thd): (out, lse). jit- and vmap-clean.

    Shapes: q (B, S_q, H, D); k (B, S_kv, H_kv, D); v (B, S_kv, H_kv, D_v) with H % H_kv == 0
        (qkv_format="sbhd" swaps the first two dimensions of q, k, v and out; qkv_format="thd" takes
        packed (T, H, D) arrays with cu_seqlens_q / cu_seqlens_kv int32 (n + 1,) offsets, out
        (T_q, H, D_v), lse (H, T_q));
        seqlens_q / seqlens_kv int32 (B,) for the padding mask types; out (B, S_q, H, D_v);
        lse (B, H, S_q).
    Dtypes: q, k, v one of float32 / bfloat16 / float16; out q's dtype; lse float32.
    Numerics: docs/attention.md; the same kernel as twinengine.pytorch, so the same bytes. Under
        vmap each batch element is its own call (dropout element indices are then per call).
        fp8=True: FP8 attention (docs/attention.md §9; what a recipe's fp8_dpa / fp8_mha selects),
        same bytes as twinengine.pytorch's fp8=True (under vmap the per-tensor scales are per call).
    Raises:
        TypeError / ValueError: from the shared core checks (same text as the torch frontend).
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    call = ATTENTION_FWD.plan(meta(q), meta(k), meta(v), mask_type, window_size, meta(seqlens_q), meta(seqlens_kv),
                              softmax_scale, dropout_p, meta(rng), qkv_format, meta(cu_seqlens_q), meta(cu_seqlens_kv),
                              fp8)
    arrays = {"q": q, "k": k, "v": v, "seqlens_q": seqlens_q, "seqlens_kv": seqlens_kv, "rng": rng,
              "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_kv": cu_seqlens_kv}
    out, lse = ffi(call, [arrays[name] for name in call.inputs])
    return out, lse


def attention_bwd(dout, q, k, v, out, lse, *, mask_type: str, window_size=None, seqlens_q=None, seqlens_kv=None,
                  softmax_scale: float | None = None, dropout_p: float = 0.0, rng=None, qkv_format: str = "bshd",
                  cu_seqlens_q=None, cu_seqlens_kv=None, fp8: bool = False):
    """Attention backward from the forward's out and lse: (dq, dk, dv).

    Shapes: dout, out (B, S_q, H, D_v); lse (B, H, S_q) float32; dq, dk, dv q's, k's, v's shapes.
    Numerics: docs/attention.md §4 (fp8=True: §9). The keyword arguments (and rng, fp8) must be the
        forward's.
    Raises:
        TypeError / ValueError: from the shared core checks.
    """
    call = ATTENTION_BWD.plan(meta(dout), meta(q), meta(k), meta(v), meta(out), meta(lse), mask_type, window_size,
                              meta(seqlens_q), meta(seqlens_kv), softmax_scale, dropout_p, meta(rng), qkv_format,
                              meta(cu_seqlens_q), meta(cu_seqlens_kv), fp8)
    arrays = {"dout": dout, "q": q, "k": k, "v": v, "out": out, "lse": lse, "seqlens_q": seqlens_q,
              "seqlens_kv": seqlens_kv, "rng": rng, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_kv": cu_seqlens_kv}
    dq, dk, dv = ffi(call, [arrays[name] for name in call.inputs])
    return dq, dk, dv

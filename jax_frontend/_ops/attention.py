"""twinengine.jax attention_fwd / attention_bwd (scaled dot-product attention, bshd / sbhd / thd) over
XLA FFI calls. Shapes, checks and errors come from core/ops/attention.py; no custom_vjp here (the
layer functions wrap these).

Sharded jit (``twinengine.jax.partitioning``): bshd / sbhd attention shards the batch and, when
q and k / v have the same number of heads, the heads locally (each (batch, head) pair is its
own softmax: the unsharded bytes); the sequence and head dimensions otherwise run gathered.
thd (packed sequences), dropout (bits from the global element index) and FP8 attention
(per-tensor scales of whole tensors) run replicated."""

from __future__ import annotations

import jax.numpy as jnp

from ...ops.attention import ATTENTION_BWD, ATTENTION_FWD
from .._library import ffi, meta
from ..partitioning import Rule, factor_sizes, partitioned


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
    rule = _rule("attention_fwd", call, q, k, v, qkv_format, dropout_p, fp8)
    options = (mask_type, _static(window_size), softmax_scale, dropout_p, qkv_format, fp8)
    out, lse = _op(rule, ("fwd", call.inputs, options), *[arrays[name] for name in call.inputs])
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
    rule = _rule("attention_bwd", call, q, k, v, qkv_format, dropout_p, fp8)
    options = (mask_type, _static(window_size), softmax_scale, dropout_p, qkv_format, fp8)
    dq, dk, dv = _op(rule, ("bwd", call.inputs, options), *[arrays[name] for name in call.inputs])
    return dq, dk, dv


def _static(window_size):
    return tuple(window_size) if isinstance(window_size, list) else window_size


def _rule(op: str, call, q, k, v, qkv_format: str, dropout_p: float, fp8: bool) -> Rule:
    """Batch and (equal head counts) heads local; replicated for thd, dropout and FP8."""
    def layout(seq: str, heads: str, dim: str):
        return ((seq,), ("b",), (heads,), (dim,)) if qkv_format == "sbhd" else (("b",), (seq,), (heads,), (dim,))
    same_heads = q.shape[-2] == k.shape[-2]
    q_dims, out_dims = layout("sq", "h", "d"), layout("sq", "h", "dv")
    k_dims, v_dims = layout("skv", "h" if same_heads else "hkv", "d"), layout("skv", "h" if same_heads else "hkv", "dv")
    named = {"q": q_dims, "k": k_dims, "v": v_dims, "out": out_dims, "dout": out_dims, "lse": (("b",), ("h",), ("sq",)),
             "dq": q_dims, "dk": k_dims, "dv": v_dims, "seqlens_q": (("b",),), "seqlens_kv": (("b",),),
             "rng": ((),), "cu_seqlens_q": ((),), "cu_seqlens_kv": ((),)}
    if qkv_format == "thd":
        named = {name: tuple(() for _ in range(len(dims) - (name in ("q", "k", "v", "out", "dout", "dq", "dk", "dv"))))
                 for name, dims in named.items()}
        named["lse"] = ((), ())
    local = frozenset() if qkv_format == "thd" or dropout_p > 0 or fp8 else frozenset({"b", "h"} if same_heads
                                                                                       else {"b"})
    sizes = factor_sizes([(q_dims, q.shape), (k_dims, k.shape), (v_dims, v.shape)]) if qkv_format != "thd" else ()
    return Rule(op, tuple((name, named[name]) for name in call.inputs),
                tuple(named[spec.name] for spec in call.outputs), sizes, local=local)


def _shard(static, sizes, *arrays):
    """The attention call on this shard's arrays (re-planned for their shapes)."""
    which, names, options = static
    a = {name: None for name in ("dout", "out", "lse", "seqlens_q", "seqlens_kv", "rng", "cu_seqlens_q",
                                 "cu_seqlens_kv")}
    a.update(zip(names, arrays))
    mask_type, window_size, softmax_scale, dropout_p, qkv_format, fp8 = options
    tail = (mask_type, window_size, meta(a["seqlens_q"]), meta(a["seqlens_kv"]), softmax_scale, dropout_p,
            meta(a["rng"]), qkv_format, meta(a["cu_seqlens_q"]), meta(a["cu_seqlens_kv"]), fp8)
    if which == "fwd":
        call = ATTENTION_FWD.plan(meta(a["q"]), meta(a["k"]), meta(a["v"]), *tail)
    else:
        call = ATTENTION_BWD.plan(*[meta(a[n]) for n in ("dout", "q", "k", "v", "out", "lse")], *tail)
    return ffi(call, [a[name] for name in call.inputs])


_op = partitioned(_shard)

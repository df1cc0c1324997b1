"""torch.ops.twinengine attention_fwd / attention_bwd (scaled dot-product attention, bshd / sbhd / thd)
and their Python wrappers. Shapes, checks and errors come from core/ops/attention.py; no autograd
is registered here (modules wrap these ops)."""

from __future__ import annotations

import torch

from ...ops.attention import ATTENTION_BWD, ATTENTION_FWD, resolve_scale, resolve_window
from ...ops.opdef import OpDef
from .._library import check_tensor_device, empty_outputs, launch, meta, surface_errors, tuple_fallback, zeros_like_args


def _run(opdef: OpDef, arrays: dict[str, torch.Tensor | None], *args) -> list[torch.Tensor]:
    call = opdef.plan(*args)
    return launch(call, [arrays[name] for name in call.inputs], arrays["q"].device)


@torch.library.custom_op("twinengine::attention_fwd", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqlens_q: torch.Tensor | None,
                   seqlens_kv: torch.Tensor | None, rng: torch.Tensor | None, mask_type: str, window_left: int,
                   window_right: int, softmax_scale: float, dropout_p: float,
                   qkv_format: str, cu_seqlens_q: torch.Tensor | None,
                   cu_seqlens_kv: torch.Tensor | None, fp8: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    arrays = {"q": q, "k": k, "v": v, "seqlens_q": seqlens_q, "seqlens_kv": seqlens_kv, "rng": rng,
              "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_kv": cu_seqlens_kv}
    out, lse = _run(ATTENTION_FWD, arrays, meta(q), meta(k), meta(v), mask_type, (window_left, window_right),
                    meta(seqlens_q), meta(seqlens_kv), softmax_scale, dropout_p, meta(rng), qkv_format,
                    meta(cu_seqlens_q), meta(cu_seqlens_kv), fp8)
    return out, lse


@_attention_fwd.register_fake
def _(q, k, v, seqlens_q, seqlens_kv, rng, mask_type, window_left, window_right, softmax_scale, dropout_p,
      qkv_format, cu_seqlens_q, cu_seqlens_kv, fp8=False):
    call = ATTENTION_FWD.infer(meta(q), meta(k), meta(v), mask_type, (window_left, window_right), meta(seqlens_q),
                               meta(seqlens_kv), softmax_scale, dropout_p, meta(rng), qkv_format, meta(cu_seqlens_q),
                               meta(cu_seqlens_kv), fp8)
    out, lse = empty_outputs(call, q.device)
    return out, lse


@torch.library.custom_op("twinengine::attention_bwd", mutates_args=())
def _attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, seqlens_q: torch.Tensor | None, seqlens_kv: torch.Tensor | None,
                   rng: torch.Tensor | None, mask_type: str, window_left: int, window_right: int, softmax_scale: float,
                   dropout_p: float, qkv_format: str, cu_seqlens_q: torch.Tensor | None,
                   cu_seqlens_kv: torch.Tensor | None,
                   fp8: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    arrays = {"dout": dout, "q": q, "k": k, "v": v, "out": out, "lse": lse, "seqlens_q": seqlens_q,
              "seqlens_kv": seqlens_kv, "rng": rng, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_kv": cu_seqlens_kv}
    dq, dk, dv = _run(ATTENTION_BWD, arrays, meta(dout), meta(q), meta(k), meta(v), meta(out), meta(lse), mask_type,
                      (window_left, window_right), meta(seqlens_q), meta(seqlens_kv), softmax_scale, dropout_p,
                      meta(rng), qkv_format, meta(cu_seqlens_q), meta(cu_seqlens_kv), fp8)
    return dq, dk, dv


@_attention_bwd.register_fake
def _(dout, q, k, v, out, lse, seqlens_q, seqlens_kv, rng, mask_type, window_left, window_right, softmax_scale,
      dropout_p, qkv_format, cu_seqlens_q, cu_seqlens_kv, fp8=False):
    call = ATTENTION_BWD.infer(meta(dout), meta(q), meta(k), meta(v), meta(out), meta(lse), mask_type,
                               (window_left, window_right), meta(seqlens_q), meta(seqlens_kv), softmax_scale,
                               dropout_p, meta(rng), qkv_format, meta(cu_seqlens_q), meta(cu_seqlens_kv), fp8)
    dq, dk, dv = empty_outputs(call, q.device)
    return dq, dk, dv


def _check_devices(op: str, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        check_tensor_device(op, name, t)


@surface_errors(tuple_fallback(2))
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask_type: str, window_size=None,
                  seqlens_q: torch.Tensor | None = None, seqlens_kv: torch.Tensor | None = None,
                  softmax_scale: float | None = None, dropout_p: float = 0.0,
                  rng: torch.Tensor | None = None, qkv_format: str = "bshd", cu_seqlens_q: torch.Tensor | None = None,
                  cu_seqlens_kv: torch.Tensor | None = None, fp8: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention forward (layout bshd, sbhd or thd): (out, lse).

    Shapes: q (B, S_q, H, D); k (B, S_kv, H_kv, D); v (B, S_kv, H_kv, D_v) with H % H_kv == 0
        (GQA/MQA: query head h reads kv head h // (H / H_kv)); qkv_format="sbhd" swaps the first
        two dimensions of q, k, v and out (lse stays (B, H, S_q)); qkv_format="thd": q (T_q, H, D),
        k (T_kv, H_kv, D), v (T_kv, H_kv, D_v) packed sequences given by cu_seqlens_q / cu_seqlens_kv
        int32 (n + 1,) offsets (padding mask types), out (T_q, H, D_v), lse (H, T_q);
        seqlens_q / seqlens_kv int32 (B,)
        for the padding mask types; out (B, S_q, H, D_v); lse (B, H, S_q).
    Dtypes: q, k, v one of float32 / bfloat16 / float16 (math in fp32); out q's dtype; lse float32.
    Numerics: docs/attention.md — blocked online softmax (64-key blocks), fp32 statistics,
        exp_f32 / log_f32, canonical sums; dropout_p > 0 draws the Philox stream tagged "ATTN" from
        rng = [seed, offset]. Fully masked rows give out 0 and lse -inf. Same bytes as twinengine.jax.
        fp8=True: FP8 attention (docs/attention.md §9; what a recipe's fp8_dpa / fp8_mha selects):
        q, k, v quantized E4M3 with per-tensor current scales inside the kernel, P E4M3 with the
        fixed scale 448, fp32 softmax statistics; inputs, out and lse keep their dtypes.
    Raises:
        TypeError / ValueError: from the shared core checks (dtypes, ranks, GQA divisibility,
        mask_type, window_size contradicting a causal mask, seqlens with a non-padding mask or of
        the wrong shape/dtype, dropout_p, rng). Out-of-range seqlens values raise from the kernel.
    """
    op = "attention_fwd"
    _check_devices(op, q=q, k=k, v=v, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, rng=rng, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_kv=cu_seqlens_kv)
    ATTENTION_FWD.validate(meta(q), meta(k), meta(v), mask_type, window_size, meta(seqlens_q), meta(seqlens_kv),
                           softmax_scale, dropout_p, meta(rng), qkv_format, meta(cu_seqlens_q), meta(cu_seqlens_kv),
                           fp8)
    left, right = resolve_window(op, mask_type, window_size)
    scale = resolve_scale(op, softmax_scale, q.shape[-1])
    return torch.ops.twinengine.attention_fwd(q, k, v, seqlens_q, seqlens_kv, rng if dropout_p > 0 else None,
                                              mask_type, left, right, scale, float(dropout_p), qkv_format,
                                              cu_seqlens_q, cu_seqlens_kv, fp8)


@surface_errors(zeros_like_args(1, 2, 3))
def attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, *, mask_type: str, window_size=None, seqlens_q: torch.Tensor | None = None,
                  seqlens_kv: torch.Tensor | None = None, softmax_scale: float | None = None, dropout_p: float = 0.0,
                  rng: torch.Tensor | None = None, qkv_format: str = "bshd", cu_seqlens_q: torch.Tensor | None = None,
                  cu_seqlens_kv: torch.Tensor | None = None,
                  fp8: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward from the forward's out and lse: (dq, dk, dv).

    Shapes: dout, out (B, S_q, H, D_v); lse (B, H, S_q) float32; dq, dk, dv q's, k's, v's shapes.
    Dtypes: dout, out q's dtype; dq, dk, dv q's dtype.
    Numerics: docs/attention.md §4 — probabilities recomputed from lse, dq per row over keys
        ascending, dk / dv per key over the group's query heads then rows ascending. The keyword
        arguments (and rng, fp8) must be the forward's; fp8=True is §9's backward (dO, dS E5M2).
    Raises:
        TypeError / ValueError: as ``attention_fwd``, plus dout / out / lse shape and dtype.
    """
    op = "attention_bwd"
    _check_devices(op, dout=dout, q=q, k=k, v=v, out=out, lse=lse, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                   rng=rng, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv)
    ATTENTION_BWD.validate(meta(dout), meta(q), meta(k), meta(v), meta(out), meta(lse), mask_type, window_size,
                           meta(seqlens_q), meta(seqlens_kv), softmax_scale, dropout_p, meta(rng), qkv_format,
                           meta(cu_seqlens_q), meta(cu_seqlens_kv), fp8)
    left, right = resolve_window(op, mask_type, window_size)
    scale = resolve_scale(op, softmax_scale, q.shape[-1])
    return torch.ops.twinengine.attention_bwd(dout, q, k, v, out, lse, seqlens_q, seqlens_kv,
                                              rng if dropout_p > 0 else None, mask_type, left, right, scale,
                                              float(dropout_p), qkv_format, cu_seqlens_q, cu_seqlens_kv, fp8)

"""The attention family: scaled dot-product attention forward and backward (high precision,
layouts bshd, sbhd and thd), with TE's mask types, sliding windows, GQA/MQA and dropout of the
probabilities.

Each op is one :class:`OpDef`; both frontends call ``OP.plan(...)`` and never restate a shape, a
check or an error text. Numerics: docs/attention.md (blocked online softmax, fp32 logsumexp saved
for the backward, dropout from the Philox stream tagged "ATTN").
"""

from __future__ import annotations

import math
from typing import Any

from ..dtypes import HIGH_PRECISION
from .opdef import KernelCall, OpDef, TensorSpec, dims, fail
from .quantize import RNG_DTYPES, ArrayMeta

# attn_mask_type -> TweAttentionMask (csrc/include/twinengine/attention.h).
MASK_TYPES = {
    "no_mask": 0,
    "padding": 1,
    "causal": 2,
    "padding_causal": 3,
    "causal_bottom_right": 4,
    "padding_causal_bottom_right": 5,
}
# qkv_format -> TweAttentionLayout.
LAYOUTS = {"bshd": 0, "sbhd": 1, "thd": 2}
PADDING_MASKS = ("padding", "padding_causal", "padding_causal_bottom_right")
CAUSAL_MASKS = ("causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right")

# The largest p that rounds to an fp32 below 1 (see core/ops/dropout.py).
_P_LIMIT = 1.0 - 2.0**-25


def _check_mask_type(op: str, mask_type: Any) -> None:
    if not isinstance(mask_type, str):
        fail(op, TypeError, f"mask_type must be a str, got {type(mask_type).__name__}")
    if mask_type not in MASK_TYPES:
        fail(op, ValueError, f"mask_type must be one of {', '.join(repr(m) for m in MASK_TYPES)}, got {mask_type!r}")


def resolve_window(op: str, mask_type: str, window_size: Any) -> tuple[int, int]:
    """(left, right) of a validated mask_type: TE's defaults ((-1, 0) causal, (-1, -1) otherwise);
    (-1, -1) with a causal type means (-1, 0); a causal type with right != 0 is an error."""
    causal = mask_type in CAUSAL_MASKS
    if window_size is None:
        return (-1, 0) if causal else (-1, -1)
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or any(isinstance(w, bool) or not isinstance(w, int) for w in window_size)):
        fail(op, TypeError, f"window_size must be None or a pair of ints (left, right), got {window_size!r}")
    left, right = int(window_size[0]), int(window_size[1])
    if left < -1 or right < -1:
        fail(op, ValueError, f"window_size entries must be >= -1 (-1: unbounded), got {(left, right)}")
    if causal:
        if (left, right) == (-1, -1):
            return -1, 0
        if right != 0:
            fail(op, ValueError, f"window_size {(left, right)} contradicts mask_type {mask_type!r}: a causal mask "
                 "needs window_size[1] == 0 (or window_size (-1, -1) or None)")
    return left, right


def resolve_scale(op: str, softmax_scale: Any, head_dim: Any) -> float:
    """softmax_scale, default 1/sqrt(D) (float64, rounded to fp32 by the kernel call)."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale):
        fail(op, ValueError, f"softmax_scale must be None or a finite float, got {softmax_scale!r}")
    return float(softmax_scale)


def _check_format(op: str, qkv_format: Any) -> None:
    if not isinstance(qkv_format, str) or qkv_format not in LAYOUTS:
        fail(op, ValueError, f"qkv_format must be 'bshd', 'sbhd' or 'thd', got {qkv_format!r}")


def batch_seq(shape: tuple[Any, ...], qkv_format: str) -> tuple[Any, Any]:
    """(batch, seq) of a q/k/v/out shape in layout qkv_format (thd: one batch of T tokens)."""
    if qkv_format == "thd":
        return 1, shape[0]
    return (shape[1], shape[0]) if qkv_format == "sbhd" else (shape[0], shape[1])


def _lift(t: ArrayMeta | None, qkv_format: str) -> ArrayMeta | None:
    """A thd array as the (1, T, H, D) bshd array of the same memory (the kernel's view)."""
    if qkv_format != "thd" or t is None:
        return t
    return ArrayMeta((1,) + tuple(t.shape), t.dtype)


_DIMS = {"bshd": "4-D (batch, seq, heads, head_dim)", "sbhd": "4-D (seq, batch, heads, head_dim)",
         "thd": "3-D (tokens, heads, head_dim)"}


def _check_qkv(op: str, q: ArrayMeta, k: ArrayMeta, v: ArrayMeta, qkv_format: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t is None:
            fail(op, TypeError, f"{name} is required")
        if t.dtype not in HIGH_PRECISION:
            fail(op, TypeError, f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
        if len(t.shape) != (3 if qkv_format == "thd" else 4):
            fail(op, ValueError, f"{name} must be {_DIMS[qkv_format]} (layout {qkv_format}), got shape "
                 f"{dims(t.shape)}")
    if qkv_format == "thd":
        q, k, v = _lift(q, qkv_format), _lift(k, qkv_format), _lift(v, qkv_format)
        qkv_format = "bshd"
    if k.dtype != q.dtype or v.dtype != q.dtype:
        fail(op, TypeError, f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if batch_seq(k.shape, qkv_format)[0] != batch_seq(q.shape, qkv_format)[0] \
            or batch_seq(v.shape, qkv_format)[0] != batch_seq(q.shape, qkv_format)[0]:
        fail(op, ValueError, f"q, k and v must have one batch size, got shapes {dims(q.shape)}, {dims(k.shape)}, "
             f"{dims(v.shape)}")
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        fail(op, ValueError, f"k and v must have the same (batch, seq, heads), got {dims(k.shape)} and "
             f"{dims(v.shape)}")
    if k.shape[3] != q.shape[3]:
        fail(op, ValueError, f"q and k must have the same head_dim, got {q.shape[3]} and {k.shape[3]}")
    if q.shape[3] == 0 or v.shape[3] == 0:
        fail(op, ValueError, "head_dim must be >= 1")
    heads, kv_heads = q.shape[2], k.shape[2]
    if kv_heads == 0 or heads % kv_heads != 0:
        fail(op, ValueError, f"the number of query heads ({heads}) must be divisible by the number of kv heads "
             f"(GQA groups, {kv_heads})")


def _check_seqlens(op: str, mask_type: str, batch: Any, seqlens_q: ArrayMeta | None,
                   seqlens_kv: ArrayMeta | None) -> None:
    for name, lens in (("seqlens_q", seqlens_q), ("seqlens_kv", seqlens_kv)):
        if lens is None:
            continue
        if mask_type not in PADDING_MASKS:
            fail(op, ValueError, f"{name} is only used with a padding mask type ({', '.join(PADDING_MASKS)}), "
                 f"got mask_type {mask_type!r}")
        if lens.dtype != "int32":
            fail(op, TypeError, f"{name} must have dtype int32, got {lens.dtype}")
        if tuple(lens.shape) != (batch,):
            fail(op, ValueError, f"{name} must have shape (batch,) = {(batch,)} (one length per sequence), "
                 f"got {dims(lens.shape)}")


def _check_cu_seqlens(op: str, mask_type: str, qkv_format: str, seqlens_q, seqlens_kv, cu_seqlens_q,
                      cu_seqlens_kv) -> None:
    if qkv_format != "thd":
        if cu_seqlens_q is not None or cu_seqlens_kv is not None:
            fail(op, ValueError, "cu_seqlens_q / cu_seqlens_kv are only used with qkv_format 'thd', "
                 f"got {qkv_format!r}")
        return
    if seqlens_q is not None or seqlens_kv is not None:
        fail(op, ValueError, "seqlens_q / seqlens_kv are not used with qkv_format 'thd': pass cu_seqlens_q and "
             "cu_seqlens_kv")
    if cu_seqlens_q is None or cu_seqlens_kv is None:
        fail(op, ValueError, "qkv_format 'thd' needs cu_seqlens_q and cu_seqlens_kv (int32 offsets of shape "
             "(batch + 1,))")
    if mask_type not in PADDING_MASKS:
        fail(op, ValueError, f"qkv_format 'thd' needs a padding mask type ({', '.join(PADDING_MASKS)}), "
             f"got {mask_type!r}")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv)):
        if cu.dtype != "int32":
            fail(op, TypeError, f"{name} must have dtype int32, got {cu.dtype}")
        if len(cu.shape) != 1 or cu.shape[0] < 2:
            fail(op, ValueError, f"{name} must have shape (batch + 1,) with batch >= 1, got {dims(cu.shape)}")
    if tuple(cu_seqlens_q.shape) != tuple(cu_seqlens_kv.shape):
        fail(op, ValueError, f"cu_seqlens_q and cu_seqlens_kv must have one shape (batch + 1,), got "
             f"{dims(cu_seqlens_q.shape)} and {dims(cu_seqlens_kv.shape)}")


def _check_dropout(op: str, dropout_p: Any, rng: ArrayMeta | None) -> None:
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        fail(op, TypeError, f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if not 0.0 <= dropout_p < _P_LIMIT:
        fail(op, ValueError, f"dropout_p must be in [0, 1) (after rounding to float32), got {dropout_p!r}")
    if dropout_p > 0.0:
        if rng is None:
            fail(op, ValueError, "attention dropout needs rng= (an integer array [seed, offset] of shape (2,), "
                 "dtype uint32, int32 or int64)")
        if rng.dtype not in RNG_DTYPES:
            fail(op, TypeError, f"rng must have dtype uint32, int32 or int64, got {rng.dtype}")
        if tuple(rng.shape) != (2,):
            fail(op, ValueError, f"rng must have shape (2,) ([seed, offset]), got {dims(rng.shape)}")


def _check_fp8(op: str, fp8: Any) -> None:
    if not isinstance(fp8, bool):
        fail(op, TypeError, f"fp8 must be a bool, got {fp8!r}")


def _validate_common(op: str, q, k, v, mask_type, window_size, seqlens_q, seqlens_kv, softmax_scale, dropout_p,
                     rng, qkv_format, cu_seqlens_q, cu_seqlens_kv, fp8=False) -> None:
    _check_fp8(op, fp8)
    _check_format(op, qkv_format)
    _check_qkv(op, q, k, v, qkv_format)
    _check_mask_type(op, mask_type)
    resolve_window(op, mask_type, window_size)
    _check_cu_seqlens(op, mask_type, qkv_format, seqlens_q, seqlens_kv, cu_seqlens_q, cu_seqlens_kv)
    _check_seqlens(op, mask_type, batch_seq(q.shape, qkv_format)[0], seqlens_q, seqlens_kv)
    resolve_scale(op, softmax_scale, q.shape[-1])
    _check_dropout(op, dropout_p, rng)


def _optional_inputs(seqlens_q, seqlens_kv, dropout_p, cu_seqlens_q=None, cu_seqlens_kv=None) -> tuple[str, ...]:
    """Kernel inputs after the fixed ones: the seqlens slots (cu_seqlens with thd), then rng."""
    names = ()
    if cu_seqlens_q is not None:
        names += ("cu_seqlens_q", "cu_seqlens_kv")
    if seqlens_q is not None:
        names += ("seqlens_q",)
    if seqlens_kv is not None:
        names += ("seqlens_kv",)
    if dropout_p > 0.0:
        names += ("rng",)
    return names


def _attrs(op: str, q, mask_type, window_size, seqlens_q, seqlens_kv, softmax_scale, dropout_p, qkv_format,
           fp8=False) -> tuple[tuple[str, int | float], ...]:
    left, right = resolve_window(op, mask_type, window_size)
    return (("layout", LAYOUTS[qkv_format]), ("mask_type", MASK_TYPES[mask_type]), ("window_left", left),
            ("window_right", right),
            ("softmax_scale", resolve_scale(op, softmax_scale, q.shape[-1])), ("dropout_p", float(dropout_p)),
            ("has_seqlens_q", int(seqlens_q is not None or qkv_format == "thd")),
            ("has_seqlens_kv", int(seqlens_kv is not None or qkv_format == "thd")),
            ("has_rng", int(dropout_p > 0.0)), ("fp8", int(bool(fp8))))


# ---- forward ----------------------------------------------------------------------------

def _validate_fwd(q: ArrayMeta, k: ArrayMeta, v: ArrayMeta, mask_type: str, window_size=None,
                  seqlens_q: ArrayMeta | None = None, seqlens_kv: ArrayMeta | None = None, softmax_scale=None,
                  dropout_p: float = 0.0, rng: ArrayMeta | None = None, qkv_format: str = "bshd",
                  cu_seqlens_q: ArrayMeta | None = None, cu_seqlens_kv: ArrayMeta | None = None,
                  fp8: bool = False) -> None:
    _validate_common("attention_fwd", q, k, v, mask_type, window_size, seqlens_q, seqlens_kv, softmax_scale,
                     dropout_p, rng, qkv_format, cu_seqlens_q, cu_seqlens_kv, fp8)


def _infer_fwd(q: ArrayMeta, k: ArrayMeta, v: ArrayMeta, mask_type: str, window_size=None,
               seqlens_q: ArrayMeta | None = None, seqlens_kv: ArrayMeta | None = None, softmax_scale=None,
               dropout_p: float = 0.0, rng: ArrayMeta | None = None, qkv_format: str = "bshd",
               cu_seqlens_q: ArrayMeta | None = None, cu_seqlens_kv: ArrayMeta | None = None,
               fp8: bool = False) -> KernelCall:
    b, sq = batch_seq(q.shape, qkv_format)
    h = q.shape[-2]
    out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    lse_shape = (h, sq) if qkv_format == "thd" else (b, h, sq)
    return KernelCall(
        op="attention_fwd",
        inputs=("q", "k", "v") + _optional_inputs(seqlens_q, seqlens_kv, dropout_p, cu_seqlens_q, cu_seqlens_kv),
        outputs=(TensorSpec("out", out_shape, q.dtype), TensorSpec("lse", lse_shape, "float32")),
        attrs=_attrs("attention_fwd", q, mask_type, window_size, seqlens_q, seqlens_kv, softmax_scale, dropout_p,
                     qkv_format, fp8),
    )


ATTENTION_FWD = OpDef(
    name="attention_fwd",
    args=("q", "k", "v", "seqlens_q", "seqlens_kv", "rng", "cu_seqlens_q", "cu_seqlens_kv"),
    attrs=("mask_type", "window_size", "softmax_scale", "dropout_p", "qkv_format", "fp8"),
    validate=_validate_fwd,
    infer=_infer_fwd,
)
"""attention_fwd(q, k, v, mask_type, window_size=None, seqlens_q=None, seqlens_kv=None,
softmax_scale=None, dropout_p=0.0, rng=None, qkv_format="bshd", cu_seqlens_q=None,
cu_seqlens_kv=None, fp8=False) -> out, lse.

Shapes: q (B, S_q, H, D); k (B, S_kv, H_kv, D); v (B, S_kv, H_kv, D_v), H % H_kv == 0 (sbhd:
    the first two dimensions swapped, also for out); seqlens_q / seqlens_kv int32 (B,) (padding
    types only); out (B, S_q, H, D_v); lse (B, H, S_q). thd: q (T_q, H, D), k (T_kv, H_kv, D),
    v (T_kv, H_kv, D_v), cu_seqlens_q / cu_seqlens_kv int32 (n + 1,) (required, padding types
    only), out (T_q, H, D_v), lse (H, T_q).
Dtypes: q, k, v one of float32 / bfloat16 / float16; out q's dtype; lse float32.
Numerics: docs/attention.md; fp8=True is FP8 attention (§9: E4M3 Q, K, V, P with per-tensor
    current scales computed in the kernel; inputs and outputs stay high precision).
"""


# ---- backward ---------------------------------------------------------------------------

def _validate_bwd(dout: ArrayMeta, q: ArrayMeta, k: ArrayMeta, v: ArrayMeta, out: ArrayMeta, lse: ArrayMeta,
                  mask_type: str, window_size=None, seqlens_q: ArrayMeta | None = None,
                  seqlens_kv: ArrayMeta | None = None, softmax_scale=None, dropout_p: float = 0.0,
                  rng: ArrayMeta | None = None, qkv_format: str = "bshd", cu_seqlens_q: ArrayMeta | None = None,
                  cu_seqlens_kv: ArrayMeta | None = None, fp8: bool = False) -> None:
    op = "attention_bwd"
    _validate_common(op, q, k, v, mask_type, window_size, seqlens_q, seqlens_kv, softmax_scale, dropout_p, rng,
                     qkv_format, cu_seqlens_q, cu_seqlens_kv, fp8)
    b, sq = batch_seq(q.shape, qkv_format)
    h = q.shape[-2]
    out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    lse_shape = (h, sq) if qkv_format == "thd" else (b, h, sq)
    for name, t in (("dout", dout), ("out", out)):
        if t is None:
            fail(op, TypeError, f"{name} is required")
        if t.dtype != q.dtype:
            fail(op, TypeError, f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
        if tuple(t.shape) != out_shape:
            fail(op, ValueError, f"{name} must have the forward output's shape {out_shape}, got {dims(t.shape)}")
    if lse is None:
        fail(op, TypeError, "lse is required")
    if lse.dtype != "float32":
        fail(op, TypeError, f"lse must be float32, got {lse.dtype}")
    if tuple(lse.shape) != lse_shape:
        fail(op, ValueError, f"lse must have the forward's shape {lse_shape}, got {dims(lse.shape)}")


def _infer_bwd(dout: ArrayMeta, q: ArrayMeta, k: ArrayMeta, v: ArrayMeta, out: ArrayMeta, lse: ArrayMeta,
               mask_type: str, window_size=None, seqlens_q: ArrayMeta | None = None,
               seqlens_kv: ArrayMeta | None = None, softmax_scale=None, dropout_p: float = 0.0,
               rng: ArrayMeta | None = None, qkv_format: str = "bshd", cu_seqlens_q: ArrayMeta | None = None,
               cu_seqlens_kv: ArrayMeta | None = None, fp8: bool = False) -> KernelCall:
    return KernelCall(
        op="attention_bwd",
        inputs=("dout", "q", "k", "v", "out", "lse") + _optional_inputs(seqlens_q, seqlens_kv, dropout_p,
                                                                          cu_seqlens_q, cu_seqlens_kv),
        outputs=(TensorSpec("dq", tuple(q.shape), q.dtype), TensorSpec("dk", tuple(k.shape), k.dtype),
                 TensorSpec("dv", tuple(v.shape), v.dtype)),
        attrs=_attrs("attention_bwd", q, mask_type, window_size, seqlens_q, seqlens_kv, softmax_scale, dropout_p,
                     qkv_format, fp8),
    )


ATTENTION_BWD = OpDef(
    name="attention_bwd",
    args=("dout", "q", "k", "v", "out", "lse", "seqlens_q", "seqlens_kv", "rng", "cu_seqlens_q", "cu_seqlens_kv"),
    attrs=("mask_type", "window_size", "softmax_scale", "dropout_p", "qkv_format", "fp8"),
    validate=_validate_bwd,
    infer=_infer_bwd,
)
"""attention_bwd(dout, q, k, v, out, lse, mask_type, window_size=None, seqlens_q=None,
seqlens_kv=None, softmax_scale=None, dropout_p=0.0, rng=None, qkv_format="bshd", cu_seqlens_q=None,
cu_seqlens_kv=None, fp8=False) -> dq, dk, dv.

Shapes: dout, out the forward output's; lse (B, H, S_q) float32; dq, dk, dv q's, k's, v's shapes
    and dtypes. The mask, window, scale, dropout, rng and fp8 must be the forward's (fp8: §9, dO and
    dS E5M2).
"""

__all__ = ["ATTENTION_FWD", "ATTENTION_BWD", "LAYOUTS", "MASK_TYPES", "batch_seq", "PADDING_MASKS", "CAUSAL_MASKS",
           "resolve_window",
           "resolve_scale"]

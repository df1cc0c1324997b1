"""twinengine.jax rope_fwd / rope_bwd over XLA FFI calls (no custom_vjp; jax_frontend/rope.py adds
it). Shapes, checks and errors come from core/ops/rope.py.

Sharded jit (``twinengine.jax.partitioning``): sbhd / bshd shard the batch and heads locally,
and the sequence too when freqs has exactly t's sequence length (freqs is then sharded with
it); the head dimension and thd (packed sequences) run gathered. Each element's rotation
depends only on its position and channel: the unsharded bytes."""

from __future__ import annotations

from ...ops.rope import ROPE_BWD, ROPE_FWD
from .._library import ffi, meta
from ..partitioning import Rule, factor_sizes, partitioned

__all__ = ["rope_fwd", "rope_bwd"]


def _inputs(t, freqs, cu_seqlens):
    return [t, freqs] + ([cu_seqlens] if cu_seqlens is not None else [])


def rope_fwd(t, freqs, cu_seqlens, tensor_format: str, interleaved: bool):
    """y = rotary embedding of t (core/ops/rope.py ROPE_FWD); same bytes as twinengine.pytorch."""
    ROPE_FWD.plan(meta(t), meta(freqs), meta(cu_seqlens), tensor_format, interleaved)
    (y,) = _op(_rule("rope_fwd", t, freqs, cu_seqlens, tensor_format), ("fwd", tensor_format, interleaved),
               *_inputs(t, freqs, cu_seqlens))
    return y


def rope_bwd(dy, freqs, cu_seqlens, tensor_format: str, interleaved: bool):
    """dx = the transpose of rope_fwd applied to dy (core/ops/rope.py ROPE_BWD)."""
    ROPE_BWD.plan(meta(dy), meta(freqs), meta(cu_seqlens), tensor_format, interleaved)
    (dx,) = _op(_rule("rope_bwd", dy, freqs, cu_seqlens, tensor_format), ("bwd", tensor_format, interleaved),
                *_inputs(dy, freqs, cu_seqlens))
    return dx


def _rule(op: str, t, freqs, cu_seqlens, tensor_format: str) -> Rule:
    if tensor_format == "thd":
        dims = tuple(() for _ in t.shape)
        return Rule(op, (("t", dims), ("freqs", ((),) * 4), ("cu_seqlens", ((),))), (dims,), ())
    dims = (("s",), ("b",), ("h",), ("d",)) if tensor_format == "sbhd" else (("b",), ("s",), ("h",), ("d",))
    whole_seq = freqs.shape[0] == t.shape[dims.index(("s",))]
    freqs_dims = (("s",) if whole_seq else (), (), (), ())
    local = frozenset({"b", "h"} | ({"s"} if whole_seq else set()))
    inputs = (("t", dims), ("freqs", freqs_dims)) + ((("cu_seqlens", ((),)),) if cu_seqlens is not None else ())
    return Rule(op, inputs, (dims,), factor_sizes([(dims, t.shape)]), local=local)


def _shard(static, sizes, t, freqs, *cu_seqlens):
    which, tensor_format, interleaved = static
    cu = cu_seqlens[0] if cu_seqlens else None
    return ffi((ROPE_FWD if which == "fwd" else ROPE_BWD).plan(meta(t), meta(freqs), meta(cu), tensor_format,
                                                                interleaved), _inputs(t, freqs, cu))


_op = partitioned(_shard)

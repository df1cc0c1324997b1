"""twinengine.jax rope_fwd / rope_bwd over XLA FFI calls (no custom_vjp; jax_frontend/rope.py adds
it). Shapes, checks and errors come from core/ops/rope.py."""

from __future__ import annotations

from ...ops.rope import ROPE_BWD, ROPE_FWD
from .._library import ffi, meta

__all__ = ["rope_fwd", "rope_bwd"]


def _inputs(t, freqs, cu_seqlens):
    return [t, freqs] + ([cu_seqlens] if cu_seqlens is not None else [])


def rope_fwd(t, freqs, cu_seqlens, tensor_format: str, interleaved: bool):
    """y = rotary embedding of t (core/ops/rope.py ROPE_FWD); same bytes as twinengine.pytorch."""
    (y,) = ffi(ROPE_FWD.plan(meta(t), meta(freqs), meta(cu_seqlens), tensor_format, interleaved),
               _inputs(t, freqs, cu_seqlens))
    return y


def rope_bwd(dy, freqs, cu_seqlens, tensor_format: str, interleaved: bool):
    """dx = the transpose of rope_fwd applied to dy (core/ops/rope.py ROPE_BWD)."""
    (dx,) = ffi(ROPE_BWD.plan(meta(dy), meta(freqs), meta(cu_seqlens), tensor_format, interleaved),
                _inputs(dy, freqs, cu_seqlens))
    return dx

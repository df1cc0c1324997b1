"""torch.ops.twinengine.rope_fwd / rope_bwd, the autograd that links them, and the public
``apply_rotary_pos_emb`` (TE's name and arguments). Shapes, checks and errors come from
core/ops/rope.py; numerics: docs/numerics.md "Rotary position embedding"."""

from __future__ import annotations

import torch

from ...ops.rope import OP, ROPE_BWD, ROPE_FWD
from .._library import check_tensor_device, empty_outputs, launch, meta, surface_errors, tensor_fallback

__all__ = ["apply_rotary_pos_emb"]

_FORMAT_NAMES = ("sbhd", "bshd", "thd")


def _inputs(t, freqs, cu_seqlens):
    return [t, freqs] + ([cu_seqlens] if cu_seqlens is not None else [])


@torch.library.custom_op("twinengine::rope_fwd", mutates_args=())
def _rope_fwd(t: torch.Tensor, freqs: torch.Tensor, cu_seqlens: torch.Tensor | None, tensor_format: str,
              interleaved: bool) -> torch.Tensor:
    call = ROPE_FWD.cached_plan(meta(t), meta(freqs), meta(cu_seqlens), tensor_format, interleaved)
    (y,) = launch(call, _inputs(t, freqs, cu_seqlens), t.device)
    return y


@_rope_fwd.register_fake
def _(t, freqs, cu_seqlens, tensor_format, interleaved):
    (y,) = empty_outputs(ROPE_FWD.infer(meta(t), meta(freqs), meta(cu_seqlens), tensor_format, interleaved), t.device)
    return y


@torch.library.custom_op("twinengine::rope_bwd", mutates_args=())
def _rope_bwd(dy: torch.Tensor, freqs: torch.Tensor, cu_seqlens: torch.Tensor | None, tensor_format: str,
              interleaved: bool) -> torch.Tensor:
    call = ROPE_BWD.cached_plan(meta(dy), meta(freqs), meta(cu_seqlens), tensor_format, interleaved)
    (dx,) = launch(call, _inputs(dy, freqs, cu_seqlens), dy.device)
    return dx


@_rope_bwd.register_fake
def _(dy, freqs, cu_seqlens, tensor_format, interleaved):
    (dx,) = empty_outputs(ROPE_BWD.infer(meta(dy), meta(freqs), meta(cu_seqlens), tensor_format, interleaved),
                          dy.device)
    return dx


def _setup_context(ctx, inputs, output):
    _, freqs, cu_seqlens, tensor_format, interleaved = inputs
    ctx.save_for_backward(freqs, cu_seqlens)
    ctx.tensor_format = tensor_format
    ctx.interleaved = interleaved


def _backward(ctx, dy):
    freqs, cu_seqlens = ctx.saved_tensors
    dx = torch.ops.twinengine.rope_bwd(dy.contiguous(), freqs, cu_seqlens, ctx.tensor_format, ctx.interleaved)
    return dx, None, None, None, None


_rope_fwd.register_autograd(_backward, setup_context=_setup_context)


@surface_errors(tensor_fallback)  # the raise_error output has t's shape and dtype
def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                         interleaved: bool = False, fused: bool = True, cu_seqlens: torch.Tensor | None = None,
                         cp_size: int = 1, cp_rank: int = 0) -> torch.Tensor:
    """Rotary position embedding (TE's ``apply_rotary_pos_emb``): rotates the first
    ``freqs.shape[-1]`` channels of every head of `t` by the angles in `freqs`, passes the other
    channels through; differentiable in `t` (the backward rotates by the negative angle).

    Args:
        t: (s, b, h, d) for "sbhd", (b, s, h, d) for "bshd", (T, h, d) for "thd"; fp32/bf16/fp16.
        freqs: fp32 (S_f, 1, 1, d2) angles (``RotaryPositionEmbedding(...)(S_f)``), d2 even, <= d,
            S_f >= the sequence length; position p uses row p.
        tensor_format: "sbhd", "bshd" or "thd".
        interleaved: rotate adjacent channel pairs (2i, 2i+1) instead of the halves.
        fused: accepted for TE compatibility; there is one kernel.
        cu_seqlens: int32 (B + 1,) offsets of the packed sequences (required with "thd", only
            then); a token's position restarts at 0 in each sequence.
        cp_size, cp_rank: context parallelism is not supported (1 and 0 only).
    Returns:
        t's shape and dtype.
    Numerics: cos / sin per docs/numerics.md "Rotary position embedding"; each rotated channel
        fl(fl(x·cos) + fl(x'·sin)) in fp32, RNE to t's dtype; same bytes as ``twinengine.jax``, on
        CPU and CUDA, eager and compiled.
    Raises:
        TypeError / ValueError: bad format, dtypes, ranks, freqs wider than the head dimension or
            of odd width, a sequence longer than freqs, "thd" without cu_seqlens.
    """
    if cp_size != 1 or cp_rank != 0:
        raise ValueError(f"twinengine.{OP}: context parallelism (cp_size > 1) is not supported, got cp_size="
                         f"{cp_size!r}, cp_rank={cp_rank!r}")
    for name, x in (("t", t), ("freqs", freqs), ("cu_seqlens", cu_seqlens)):
        check_tensor_device(OP, name, x)
    ROPE_FWD.validate(meta(t), meta(freqs), meta(cu_seqlens), tensor_format, interleaved)
    return torch.ops.twinengine.rope_fwd(t, freqs, cu_seqlens, tensor_format, interleaved)

"""twinengine.jax apply_rotary_pos_emb (a custom_vjp over the rope_fwd / rope_bwd FFI ops) and
RotaryPositionEmbedding (the fp32 angles), with twinengine.pytorch's names, arguments and bytes.
jit-, grad- and vmap-clean. Errors come from core/ops/rope.py (same text as the torch frontend);
numerics: docs/numerics.md "Rotary position embedding"."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ..ops.rope import OP, ROPE_FWD, inv_freq, position_scale, validate_rotary_config
from ._library import meta
from ._ops.rope import rope_bwd, rope_fwd


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _rope(t, freqs, cu_seqlens, tensor_format, interleaved):
    return rope_fwd(t, freqs, cu_seqlens, tensor_format, interleaved)


def _rope_fwd_rule(t, freqs, cu_seqlens, tensor_format, interleaved):
    return rope_fwd(t, freqs, cu_seqlens, tensor_format, interleaved), (freqs, cu_seqlens)


def _rope_bwd_rule(tensor_format, interleaved, res, dy):
    freqs, cu_seqlens = res
    dx = rope_bwd(dy, freqs, cu_seqlens, tensor_format, interleaved)
    # freqs gets no gradient (as TE's fused kernel): a zero cotangent.
    return dx, jnp.zeros_like(freqs), None


_rope.defvjp(_rope_fwd_rule, _rope_bwd_rule)


def apply_rotary_pos_emb(t, freqs, tensor_format: str = "sbhd", interleaved: bool = False, fused: bool = True,
                         cu_seqlens=None, cp_size: int = 1, cp_rank: int = 0):
    """Rotary position embedding (TE's ``apply_rotary_pos_emb``), differentiable in `t`
    (custom_vjp; the backward rotates by the negative angle; `freqs` gets a zero cotangent).

    Arguments, shapes and guarantees as ``twinengine.pytorch.apply_rotary_pos_emb``: t (s, b, h, d)
    "sbhd" / (b, s, h, d) "bshd" / (T, h, d) "thd" with int32 cu_seqlens (B + 1,); freqs fp32
    (S_f, 1, 1, d2), d2 even <= d; channels >= d2 pass through. Same bytes as the torch frontend
    (one kernel). Under vmap the kernel runs once per batch element.
    Raises:
        TypeError / ValueError: from the shared core checks (same text as torch).
    """
    if cp_size != 1 or cp_rank != 0:
        raise ValueError(f"twinengine.{OP}: context parallelism (cp_size > 1) is not supported, got cp_size="
                         f"{cp_size!r}, cp_rank={cp_rank!r}")
    ROPE_FWD.validate(meta(t), meta(freqs), meta(cu_seqlens), tensor_format, interleaved)
    return _rope(t, freqs, cu_seqlens, tensor_format, interleaved)


class RotaryPositionEmbedding:
    """twinengine.pytorch.RotaryPositionEmbedding for JAX: ``RotaryPositionEmbedding(dim, ...)(max_seq_len,
    offset=0)`` returns the fp32 angles (max_seq_len, 1, 1, d2) with the same bytes (exact fp32 products
    of the shared inverse frequencies; max_seq_len and offset are Python ints, static under jit).
    ``inv_freq`` holds the (d2 / 2,) fp32 inverse frequencies (torch's buffer of that name).
    Raises:
        ValueError: as the torch module (shared checks).
    """

    def __init__(self, dim: int, rotary_percent: float = 1.0, seq_len_interpolation_factor: float | None = None,
                 pretrained_max_position_embeddings: int | None = None, rotary_base: float = 10000.0,
                 interleaved: bool = False):
        d2 = validate_rotary_config(dim, rotary_percent, seq_len_interpolation_factor, rotary_base,
                                    pretrained_max_position_embeddings)
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.rotary_base = rotary_base
        self.interleaved = bool(interleaved)
        self.inv_freq = inv_freq(d2, rotary_base)

    def __call__(self, max_seq_len: int, offset: int = 0):
        seq = np.arange(max_seq_len, dtype=np.float32) + np.float32(offset)
        scale = position_scale(max_seq_len, self.seq_len_interpolation_factor, self.pretrained_max_position_embeddings)
        if scale is not None:
            seq = seq * np.float32(scale)
        freqs = seq[:, None] * self.inv_freq[None, :]
        if self.interleaved:
            emb = np.stack((freqs, freqs), axis=-1).reshape(freqs.shape[0], -1)
        else:
            emb = np.concatenate((freqs, freqs), axis=-1)
        return jnp.asarray(emb.reshape(emb.shape[0], 1, 1, emb.shape[1]), dtype=jnp.float32)

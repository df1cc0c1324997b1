"""The rope family: rotary position embedding (TE's ``apply_rotary_pos_emb``), forward and
backward, and the inverse frequencies of ``RotaryPositionEmbedding``.

Each op is one :class:`OpDef`; both frontends call ``OP.plan(...)`` and never restate a shape, a
check or an error text. Numerics: docs/numerics.md, "Rotary position embedding" (cos / sin of the
fp32 angle evaluated in binary64 with +, −, × only and rounded once to fp32; each rotated channel
fl(fl(x·cos) + fl(x'·sin)); the backward its exact transpose).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import HIGH_PRECISION
from .opdef import KernelCall, OpDef, TensorSpec, dims, fail
from .quantize import ArrayMeta

# tensor_format -> TweRopeFormat (csrc/include/twinengine/rope.h).
FORMATS = {"sbhd": 0, "bshd": 1, "thd": 2}
OP = "apply_rotary_pos_emb"


def _validate(t: ArrayMeta, freqs: ArrayMeta, cu_seqlens: ArrayMeta | None, tensor_format: Any, interleaved: Any,
              name: str = "t") -> None:
    if not isinstance(tensor_format, str) or tensor_format not in FORMATS:
        fail(OP, ValueError, f"tensor_format must be 'sbhd', 'bshd' or 'thd', got {tensor_format!r}")
    if not isinstance(interleaved, bool):
        fail(OP, TypeError, f"interleaved must be a bool, got {type(interleaved).__name__}")
    if t.dtype not in HIGH_PRECISION:
        fail(OP, TypeError, f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    rank = 3 if tensor_format == "thd" else 4
    if len(t.shape) != rank:
        layout = "[t, h, d]" if rank == 3 else ("[s, b, h, d]" if tensor_format == "sbhd" else "[b, s, h, d]")
        fail(OP, ValueError, f"{name} must have rank {rank} ({layout}) for tensor_format {tensor_format!r}, got shape "
             f"{dims(t.shape)}")
    if freqs.dtype != "float32":
        fail(OP, TypeError, f"freqs must be float32 (the angles RotaryPositionEmbedding returns), got {freqs.dtype}")
    if len(freqs.shape) != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        fail(OP, ValueError, f"freqs must have shape (s, 1, 1, d2), got {dims(freqs.shape)}")
    d, d2 = t.shape[-1], freqs.shape[-1]
    if d2 > d:
        fail(OP, ValueError, f"freqs has {int(d2)} rotary channels (freqs.shape[-1]), more than the head dimension "
             f"of {name} ({int(d)})")
    if d2 % 2 != 0:
        fail(OP, ValueError, f"the rotary dimension freqs.shape[-1] = {int(d2)} must be even")
    if tensor_format == "thd":
        if cu_seqlens is None:
            fail(OP, ValueError, "tensor_format 'thd' needs cu_seqlens (int32 offsets of shape (batch + 1,))")
        if cu_seqlens.dtype != "int32":
            fail(OP, TypeError, f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
        if len(cu_seqlens.shape) != 1 or cu_seqlens.shape[0] < 2:
            fail(OP, ValueError, f"cu_seqlens must have shape (batch + 1,) with batch >= 1, got "
                 f"{dims(cu_seqlens.shape)}")
    else:
        if cu_seqlens is not None:
            fail(OP, ValueError, f"cu_seqlens is only used with tensor_format 'thd', got tensor_format "
                 f"{tensor_format!r}")
        s = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
        if s > freqs.shape[0]:
            fail(OP, ValueError, f"{name} has sequence length {int(s)}, longer than freqs ({int(freqs.shape[0])} "
                 "positions)")


def _infer(out_name: str):
    def infer(t: ArrayMeta, freqs: ArrayMeta, cu_seqlens: ArrayMeta | None, tensor_format: str,
              interleaved: bool) -> KernelCall:
        kernel = "rope_fwd" if out_name == "y" else "rope_bwd"
        inputs = ("t", "freqs") + (("cu_seqlens",) if cu_seqlens is not None else ())
        return KernelCall(kernel, inputs, (TensorSpec(out_name, tuple(t.shape), t.dtype),),
                          (("format", FORMATS[tensor_format]), ("interleaved", int(bool(interleaved)))))
    return infer


def _validate_bwd(dy: ArrayMeta, freqs: ArrayMeta, cu_seqlens: ArrayMeta | None, tensor_format: Any,
                  interleaved: Any) -> None:
    _validate(dy, freqs, cu_seqlens, tensor_format, interleaved, name="dy")


ROPE_FWD = OpDef(name="rope_fwd", args=("t", "freqs", "cu_seqlens"), attrs=("tensor_format", "interleaved"),
                 validate=_validate, infer=_infer("y"))
"""rope_fwd(t, freqs, cu_seqlens, tensor_format, interleaved) -> y (t's shape and dtype).

Shapes: t (s, b, h, d) sbhd / (b, s, h, d) bshd / (T, h, d) thd; freqs fp32 (S_f, 1, 1, d2), d2 even
<= d, S_f >= s (thd: >= the longest sequence, checked by the CPU kernel); cu_seqlens int32 (B + 1,)
with thd only. Channels i < d2 rotate (halves, or adjacent pairs when interleaved), the rest are
copied. Numerics: docs/numerics.md "Rotary position embedding"; CPU and CUDA give the same bytes.
"""

ROPE_BWD = OpDef(name="rope_bwd", args=("dy", "freqs", "cu_seqlens"), attrs=("tensor_format", "interleaved"),
                 validate=_validate_bwd, infer=_infer("dx"))
"""rope_bwd(dy, freqs, cu_seqlens, tensor_format, interleaved) -> dx: the exact transpose of rope_fwd
(rotation by the negative angle when freqs repeats each angle on both channels of a pair)."""


# ---- RotaryPositionEmbedding --------------------------------------------------------------------

def validate_rotary_config(dim: Any, rotary_percent: Any, seq_len_interpolation_factor: Any, rotary_base: Any,
                           pretrained_max_position_embeddings: Any = None) -> int:
    """Checks RotaryPositionEmbedding's arguments; returns the rotary dimension d2 = int(dim ·
    rotary_percent) (dim when rotary_percent == 1), which must be even and >= 2."""
    op = "RotaryPositionEmbedding"
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        fail(op, ValueError, f"dim must be a positive int, got {dim!r}")
    if isinstance(rotary_percent, bool) or not isinstance(rotary_percent, (int, float)) or not 0 < rotary_percent <= 1:
        fail(op, ValueError, f"rotary_percent must be in (0, 1], got {rotary_percent!r}")
    if seq_len_interpolation_factor is not None and (
            isinstance(seq_len_interpolation_factor, bool) or not isinstance(seq_len_interpolation_factor, (int, float))
            or not seq_len_interpolation_factor > 0):
        fail(op, ValueError, f"seq_len_interpolation_factor must be None or a positive number, got "
             f"{seq_len_interpolation_factor!r}")
    if isinstance(rotary_base, bool) or not isinstance(rotary_base, (int, float)) or not rotary_base > 0:
        fail(op, ValueError, f"rotary_base must be a positive number, got {rotary_base!r}")
    if pretrained_max_position_embeddings is not None and (
            isinstance(pretrained_max_position_embeddings, bool)
            or not isinstance(pretrained_max_position_embeddings, int) or pretrained_max_position_embeddings < 1):
        fail(op, ValueError, f"pretrained_max_position_embeddings must be None or a positive int, got "
             f"{pretrained_max_position_embeddings!r}")
    d2 = int(dim * rotary_percent) if rotary_percent < 1.0 else dim
    if d2 < 2 or d2 % 2 != 0:
        fail(op, ValueError, f"the rotary dimension int(dim * rotary_percent) = {d2} must be even and >= 2")
    return d2


def inv_freq(d2: int, rotary_base: float) -> np.ndarray:
    """TE's inverse frequencies 1 / base^(2j / d2), j < d2 / 2, as fp32 with one fixed rule:
    e_j = fl32(fl32(2j) / fl32(d2)); inv_j = fl32(1 / fl32(pow(double(fl32(base)), double(e_j)))),
    the pow in binary64 (C's pow, accurate well within one binary64 ulp) rounded once to fp32 and
    the reciprocal an fp32 division. Both frontends take these bytes from here."""
    exps = np.arange(0, d2, 2, dtype=np.float32) / np.float32(d2)
    base = np.float64(np.float32(rotary_base))
    powers = np.power(base, exps.astype(np.float64)).astype(np.float32)
    return (np.float32(1.0) / powers).astype(np.float32)


def position_scale(max_seq_len: int, seq_len_interpolation_factor: float | None,
                   pretrained_max_position_embeddings: int | None) -> float | None:
    """The factor TE multiplies the fp32 positions by (rounded to fp32 there), or None:
    1 / (max_seq_len / pretrained) when a pretrained length is set and max_seq_len exceeds
    pretrained · factor (dynamic linear scaling), else 1 / factor."""
    if seq_len_interpolation_factor is None:
        return None
    if (pretrained_max_position_embeddings is not None
            and max_seq_len > pretrained_max_position_embeddings * seq_len_interpolation_factor):
        return 1.0 / (max_seq_len / pretrained_max_position_embeddings)
    return 1.0 / seq_len_interpolation_factor

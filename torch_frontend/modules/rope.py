"""RotaryPositionEmbedding (TE's name and arguments): the fp32 angles that apply_rotary_pos_emb
rotates by. The inverse frequencies come from core/ops/rope.py (one rule for both frontends); the
forward is exact fp32 products, so eager, compiled and twinengine.jax give the same bytes."""

from __future__ import annotations

import torch

from ...ops.rope import inv_freq, position_scale, validate_rotary_config


class RotaryPositionEmbedding(torch.nn.Module):
    """TE's ``RotaryPositionEmbedding``: ``forward(max_seq_len, offset=0)`` returns the fp32 angles
    (max_seq_len, 1, 1, d2), d2 = int(dim · rotary_percent).

    Guarantees: angle[p, j] = fl32(pos_p · inv_freq[j mod d2/2]) (non-interleaved: the d2/2
    frequencies, then the same again; interleaved: each frequency twice in a row), pos_p =
    fl32(p + offset), times fl32(1 / seq_len_interpolation_factor) when a factor is given (TE's
    dynamic scaling when max_seq_len > pretrained_max_position_embeddings · factor); inv_freq per
    ``twinengine.ops.rope.inv_freq`` (a persistent buffer, as in TE). Same bytes as
    ``twinengine.jax.RotaryPositionEmbedding``.
    Raises:
        ValueError: dim not a positive int, rotary_percent outside (0, 1], an odd or zero rotary
            dimension, a non-positive base or factor.
    """

    def __init__(self, dim: int, rotary_percent: float = 1.0, seq_len_interpolation_factor: float | None = None,
                 pretrained_max_position_embeddings: int | None = None, rotary_base: float = 10000.0,
                 interleaved: bool = False, device: torch.device | str | None = None):
        super().__init__()
        d2 = validate_rotary_config(dim, rotary_percent, seq_len_interpolation_factor, rotary_base,
                                    pretrained_max_position_embeddings)
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.rotary_base = rotary_base
        self.interleaved = bool(interleaved)
        self.register_buffer("inv_freq", torch.from_numpy(inv_freq(d2, rotary_base)).to(device))

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        seq = torch.arange(max_seq_len, device=self.inv_freq.device, dtype=torch.float32) + offset
        scale = position_scale(max_seq_len, self.seq_len_interpolation_factor, self.pretrained_max_position_embeddings)
        if scale is not None:
            seq = seq * scale  # fl32(pos · fl32(scale)), as TE's `seq *= 1 / factor`
        freqs = seq[:, None] * self.inv_freq[None, :]
        if self.interleaved:
            emb = torch.stack((freqs, freqs), dim=-1).reshape(freqs.shape[0], -1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb.reshape(emb.shape[0], 1, 1, emb.shape[1])

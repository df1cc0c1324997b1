"""twinengine.pytorch.Fp8Padding / Fp8Unpadding: pad each expert's row block to the row
alignment a quantized grouped GEMM needs, and strip the padding again (TE's modules, with
``m_splits`` as a tensor and static output sizes)."""

from __future__ import annotations

from typing import Sequence

import torch

from ...ops.permute import recipe_row_alignment
from .._ops.permute import moe_pad_splits, moe_unpad_splits
from ..autocast import current_recipe


def _align(align_size: int | None) -> int:
    """The given alignment, or the active autocast recipe's row alignment (1 outside autocast)."""
    return align_size if align_size is not None else recipe_row_alignment(current_recipe())


class Fp8Padding(torch.nn.Module):
    """Pads each of ``num_gemms`` consecutive row blocks with zero rows to a multiple of
    ``align_size`` (default: the active recipe's row alignment, 16 FP8, 32 MXFP8 / NVFP4, 128
    FP8 block): ``padded, padded_m_splits = pad(x, m_splits)``.

    Shapes / Numerics / Raises: as ``twinengine.pytorch.moe_pad_splits``.
    """

    def __init__(self, num_gemms: int, align_size: int | None = None) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.align_size = align_size

    def forward(self, inp: torch.Tensor, m_splits: torch.Tensor | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return moe_pad_splits(inp, m_splits, _align(self.align_size))


class Fp8Unpadding(torch.nn.Module):
    """Inverse of :class:`Fp8Padding`: ``x = unpad(padded, m_splits, num_rows)`` keeps the first
    m_splits[g] rows of each padded block (num_rows = Σ m_splits, defaulting to that sum when
    m_splits is a list of ints).

    Shapes / Numerics / Raises: as ``twinengine.pytorch.moe_unpad_splits``.
    """

    def __init__(self, num_gemms: int, align_size: int | None = None) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.align_size = align_size

    def forward(self, inp: torch.Tensor, m_splits: torch.Tensor | Sequence[int],
                num_rows: int | None = None) -> torch.Tensor:
        if num_rows is None:
            num_rows = sum(m_splits) if not isinstance(m_splits, torch.Tensor) else None
        return moe_unpad_splits(inp, m_splits, _align(self.align_size), num_rows)

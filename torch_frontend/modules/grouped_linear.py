"""twinengine.pytorch.GroupedLinear: G expert Linears over consecutive row blocks of one input."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ...ops.gemm import check_m_splits
from ...ops.quantize import ArrayMeta
from .._ops.grouped_linear import grouped_linear


class GroupedLinear(torch.nn.Module):
    """``y = layer(x, m_splits)``: rows [Σ_{j<g} m_splits[j], …+m_splits[g]) of x go through
    expert g, y_g = x_g · weight{g}ᵀ + bias{g} (TE's GroupedLinear and parameter names
    ``weight0 … weight{G-1}``, ``bias0 …``, so TE checkpoints load).

    Shapes: weight{g} (out_features, in_features); bias{g} (out_features,); x (..., in_features);
        m_splits (num_gemms,) int tensor (no host sync, no recompile for a new split) or ints.
    Dtypes: parameters in ``params_dtype`` (fp32 / bf16 / fp16).
    Numerics / Raises: as ``twinengine.pytorch.grouped_linear`` (each expert's rows give the
        bytes of ``twinengine.pytorch.Linear`` with that expert's parameters).
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True, *,
                 params_dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = bias
        for g in range(num_gemms):
            self.register_parameter(f"weight{g}", torch.nn.Parameter(
                torch.empty(out_features, in_features, dtype=params_dtype, device=device)))
            self.register_parameter(f"bias{g}", torch.nn.Parameter(
                torch.empty(out_features, dtype=params_dtype, device=device)) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.Linear's initialisation per expert (from torch's global RNG)."""
        bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
        for g in range(self.num_gemms):
            torch.nn.init.kaiming_uniform_(getattr(self, f"weight{g}"), a=math.sqrt(5))
            if self.use_bias:
                torch.nn.init.uniform_(getattr(self, f"bias{g}"), -bound, bound)

    def weights(self) -> list[torch.Tensor]:
        return [getattr(self, f"weight{g}") for g in range(self.num_gemms)]

    def biases(self) -> list[torch.Tensor] | None:
        return [getattr(self, f"bias{g}") for g in range(self.num_gemms)] if self.use_bias else None

    def forward(self, x: torch.Tensor, m_splits: torch.Tensor | Sequence[int]) -> torch.Tensor:
        if isinstance(m_splits, torch.Tensor):
            check_m_splits(ArrayMeta(tuple(m_splits.shape), "int32"), self.num_gemms)
        elif len(m_splits) != self.num_gemms:
            check_m_splits(ArrayMeta((len(m_splits),), "int32"), self.num_gemms)
        return grouped_linear(x, self.weights(), m_splits, self.biases())

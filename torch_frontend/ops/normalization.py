"""Basic ops LayerNorm, RMSNorm and L2Normalization (NUMERICS.md §11), TE's names.

Each norm's kernel can also write the quantized input of the op after it (a Quantize op, or a
BasicLinear under autocast): the plan passes it that op's quantizer, and the output is first
rounded to x's dtype, then quantized — the same bytes as norm-then-quantize.
"""

from __future__ import annotations

from typing import Any

import torch

from ...fusion.ops import OpDesc, check_eps, check_features, check_input_kind, check_param_shape, normalized_features
from .._ops.norm import l2norm_bwd, l2norm_fwd, layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd
from .op import BasicOperation


def _output(y, qt):
    return qt if qt is not None else y


class LayerNorm(BasicOperation):
    """y = fl(fl(x̂ · g') + β) per row over the last dimension (NUMERICS.md §11).

    Shapes: weight, bias (normalized_shape,); x (..., normalized_shape); y like x.
    Dtypes: y in x's dtype; parameters any high-precision dtype (widened exactly).
    Numerics: canonical 32-lane sums; ``zero_centered_gamma``: g' = fl(1 + γ) (weight init 0).
    """

    param_names = ("weight", "bias")

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, *, zero_centered_gamma: bool = False,
                 device: Any = None, dtype: torch.dtype = torch.float32, own_params: bool = True) -> None:
        super().__init__()
        self.normalized_shape = normalized_features("LayerNorm", normalized_shape)
        self.eps = check_eps("LayerNorm", eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        if own_params:
            init = torch.zeros if self.zero_centered_gamma else torch.ones
            self.weight = torch.nn.Parameter(init(self.normalized_shape, dtype=dtype, device=device))
            self.bias = torch.nn.Parameter(torch.zeros(self.normalized_shape, dtype=dtype, device=device))

    def describe(self) -> OpDesc:
        return OpDesc("layernorm", "LayerNorm")

    def op_forward_compute(self, x, params, *, quantizer=None, scale=None, rng=None):
        weight, bias = params
        check_param_shape("LayerNorm", "weight", weight.shape, (self.normalized_shape,))
        check_param_shape("LayerNorm", "bias", bias.shape, (self.normalized_shape,))
        check_input_kind("LayerNorm", not isinstance(x, torch.Tensor), False)
        y, mu, rstd, qt = layernorm_fwd(x, weight, bias, self.eps, self.zero_centered_gamma, quantizer=quantizer,
                                        scale=scale, rng=rng)
        return _output(y, qt), (x, mu, rstd, weight)

    def op_backward(self, ctx, dy):
        x, mu, rstd, weight = ctx.saved
        dx, dweight, dbias = layernorm_bwd(dy, x, mu, rstd, weight, self.zero_centered_gamma)
        return dx, (dweight, dbias)


class RMSNorm(BasicOperation):
    """y = fl(x̂ · g'), x̂ = fl(x · rstd), rstd from the mean square (NUMERICS.md §11).

    Shapes, dtypes and ``zero_centered_gamma`` as LayerNorm (no bias).
    """

    param_names = ("weight",)

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, *, zero_centered_gamma: bool = False,
                 device: Any = None, dtype: torch.dtype = torch.float32, own_params: bool = True) -> None:
        super().__init__()
        self.normalized_shape = normalized_features("RMSNorm", normalized_shape)
        self.eps = check_eps("RMSNorm", eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        if own_params:
            init = torch.zeros if self.zero_centered_gamma else torch.ones
            self.weight = torch.nn.Parameter(init(self.normalized_shape, dtype=dtype, device=device))

    def describe(self) -> OpDesc:
        return OpDesc("rmsnorm", "RMSNorm")

    def op_forward_compute(self, x, params, *, quantizer=None, scale=None, rng=None):
        (weight,) = params
        check_param_shape("RMSNorm", "weight", weight.shape, (self.normalized_shape,))
        check_input_kind("RMSNorm", not isinstance(x, torch.Tensor), False)
        y, rstd, qt = rmsnorm_fwd(x, weight, self.eps, self.zero_centered_gamma, quantizer=quantizer, scale=scale,
                                  rng=rng)
        return _output(y, qt), (x, rstd, weight)

    def op_backward(self, ctx, dy):
        x, rstd, weight = ctx.saved
        dx, dweight = rmsnorm_bwd(dy, x, rstd, weight, self.zero_centered_gamma)
        return dx, (dweight,)


class L2Normalization(BasicOperation):
    """y = fl(x · rstd), rstd = 1 / sqrt(Σc x² + ε) per row (NUMERICS.md §11); no parameters."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = check_eps("L2Normalization", eps)

    def describe(self) -> OpDesc:
        return OpDesc("l2norm", "L2Normalization")

    def op_forward_compute(self, x, params, *, quantizer=None, scale=None, rng=None):
        check_input_kind("L2Normalization", not isinstance(x, torch.Tensor), False)
        y, rstd, qt = l2norm_fwd(x, self.eps, quantizer=quantizer, scale=scale, rng=rng)
        return _output(y, qt), (x, rstd)

    def op_backward(self, ctx, dy):
        x, rstd = ctx.saved
        return l2norm_bwd(dy, x, rstd), ()

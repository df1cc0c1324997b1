"""JAX basic ops LayerNorm, RMSNorm and L2Normalization (twinengine.pytorch.ops' twins, NUMERICS.md §11)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ...fusion.ops import OpDesc, check_eps, check_features, check_input_kind, check_param_shape, normalized_features
from ...quantized_tensor import QuantizedTensor
from .._ops.norm import l2norm_bwd, l2norm_fwd, layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd
from .op import BasicOperation


class LayerNorm(BasicOperation):
    """Params: (weight, bias), each (normalized_shape,). Same numerics as the torch op."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, *, zero_centered_gamma: bool = False) -> None:
        self.normalized_shape = normalized_features("LayerNorm", normalized_shape)
        self.eps = check_eps("LayerNorm", eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)

    def describe(self) -> OpDesc:
        return OpDesc("layernorm", "LayerNorm")

    def init_params(self, key, dtype):
        init = jnp.zeros if self.zero_centered_gamma else jnp.ones
        return (init((self.normalized_shape,), dtype), jnp.zeros((self.normalized_shape,), dtype))

    def op_forward_compute(self, x, params, *, quantizer=None, scale=None, rng=None):
        weight, bias = params
        check_param_shape("LayerNorm", "weight", weight.shape, (self.normalized_shape,))
        check_param_shape("LayerNorm", "bias", bias.shape, (self.normalized_shape,))
        check_input_kind("LayerNorm", isinstance(x, QuantizedTensor), False)
        y, mu, rstd, qt = layernorm_fwd(x, weight, bias, self.eps, self.zero_centered_gamma, quantizer=quantizer,
                                        scale=scale, rng=rng)
        return (qt if qt is not None else y), (x, mu, rstd, weight)

    def op_backward(self, ctx, dy):
        x, mu, rstd, weight = ctx.saved
        dx, dweight, dbias = layernorm_bwd(dy, x, mu, rstd, weight, self.zero_centered_gamma)
        return dx, (dweight, dbias)


class RMSNorm(BasicOperation):
    """Params: (weight (normalized_shape,),). Same numerics as the torch op."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, *, zero_centered_gamma: bool = False) -> None:
        self.normalized_shape = normalized_features("RMSNorm", normalized_shape)
        self.eps = check_eps("RMSNorm", eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)

    def describe(self) -> OpDesc:
        return OpDesc("rmsnorm", "RMSNorm")

    def init_params(self, key, dtype):
        init = jnp.zeros if self.zero_centered_gamma else jnp.ones
        return (init((self.normalized_shape,), dtype),)

    def op_forward_compute(self, x, params, *, quantizer=None, scale=None, rng=None):
        (weight,) = params
        check_param_shape("RMSNorm", "weight", weight.shape, (self.normalized_shape,))
        check_input_kind("RMSNorm", isinstance(x, QuantizedTensor), False)
        y, rstd, qt = rmsnorm_fwd(x, weight, self.eps, self.zero_centered_gamma, quantizer=quantizer, scale=scale,
                                  rng=rng)
        return (qt if qt is not None else y), (x, rstd, weight)

    def op_backward(self, ctx, dy):
        x, rstd, weight = ctx.saved
        dx, dweight = rmsnorm_bwd(dy, x, rstd, weight, self.zero_centered_gamma)
        return dx, (dweight,)


class L2Normalization(BasicOperation):
    """No params. Same numerics as the torch op."""

    def __init__(self, eps: float = 1e-6) -> None:
        self.eps = check_eps("L2Normalization", eps)

    def describe(self) -> OpDesc:
        return OpDesc("l2norm", "L2Normalization")

    def op_forward_compute(self, x, params, *, quantizer=None, scale=None, rng=None):
        check_input_kind("L2Normalization", isinstance(x, QuantizedTensor), False)
        y, rstd, qt = l2norm_fwd(x, self.eps, quantizer=quantizer, scale=scale, rng=rng)
        return (qt if qt is not None else y), (x, rstd)

    def op_backward(self, ctx, dy):
        x, rstd = ctx.saved
        return l2norm_bwd(dy, x, rstd), ()

"""Flax (linen) modules over the block functions: LayerNorm, RMSNorm, LayerNormDenseGeneral and
LayerNormMLP (TE-JAX names), re-exported by ``twinengine.jax.flax``.

Parameters use the torch modules' names and layouts (``weight`` (out, in), ``fc1_weight``, ...),
so ``twinengine.jax.blocks.params_from_torch(module.state_dict())`` gives the ``"params"``
collection of the same block and both frameworks give the same bytes. DelayedScaling state lives
in the ``"fp8_meta"`` collection (one entry per Linear) under the same contract as
``twinengine.jax.flax.Dense``; stochastic rounding draws [seed, offset] from the
``"stochastic_rounding"`` RNG stream unless ``rngs=`` is given.

Differences from TE-JAX's modules of the same names: the norm is chosen with
``normalization="LayerNorm"|"RMSNorm"`` (TE-JAX: ``layernorm_type``), the activation with one name
from ``twinengine.ops.activation.ACTIVATIONS`` (TE-JAX: an ``activations`` tuple such as
``("silu", "linear")`` for SwiGLU), and a call returns ``out`` — ``(out, ln_out)`` only with
``return_layernorm_output=True`` (TE-JAX always returns the pair).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..fusion.blocks import mlp_widths, normalization_kind
from ..linear import linear_quantizers
from ..recipe import DelayedScaling, Recipe
from ..te_migration import as_recipe
from ._ops.dense import delayed_scaling_state
from .autocast import current_recipe
from .blocks import layernorm, layernorm_dense, layernorm_mlp, rmsnorm

FP8_META = "fp8_meta"


def _lecun(key, shape, dtype):
    """Kernel init in torch layout (out, in): variance 1 / fan_in."""
    return nn.initializers.lecun_normal(in_axis=1, out_axis=0)(key, shape, dtype)


def _axes(module: nn.Module, init, *names: str):
    """`init` with logical axis names (``nn.with_logical_partitioning``) when the module has
    ``logical_axes=True``: "embed" for the hidden dimension, "mlp" for the projected one
    (TE-JAX's names); users map them to mesh axes with ``nn.logical_axis_rules``. The params
    are then ``nn.LogicallyPartitioned`` boxes (``nn.unbox`` / ``nn.get_partition_spec``)."""
    return nn.with_logical_partitioning(init, names) if module.logical_axes else init


class LayerNorm(nn.Module):
    """LayerNorm (or RMSNorm with ``normalization="RMSNorm"``) over the last dimension.
    Params: ``weight``, ``bias`` (LayerNorm only)."""

    epsilon: float = 1e-5
    normalization: str = "LayerNorm"
    zero_centered_gamma: bool = False
    param_dtype: Any = jnp.float32
    logical_axes: bool = False

    @nn.compact
    def __call__(self, x):
        hidden = x.shape[-1]
        init = nn.initializers.zeros if self.zero_centered_gamma else nn.initializers.ones
        weight = self.param("weight", _axes(self, init, "embed"), (hidden,), self.param_dtype)
        if normalization_kind(self.normalization) == "rmsnorm":
            return rmsnorm(x, weight, self.epsilon, zero_centered_gamma=self.zero_centered_gamma)
        bias = self.param("bias", _axes(self, nn.initializers.zeros, "embed"), (hidden,), self.param_dtype)
        return layernorm(x, weight, bias, self.epsilon, zero_centered_gamma=self.zero_centered_gamma)


class _NormBlock(nn.Module):
    """Shared parameter / state / rng handling of LayerNormDenseGeneral and LayerNormMLP."""

    def _norm_params(self, hidden: int) -> dict:
        init = nn.initializers.zeros if self.zero_centered_gamma else nn.initializers.ones
        params = {"layer_norm_weight": self.param("layer_norm_weight", _axes(self, init, "embed"), (hidden,), self.param_dtype)}
        if normalization_kind(self.normalization) == "layernorm":
            params["layer_norm_bias"] = self.param("layer_norm_bias", _axes(self, nn.initializers.zeros, "embed"), (hidden,),
                                                   self.param_dtype)
        return params

    def _call_state(self, names: tuple[str, ...], rngs):
        recipe: Recipe | None = self.recipe if self.recipe is not None else current_recipe()
        state_vars = None
        if recipe is not None:
            recipe = as_recipe(recipe, type(self).__name__)  # a TransformerEngine recipe, converted
            qs = linear_quantizers(recipe)
            if qs.needs_rng and rngs is None:
                rngs = {n: jax.random.bits(self.make_rng("stochastic_rounding"), (2,), jnp.uint32) for n in names}
            if isinstance(recipe, DelayedScaling):
                state_vars = {n: self.variable(FP8_META, n, delayed_scaling_state, recipe.amax_history_len)
                              for n in names}
        return recipe, state_vars, rngs

    @staticmethod
    def _finish(out, state_vars):
        if state_vars is None:
            return out
        out, new_state = out
        for name, var in state_vars.items():
            if var.is_mutable():
                var.value = new_state[name]
        return out


class LayerNormDenseGeneral(_NormBlock):
    """Norm then Dense — tep.LayerNormLinear's twin. Params: ``layer_norm_weight``,
    ``layer_norm_bias`` (LayerNorm), ``weight`` (features, K), ``bias`` (features,)."""

    features: int
    use_bias: bool = True
    epsilon: float = 1e-5
    normalization: str = "LayerNorm"
    zero_centered_gamma: bool = False
    return_layernorm_output: bool = False
    recipe: Recipe | None = None
    param_dtype: Any = jnp.float32
    logical_axes: bool = False

    @nn.compact
    def __call__(self, x, rngs=None):
        params = self._norm_params(x.shape[-1])
        params["weight"] = self.param("weight", _axes(self, _lecun, "mlp", "embed"), (self.features, x.shape[-1]), self.param_dtype)
        if self.use_bias:
            params["bias"] = self.param("bias", _axes(self, nn.initializers.zeros, "mlp"), (self.features,), self.param_dtype)
        recipe, state_vars, rngs = self._call_state(("linear",), rngs)
        out = layernorm_dense(x, params, normalization=self.normalization, eps=self.epsilon,
                              zero_centered_gamma=self.zero_centered_gamma,
                              return_layernorm_output=self.return_layernorm_output,
                              state=None if state_vars is None else {k: v.value for k, v in state_vars.items()},
                              rngs=rngs, recipe=recipe)
        return self._finish(out, state_vars)


class LayerNormMLP(_NormBlock):
    """Norm → FC1 → activation → FC2 — tep.LayerNormMLP's twin. Params: ``layer_norm_weight``,
    ``layer_norm_bias`` (LayerNorm), ``fc1_weight``, ``fc1_bias``, ``fc2_weight``, ``fc2_bias``."""

    intermediate_dim: int
    use_bias: bool = True
    activation: str = "gelu"
    activation_params: dict | None = None
    epsilon: float = 1e-5
    normalization: str = "LayerNorm"
    zero_centered_gamma: bool = False
    return_layernorm_output: bool = False
    recipe: Recipe | None = None
    param_dtype: Any = jnp.float32
    logical_axes: bool = False

    @nn.compact
    def __call__(self, x, rngs=None):
        hidden = x.shape[-1]
        fc1_width = mlp_widths(self.activation, self.intermediate_dim)
        params = self._norm_params(hidden)
        params["fc1_weight"] = self.param("fc1_weight", _axes(self, _lecun, "mlp", "embed"), (fc1_width, hidden), self.param_dtype)
        params["fc2_weight"] = self.param("fc2_weight", _axes(self, _lecun, "embed", "mlp"), (hidden, self.intermediate_dim), self.param_dtype)
        if self.use_bias:
            params["fc1_bias"] = self.param("fc1_bias", _axes(self, nn.initializers.zeros, "mlp"), (fc1_width,), self.param_dtype)
            params["fc2_bias"] = self.param("fc2_bias", _axes(self, nn.initializers.zeros, "embed"), (hidden,), self.param_dtype)
        recipe, state_vars, rngs = self._call_state(("fc1", "fc2"), rngs)
        out = layernorm_mlp(x, params, normalization=self.normalization, activation=self.activation,
                            eps=self.epsilon, zero_centered_gamma=self.zero_centered_gamma,
                            return_layernorm_output=self.return_layernorm_output,
                            activation_params=self.activation_params,
                            state=None if state_vars is None else {k: v.value for k, v in state_vars.items()},
                            rngs=rngs, recipe=recipe)
        return self._finish(out, state_vars)

"""twinengine.jax.flax: Flax (linen) modules over twinengine.jax.dense.

Parameters live in the ``"params"`` collection as usual. DelayedScaling state (NUMERICS.md §3)
lives in the ``"fp8_meta"`` collection and moves exactly as the torch Linear's buffers do:

- **Forward** (the forward slots: input and weight amax histories and scales):
  ``model.apply(variables, x, mutable=["fp8_meta"])`` returns the state after the forward
  pass, as Flax users expect from a mutable collection (``init`` does not advance it).
- **Backward** (the grad_output slot): its amax exists only in the backward pass, which a
  forward's mutable outputs cannot carry. ``dense``'s contract carries it: the gradient of the
  loss with respect to ``"fp8_meta"`` *is* the complete next state (forward slots from the
  forward pass, grad slot from the backward pass). So a training step differentiates with
  respect to both collections and *replaces* the state with its gradient, never feeding it to
  the optimizer. Taking the state from ``mutable`` alone in a training loop would leave the
  grad slot at its initial scale; take it from the gradient::

    def loss_fn(params, fp8_meta):
        y = model.apply({"params": params, "fp8_meta": fp8_meta}, x)   # mutable=... is optional here
        return jnp.mean((y - target) ** 2)

    loss, (param_grads, next_fp8_meta) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, fp8_meta)
    updates, opt_state = optimizer.update(param_grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    fp8_meta = next_fp8_meta                    # same bytes as the torch Linear's buffers

  For forward-only loops (evaluation, calibration) take it from ``mutable=["fp8_meta"]``.

Importing this module needs flax; ``import twinengine.jax`` alone does not.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..linear import linear_quantizers
from ..recipe import DelayedScaling, Recipe
from ..te_migration import as_recipe
from .autocast import current_recipe
from ._ops.dense import delayed_scaling_state, dense
from ._ops.grouped_dense import grouped_delayed_scaling_state, grouped_dense

FP8_META = "fp8_meta"
"""Variable collection holding each Dense's DelayedScaling state."""


class Dense(nn.Module):
    """y = x · kernel + bias, quantized by `recipe` (or the innermost ``twinengine.jax.autocast``
    region when `recipe` is None); high precision when neither gives a recipe.

    Shapes: x (..., K) -> y (..., features); kernel (K, features); bias (features,).
    Dtypes: parameters in `param_dtype`; x's dtype is the compute and output dtype (the
        kernel is cast to it, as flax.linen.Dense does).
    Numerics: exactly ``twinengine.jax.dense`` (bit-identical to twinengine.pytorch.Linear).
    Randomness: recipes with stochastic rounding (NVFP4 gradients) take ``rng`` (uint32 [seed,
        offset]) from the call, or draw one from the module's ``"stochastic_rounding"`` RNG stream.
    Sharding: with ``logical_axes=True`` kernel / bias carry logical axis names
        (``nn.with_logical_partitioning``, boxed params): ``kernel_axes`` (default
        ``("embed", "mlp")``), the bias its last name; map them to mesh axes with
        ``nn.logical_axis_rules`` / ``nn.logical_to_mesh_sharding``.
    Raises:
        TypeError / ValueError: unsupported recipe, as ``dense``.
    """

    features: int
    use_bias: bool = True
    recipe: Recipe | None = None
    param_dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal()
    bias_init: Callable = nn.initializers.zeros_init()
    kernel_axes: tuple[str | None, ...] = ("embed", "mlp")
    logical_axes: bool = False

    def _axes(self, init: Callable, names: tuple) -> Callable:
        return nn.with_logical_partitioning(init, names) if self.logical_axes else init

    @nn.compact
    def __call__(self, x, rng=None):
        kernel = self.param("kernel", self._axes(self.kernel_init, self.kernel_axes),
                            (x.shape[-1], self.features), self.param_dtype)
        bias = (self.param("bias", self._axes(self.bias_init, self.kernel_axes[-1:]),
                           (self.features,), self.param_dtype) if self.use_bias else None)
        kernel = kernel.astype(x.dtype)
        bias = None if bias is None else bias.astype(x.dtype)
        recipe = self.recipe if self.recipe is not None else current_recipe()
        if recipe is None:
            return dense(x, kernel, bias)
        recipe = as_recipe(recipe, "Dense")  # a TransformerEngine recipe, converted
        if rng is None and linear_quantizers(recipe).needs_rng:
            rng = jax.random.bits(self.make_rng("stochastic_rounding"), (2,), jnp.uint32)
        if isinstance(recipe, DelayedScaling):
            state = self.variable(FP8_META, "delayed_scaling", delayed_scaling_state, recipe.amax_history_len)
            y, state_after_forward = dense(x, kernel, bias, recipe=recipe, state=state.value, rng=rng)
            if self.is_mutable_collection(FP8_META) and not self.is_initializing():
                state.value = state_after_forward  # what the torch Linear's buffers hold after its forward
            return y
        return dense(x, kernel, bias, recipe=recipe, rng=rng)


class GroupedDense(nn.Module):
    """``y = module(x, group_sizes)``: rows of group g go through expert g, y_g = x_g · kernel[g]
    + bias[g] (the Flax form of twinengine.pytorch.GroupedLinear).

    Shapes: x (..., K) -> y (..., features); kernel (num_gemms, K, features); bias
        (num_gemms, features); group_sizes (num_gemms,) int (traced: no recompile per split).
    Dtypes: parameters in `param_dtype`, cast to x's dtype for the compute.
    Numerics / Raises: exactly ``twinengine.jax.grouped_dense`` under the innermost
        ``twinengine.jax.autocast`` recipe (high precision without one).
    State: under DelayedScaling, ``grouped_delayed_scaling_state(num_gemms, L)`` in the
        ``"fp8_meta"`` collection (variable ``"delayed_scaling"``), moving as ``Dense``'s does
        (forward slots via ``mutable=["fp8_meta"]``, the complete next state as the gradient
        with respect to the collection) — the bytes of twinengine.pytorch.GroupedLinear's buffers.
    Randomness: as ``Dense``: recipes with stochastic rounding (NVFP4 gradients) take ``rng``
        ([seed, offset]; expert g rounds with [seed, offset + g]), else draw it from the
        ``"stochastic_rounding"`` Flax RNG stream.
    """

    num_gemms: int
    features: int
    use_bias: bool = True
    param_dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal(batch_axis=(0,))
    bias_init: Callable = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x, group_sizes, rng=None):
        kernel = self.param("kernel", self.kernel_init, (self.num_gemms, x.shape[-1], self.features), self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.num_gemms, self.features), self.param_dtype)
                if self.use_bias else None)
        kernel = kernel.astype(x.dtype)
        bias = None if bias is None else bias.astype(x.dtype)
        recipe = current_recipe()
        if isinstance(recipe, DelayedScaling):
            state = self.variable(FP8_META, "delayed_scaling", grouped_delayed_scaling_state, self.num_gemms,
                                  recipe.amax_history_len)
            y, state_after_forward = grouped_dense(x, kernel, group_sizes, bias, state=state.value)
            if self.is_mutable_collection(FP8_META) and not self.is_initializing():
                state.value = state_after_forward
            return y
        if rng is None and recipe is not None and linear_quantizers(recipe).needs_rng:
            rng = jax.random.bits(self.make_rng("stochastic_rounding"), (2,), jnp.uint32)
        return grouped_dense(x, kernel, group_sizes, bias, rng=rng)


from .flax_blocks import LayerNorm, LayerNormDenseGeneral, LayerNormMLP  # noqa: E402,F401  (block modules)
from .attention import DotProductAttention  # noqa: E402,F401  (attention module)
from .flax_transformer import MultiHeadAttention, TransformerLayer  # noqa: E402,F401  (transformer modules)

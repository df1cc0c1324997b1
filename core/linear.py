"""What a recipe means for one Linear layer: the quantizer of each GEMM operand role and, for
DelayedScaling, the state update parameters (NUMERICS.md §3, §8, §9). Shared by both
frontends so they pick the same quantizers and raise the same errors."""

from __future__ import annotations

import dataclasses

from .ops.opdef import dims, fail
from .quantizers import Quantizer
from .recipe import DelayedScaling, NVFP4BlockScaling, Recipe, int_field
from .te_migration import as_recipe, convert_te_recipe, is_te_recipe

_OP = "linear"

GEMM_SCALING_MODES = ("fp8_current", "fp8_delayed", "mxfp8", "fp8_block", "nvfp4")
"""Quantizer families the GEMM serves (both operands of one GEMM must share one)."""

_FAMILY = {"fp8_current": "fp8_per_tensor", "fp8_delayed": "fp8_per_tensor", "mxfp8": "mxfp8",
           "fp8_block": "fp8_block", "nvfp4": "nvfp4"}

FWD_SLOTS = ("input", "weight")
"""Columns of the forward delayed-scaling state (amax history (L, 2), scale (2,))."""


@dataclasses.dataclass(frozen=True)
class LinearQuantizers:
    """The quantizers of one Linear call under a recipe.

    Attributes:
        input / weight / grad_output: quantizer specs with both usages (rowwise for
            fprop/dgrad, columnwise for dgrad/wgrad).
        delayed: DelayedScaling: quantize with the state's scales and update the state.
        margin, amax_compute_algo, amax_history_len: the DelayedScaling parameters.
    """

    input: Quantizer
    weight: Quantizer
    grad_output: Quantizer
    delayed: bool = False
    margin: int = 0
    amax_compute_algo: str = "max"
    amax_history_len: int = 1

    @property
    def fwd_fp8_dtype(self) -> str:
        return getattr(self.input, "fp8_dtype", "e4m3")

    @property
    def bwd_fp8_dtype(self) -> str:
        return getattr(self.grad_output, "fp8_dtype", "e5m2")

    @property
    def needs_rng(self) -> bool:
        """The grad_output quantizer rounds stochastically: the call needs an rng [seed, offset]."""
        return bool(getattr(self.grad_output, "stochastic_rounding", False))


def linear_quantizers(recipe: Recipe, input_dtype: str | None = None) -> LinearQuantizers:
    """The quantizers a Linear uses under `recipe` (called at each call, so the recipe in force
    at that call decides).

    ``input_dtype`` (canonical name of x's dtype, which dy shares): NVFP4BlockScaling applies
    the RHT only to bfloat16 operands, where NUMERICS.md §7.8 defines it. For float32 / float16
    models its input and grad_output quantizers drop ``with_rht`` (RHT off), so they quantize
    exactly as ``NVFP4BlockScaling(disable_rht=True)`` would — bytes defined, no error.

    Raises:
        ValueError: a quantizer lacks the rowwise or the columnwise usage.
        TypeError: the recipe is neither a twinengine Recipe nor a TransformerEngine recipe
            (converted by ``twinengine.te_migration.convert_te_recipe``), or it gives quantizers the GEMM
            cannot combine (different families, a format with no GEMM kernel yet, or delayed
            quantizers from a CustomRecipe, which has no state parameters).
    """
    recipe = as_recipe(recipe, _OP)
    if isinstance(recipe, NVFP4BlockScaling) and input_dtype is not None and input_dtype != "bfloat16":
        recipe = NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=recipe.disable_stochastic_rounding,
                                   disable_2d_quantization=recipe.disable_2d_quantization)
    roles = {role: recipe.quantizer(role) for role in ("input", "weight", "grad_output")}
    delayed = isinstance(recipe, DelayedScaling)
    for role, q in roles.items():
        if not (q.rowwise and q.columnwise):
            fail(_OP, ValueError, f"{type(recipe).__name__} gives the {role} a quantizer without both usages "
                 f"(rowwise={q.rowwise}, columnwise={q.columnwise}); a trained Linear needs both")
        if q.scaling_mode not in GEMM_SCALING_MODES:
            fail(_OP, TypeError, f"{type(recipe).__name__} gives the {role} a {type(q).__name__}, which the GEMM does "
                 f"not support (supported: per-tensor FP8 current/delayed scaling, MXFP8, FP8 block, NVFP4)")
        if q.scaling_mode == "fp8_delayed" and not delayed:
            fail(_OP, TypeError, f"{type(recipe).__name__} gives the {role} a Float8DelayedScalingQuantizer; delayed "
                 "scaling needs the DelayedScaling recipe (it owns the amax history and scale state)")
    families = {_FAMILY[q.scaling_mode] for q in roles.values()}
    if len(families) != 1:
        fail(_OP, TypeError, f"{type(recipe).__name__} mixes quantizer families across roles "
             f"({', '.join(f'{r}={type(q).__name__}' for r, q in roles.items())}); every GEMM of a Linear "
             "pairs two of them, so they must share one family")
    if not delayed:
        return LinearQuantizers(**roles)
    return LinearQuantizers(**roles, delayed=True, margin=int_field(recipe, "margin"),
                            amax_compute_algo=recipe.amax_compute_algo,
                            amax_history_len=int_field(recipe, "amax_history_len"))


def for_input_dtype(quantizers: LinearQuantizers, input_dtype: str) -> LinearQuantizers:
    """`quantizers` (made without an input dtype) for x of `input_dtype`: NVFP4's RHT dropped
    from the input and grad_output quantizers for non-bfloat16 operands — the quantizers
    ``linear_quantizers(recipe, input_dtype)`` gives (for callers that learn the dtype after
    choosing the quantizers, e.g. a basic op's op_call)."""
    if input_dtype == "bfloat16" or not getattr(quantizers.input, "with_rht", False):
        return quantizers
    return dataclasses.replace(quantizers, input=dataclasses.replace(quantizers.input, with_rht=False),
                               grad_output=dataclasses.replace(quantizers.grad_output, with_rht=False))


def check_autocast_recipe(enabled: bool, recipe: object) -> object:
    """The recipe an autocast region keeps: `recipe`, converted to twinengine's when it is a
    TransformerEngine recipe. Raises TypeError when an enabled region is given neither."""
    if enabled and is_te_recipe(recipe):
        return convert_te_recipe(recipe)
    if enabled and not isinstance(recipe, Recipe):
        fail("autocast", TypeError, f"enabled=True needs recipe= a twinengine.recipe.Recipe (or a "
             f"transformer_engine.common.recipe object), got {type(recipe).__name__}")
    return recipe


def check_delayed_state(history_len: int | None, quantizers: LinearQuantizers) -> None:
    """Raises ValueError when DelayedScaling has no layer state (history_len None) or a state
    whose length differs from the recipe's."""
    if history_len is None:
        fail(_OP, ValueError, "DelayedScaling needs the layer's delayed-scaling state (amax histories and scales): "
             "twinengine.pytorch.Linear keeps it in buffers (delayed_state= for the functional linear); "
             "twinengine.jax.dense takes state=twinengine.jax.delayed_scaling_state(...)")
    if history_len != quantizers.amax_history_len:
        fail(_OP, ValueError, f"DelayedScaling(amax_history_len={quantizers.amax_history_len}) does not match the "
             f"layer's delayed-scaling state of length {int(history_len)}; create the layer (or its state) with "
             f"amax_history_len={quantizers.amax_history_len}")


def check_rng(quantizers: LinearQuantizers, has_rng: bool) -> None:
    """Raises ValueError when stochastic rounding lacks an rng (NUMERICS.md §7 step 9)."""
    if quantizers.needs_rng and not has_rng:
        fail(_OP, ValueError, "the recipe's grad_output quantizer rounds stochastically and needs rng= (an integer "
             "array [seed, offset] of shape (2,); twinengine.pytorch.Linear keeps one as its rng_state buffer)")


def check_linear_shapes(x_shape, weight_shape, bias_shape) -> None:
    """Shared shape checks of Linear / dense: x (..., K), weight (N, K) with K >= 1, bias (N,).

    Raises:
        ValueError: a mismatch, or K = 0 (an empty reduction, which no recipe can scale).
    """
    x_shape, weight_shape = tuple(x_shape), tuple(weight_shape)
    if len(x_shape) < 1 or len(weight_shape) != 2:
        fail(_OP, ValueError, f"x must have rank >= 1 and the weight shape (out_features, in_features), got x "
             f"{dims(x_shape)} and weight {dims(weight_shape)}")
    if x_shape[-1] != weight_shape[1]:
        fail(_OP, ValueError, f"x has {int(x_shape[-1])} input features but the weight {dims(weight_shape)} "
             f"expects {int(weight_shape[1])}")
    if weight_shape[1] == 0:
        fail(_OP, ValueError, f"in_features must be >= 1, got x of shape {dims(x_shape)} (an empty reduction)")
    if bias_shape is not None and tuple(bias_shape) != (weight_shape[0],):
        fail(_OP, ValueError, f"bias must have shape ({int(weight_shape[0])},), got {dims(bias_shape)}")

"""Coming from TransformerEngine: TE recipe objects converted to twinengine recipes, field by field,
and the layout of TE's delayed-scaling checkpoint state.

Nothing here imports TransformerEngine: a TE recipe is recognised by its class's module
(``transformer_engine.common.recipe``) and read through its attributes, so TE checkpoints and
recipes can be used where TE itself cannot be imported.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from . import recipe as tw
from .ops.opdef import fail

TE_RECIPE_MODULE = "transformer_engine.common.recipe"


def is_te_recipe(obj: object) -> bool:
    """Whether `obj` is a TransformerEngine recipe object (``transformer_engine.common.recipe.*``)."""
    return type(obj).__module__ == TE_RECIPE_MODULE or type(obj).__module__.startswith(TE_RECIPE_MODULE + ".")


def _format(value: Any, owner: str, name: str) -> tw.Format:
    label = getattr(value, "name", None)
    if label not in tw.Format.__members__:
        _unsupported(owner, name, value, "expected Format.E4M3 or Format.HYBRID")
    return tw.Format[label]


def _unsupported(owner: str, name: str, value: Any, why: str) -> None:
    fail("recipe", ValueError, f"transformer_engine {owner}.{name}={value!r} is not supported by twinengine: {why}")


def _require(expected: Any, why: str) -> Callable[[str, str, Any], None]:
    """A field rule: the value must equal `expected` (else a clear error saying `why`)."""
    def check(owner: str, name: str, value: Any) -> None:
        if value != expected:
            _unsupported(owner, name, value, why)
    return check


def _accept(owner: str, name: str, value: Any) -> None:
    """A field with no twinengine counterpart and no effect on twinengine's bytes (documented)."""


def _split_accumulator(owner: str, name: str, value: Any) -> None:
    """twinengine's GEMMs accumulate in fp32 throughout (TE's use_split_accumulator=True); TE's
    False (its fprop default for per-tensor FP8: Hopper's faster, less precise accumulation) is
    accepted, and twinengine accumulates exactly."""
    if not hasattr(value, "use_split_accumulator"):
        _unsupported(owner, name, value, "expected an MMParams")


def _require_name(label: str) -> Callable[[str, str, Any], None]:
    def check(owner: str, name: str, value: Any) -> None:
        if getattr(value, "name", None) != label:
            _unsupported(owner, name, value, f"only Format.{label}")
    return check


_NO_FP8_ATTENTION = _require(False, "twinengine's FP8 attention (fp8_dpa / fp8_mha) is only with DelayedScaling and "
                                    "Float8CurrentScaling")
_NO_BACKWARD_OVERRIDE = _require(None, "twinengine's backward always uses the forward's quantized operands")

_COMMON_RULES = {"fp8_dpa": _NO_FP8_ATTENTION, "fp8_mha": _NO_FP8_ATTENTION, "backward_override": _NO_BACKWARD_OVERRIDE,
                 "fp8_gemm_fprop": _split_accumulator, "fp8_gemm_dgrad": _split_accumulator,
                 "fp8_gemm_wgrad": _split_accumulator}

_QPARAM_ROLES = ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad")


def _one_qparams(te_recipe: Any, owner: str) -> tuple[bool, float]:
    """(power_2_scale, amax_epsilon) shared by the three roles' QParams (twinengine's recipes
    hold one of each); FP4-only options must be off."""
    values = {role: getattr(te_recipe, role) for role in _QPARAM_ROLES}
    for role, q in values.items():
        for flag in ("random_hadamard_transform", "stochastic_rounding", "fp4_2d_quantization"):
            if getattr(q, flag, False):
                _unsupported(owner, f"{role}.{flag}", True, "an FP4-only option in an FP8 recipe")
    pairs = {(bool(q.power_2_scale), float(q.amax_epsilon)) for q in values.values()}
    if len(pairs) != 1:
        listing = ", ".join(f"{role}=(power_2_scale={q.power_2_scale}, amax_epsilon={q.amax_epsilon})"
                            for role, q in values.items())
        _unsupported(owner, "fp8_quant_*", listing, "twinengine uses one power-of-2 flag and one epsilon for all roles")
    return pairs.pop()


def _convert_delayed(r: Any) -> tw.Recipe:
    if callable(r.amax_compute_algo):
        _unsupported("DelayedScaling", "amax_compute_algo", r.amax_compute_algo, "only 'max' and 'most_recent'")
    return tw.DelayedScaling(margin=int(r.margin), fp8_format=_format(r.fp8_format, "DelayedScaling", "fp8_format"),
                             amax_history_len=int(r.amax_history_len), amax_compute_algo=str(r.amax_compute_algo),
                             fp8_dpa=bool(r.fp8_dpa), fp8_mha=bool(r.fp8_mha))


def _convert_current(r: Any) -> tw.Recipe:
    pow2, eps = _one_qparams(r, "Float8CurrentScaling")
    if pow2 != bool(r.use_power_2_scales):
        _unsupported("Float8CurrentScaling", "use_power_2_scales", r.use_power_2_scales,
                     f"it contradicts fp8_quant_*.power_2_scale={pow2}, which TE's quantizers read (TE sets those "
                     "from NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES when the class is defined)")
    return tw.Float8CurrentScaling(fp8_format=_format(r.fp8_format, "Float8CurrentScaling", "fp8_format"),
                                   use_power_2_scales=pow2, amax_epsilon=eps, fp8_dpa=bool(r.fp8_dpa),
                                   fp8_mha=bool(r.fp8_mha))


def _convert_mxfp8(r: Any) -> tw.Recipe:
    return tw.MXFP8BlockScaling(fp8_format=_format(r.fp8_format, "MXFP8BlockScaling", "fp8_format"),
                                enable_2d_quantization=bool(r.enable_2d_quantization))


def _convert_block(r: Any) -> tw.Recipe:
    pow2, eps = _one_qparams(r, "Float8BlockScaling")
    if pow2 == bool(r.use_f32_scales):
        _unsupported("Float8BlockScaling", "use_f32_scales", r.use_f32_scales,
                     f"it contradicts fp8_quant_*.power_2_scale={pow2}")
    return tw.Float8BlockScaling(fp8_format=_format(r.fp8_format, "Float8BlockScaling", "fp8_format"),
                                 x_block_scaling_dim=int(r.x_block_scaling_dim),
                                 w_block_scaling_dim=int(r.w_block_scaling_dim),
                                 grad_block_scaling_dim=int(r.grad_block_scaling_dim),
                                 use_power_2_scales=pow2, amax_epsilon=eps)


def _convert_nvfp4(r: Any) -> tw.Recipe:
    return tw.NVFP4BlockScaling(disable_rht=bool(r.disable_rht),
                                disable_stochastic_rounding=bool(r.disable_stochastic_rounding),
                                disable_2d_quantization=bool(r.disable_2d_quantization))


def _fields(*names: str) -> dict[str, Callable[[str, str, Any], None]]:
    """Fields consumed by the class's converter (their values are checked by the recipe itself)."""
    return {name: _accept for name in names}


# TE class name -> (rule per dataclass field, converter). A field missing here (a newer TE) is an error.
_CONVERTERS: dict[str, tuple[dict[str, Callable[[str, str, Any], None]], Callable[[Any], tw.Recipe]]] = {
    "DelayedScaling": ({**_COMMON_RULES, **_fields("margin", "fp8_format", "amax_history_len", "amax_compute_algo",
                                                   "fp8_dpa", "fp8_mha"),
                        "scaling_factor_compute_algo": _require(None, "twinengine computes s = fmt_max·2^-margin / amax"),
                        # amax reductions follow the layer's process group in twinengine (NUMERICS.md §12)
                        "reduce_amax": _accept}, _convert_delayed),
    "Float8CurrentScaling": ({**_COMMON_RULES, **_fields("use_power_2_scales", "fp8_format", "fp8_dpa", "fp8_mha")},
                             _convert_current),
    "MXFP8BlockScaling": ({**_COMMON_RULES, **_fields("fp8_format", "enable_2d_quantization"),
                           "margin": _require(0, "MXFP8 scales come from each block's amax; a margin has no meaning")},
                          _convert_mxfp8),
    "Float8BlockScaling": ({**_COMMON_RULES, **_fields("use_f32_scales", "fp8_format", "x_block_scaling_dim",
                                                       "w_block_scaling_dim", "grad_block_scaling_dim")},
                           _convert_block),
    "NVFP4BlockScaling": ({**_COMMON_RULES,
                           **_fields("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization"),
                           "row_scaled_activation": _require(False, "NVFP4 amax is one value per tensor copy"),
                           "nvfp4_4over6": _require("none", "4over6 block scaling is not implemented"),
                           "nvfp4_4over6_e4m3_use_256": _accept,  # only read by 4over6, which must be off
                           "nvfp4_4over6_err_mode": _accept,
                           "fp4_format": _require_name("E2M1"), "fp8_format": _require_name("E4M3")},
                          _convert_nvfp4),
}


def convert_te_recipe(te_recipe: Any) -> tw.Recipe:
    """The twinengine recipe equal to a TransformerEngine recipe, field by field.

    Every dataclass field of the TE recipe is either mapped (margin, formats, history length
    and algorithm, power-of-2 scales and epsilon from the per-role QParams, block dims, the
    NVFP4 switches, ``fp8_dpa`` / ``fp8_mha`` of the per-tensor recipes), checked to be a value
    twinengine matches (no FP8 attention with the block recipes, no backward override, no custom
    scaling function, NVFP4 4over6 off, ...), or documented as without
    effect here (``reduce_amax``: reductions follow the layer's process group;
    ``fp8_gemm_*.use_split_accumulator``: twinengine always accumulates in fp32).

    Raises:
        TypeError: not a TE recipe, or a TE recipe class twinengine has no counterpart for
            (CustomRecipe: its qfactory builds TE quantizers; write a twinengine CustomRecipe).
        ValueError: a field value twinengine does not support, or a field this converter does
            not know (a newer TE), named with the reason.
    """
    name = type(te_recipe).__name__
    if not is_te_recipe(te_recipe):
        fail("recipe", TypeError, f"expected a transformer_engine.common.recipe object, got {name}")
    if name not in _CONVERTERS:
        fail("recipe", TypeError, f"transformer_engine {name} has no twinengine counterpart"
             + ("; its qfactory builds TE quantizers: use twinengine.recipe.CustomRecipe with a factory returning "
                "twinengine quantizers" if name == "CustomRecipe" else ""))
    rules, convert = _CONVERTERS[name]
    for field in dataclasses.fields(te_recipe):
        if field.name not in rules:
            _unsupported(name, field.name, getattr(te_recipe, field.name), "a field this twinengine version does not know")
        rules[field.name](name, field.name, getattr(te_recipe, field.name))
    return convert(te_recipe)


def as_recipe(recipe: Any, op: str) -> tw.Recipe:
    """`recipe` itself when it is a twinengine Recipe, its conversion when it is a TE recipe.

    Raises:
        TypeError: anything else (the message names `op`); the errors of ``convert_te_recipe``.
    """
    if isinstance(recipe, tw.Recipe):
        return recipe
    if is_te_recipe(recipe):
        return convert_te_recipe(recipe)
    fail(op, TypeError, f"recipe must be a twinengine.recipe.Recipe or a transformer_engine.common.recipe object, "
         f"got {type(recipe).__name__}")


# ---- checkpoint state ------------------------------------------------------------------

TE_FWD_SLOTS_PER_GEMM = 3
"""TE's forward FP8 meta holds (input, weight, output) per GEMM: columns 3g, 3g+1, 3g+2."""
TE_BWD_SLOTS_PER_GEMM = 2
"""TE's backward FP8 meta holds (grad_output, grad_input) per GEMM: columns 2g, 2g+1."""


def te_delayed_columns(gemm: int) -> tuple[tuple[int, int], int]:
    """((input column, weight column) of TE's forward state, grad_output column of its backward
    state) for GEMM `gemm` (0 = Linear / LayerNormLinear / FC1, 1 = FC2): where a twinengine
    Linear's fwd (L, 2) and bwd (L, 1) delayed-scaling columns sit in a TE checkpoint."""
    fwd = TE_FWD_SLOTS_PER_GEMM * gemm
    return (fwd, fwd + 1), TE_BWD_SLOTS_PER_GEMM * gemm


TE_QKV_SPLIT = ("query_", "key_", "value_")
"""TE's ``parameters_split`` names of a ``fuse_qkv_params=False`` self-attention projection
(``layernorm_qkv.`` with the input layernorm, ``qkv.`` without): ``query_weight``,
``key_weight``, ``value_weight`` (and ``*_bias``). TE forces ``qkv_weight_interleaved=False``
then, and its forward runs the concatenation ``[query; key; value]`` of the split parameters."""


def fuse_te_qkv(state_dict: dict, concat: Callable[[list], Any], prefix: str = "") -> list[str]:
    """Replace, in place, each complete TE split-QKV group under `prefix` (``<p>query_weight``,
    ``<p>key_weight``, ``<p>value_weight``; the same for ``bias``) by the fused entry ``<p>weight``
    (``<p>bias``) = ``concat([query, key, value])`` along rows: Q's H·D rows, then K's and V's
    G·D rows each — twinengine's fused parameter with ``qkv_weight_interleaved=False``. The
    bytes are the parts' (a concatenation). Incomplete groups (cross attention's
    ``layernorm_query.query_weight``, ``key_value.{key,value}_weight``) are left as they are
    (strict loading reports them). Returns the fused keys.

    Raises:
        ValueError: a state dict holding both a split group and its fused entry.
    """
    fused = []
    for key in [k for k in state_dict if k.startswith(prefix)]:
        for suffix in ("weight", "bias"):
            if not key.endswith(TE_QKV_SPLIT[0] + suffix):
                continue
            stem = key[:-len(TE_QKV_SPLIT[0] + suffix)]
            parts = [stem + split + suffix for split in TE_QKV_SPLIT]
            if not all(part in state_dict for part in parts):
                continue
            if stem + suffix in state_dict:
                fail("load_state_dict", ValueError, f"the state dict holds both {stem + suffix!r} and the split "
                     f"{', '.join(repr(p) for p in parts)}; expected one of them")
            state_dict[stem + suffix] = concat([state_dict.pop(part) for part in parts])
            fused.append(stem + suffix)
    return fused

"""Recipes: defaults and per-role quantizers of NUMERICS.md §9, field validation."""

from __future__ import annotations

import pytest

import twinengine as te
from twinengine import recipe


def test_delayed_scaling_defaults_and_roles():
    r = recipe.DelayedScaling()
    assert (r.margin, r.fp8_format, r.amax_history_len, r.amax_compute_algo) == (0, recipe.Format.HYBRID, 1024, "max")
    assert r.quantizer("input") == te.Float8DelayedScalingQuantizer("e4m3")
    assert r.quantizer("weight") == te.Float8DelayedScalingQuantizer("e4m3")
    assert r.quantizer("grad_output") == te.Float8DelayedScalingQuantizer("e5m2")


def test_current_scaling_roles_carry_options():
    r = recipe.Float8CurrentScaling(fp8_format=recipe.Format.E4M3, use_power_2_scales=True, amax_epsilon=1e-4)
    assert r.quantizer("grad_output") == te.Float8CurrentScalingQuantizer("e4m3", force_pow_2_scales=True,
                                                                          amax_epsilon=1e-4)


def test_mxfp8_2d_only_for_weights():
    r = recipe.MXFP8BlockScaling(enable_2d_quantization=True)
    assert r.quantizer("weight") == te.MXFP8Quantizer("e4m3", with_2d_quantization=True)
    assert r.quantizer("input") == te.MXFP8Quantizer("e4m3")


def test_float8_block_scaling_roles():
    r = recipe.Float8BlockScaling()
    assert r.quantizer("input") == te.Float8BlockQuantizer("e4m3", block_scaling_dim=1)
    assert r.quantizer("weight") == te.Float8BlockQuantizer("e4m3", block_scaling_dim=2)
    assert r.quantizer("grad_output").force_pow_2_scales is True


def test_float8_block_scaling_rejects_two_2d_operands():
    with pytest.raises(ValueError, match="both 2D-block scaled"):
        recipe.Float8BlockScaling(x_block_scaling_dim=2, w_block_scaling_dim=2)


def test_nvfp4_roles():
    r = recipe.NVFP4BlockScaling()
    assert r.quantizer("input") == te.NVFP4Quantizer(with_rht=True)
    assert r.quantizer("weight") == te.NVFP4Quantizer(with_2d_quantization=True)
    assert r.quantizer("grad_output") == te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True)
    off = recipe.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True)
    assert {off.quantizer(role) for role in recipe.ROLES} == {te.NVFP4Quantizer()}


@pytest.mark.parametrize("make", [lambda: recipe.DelayedScaling(fp8_format=recipe.Format.E5M2),
                                  lambda: recipe.Float8CurrentScaling(fp8_format=recipe.Format.E5M2),
                                  lambda: recipe.MXFP8BlockScaling(fp8_format=recipe.Format.E5M2),
                                  lambda: recipe.Float8BlockScaling(fp8_format=recipe.Format.E5M2)])
def test_pure_e5m2_is_rejected(make):
    with pytest.raises(ValueError, match="pure E5M2 is rejected"):
        make()


def test_recipe_field_checks():
    with pytest.raises(ValueError, match="margin"):
        recipe.DelayedScaling(margin=-1)
    with pytest.raises(ValueError, match="amax_compute_algo"):
        recipe.DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="role must be one of"):
        recipe.MXFP8BlockScaling().quantizer("bias")


def test_custom_recipe_uses_factory_and_checks_its_result():
    r = recipe.CustomRecipe(lambda role: te.MXFP8Quantizer("e5m2" if role == "grad_output" else "e4m3"))
    assert r.quantizer("grad_output").fp8_dtype == "e5m2"
    with pytest.raises(TypeError, match="must return a twinengine Quantizer"):
        recipe.CustomRecipe(lambda role: None).quantizer("input")


def test_fp8_attention_flags():
    # TE's fields and defaults; either flag selects FP8 attention (docs/attention.md §9).
    for cls in (recipe.DelayedScaling, recipe.Float8CurrentScaling):
        assert (cls().fp8_dpa, cls().fp8_mha) == (False, False)
        assert not recipe.uses_fp8_attention(cls())
        assert recipe.uses_fp8_attention(cls(fp8_dpa=True))
        assert recipe.uses_fp8_attention(cls(fp8_mha=True))
        with pytest.raises(TypeError, match=f"{cls.__name__}.fp8_dpa must be a bool, got 1"):
            cls(fp8_dpa=1)
    assert not recipe.uses_fp8_attention(recipe.MXFP8BlockScaling())
    assert not recipe.uses_fp8_attention(None)

"""Shared cases of the fusible-ops tests: recipes, and the same op lists built in both frontends."""

from __future__ import annotations

import twinengine as te

RECIPES = {
    "high_precision": None,
    "fp8_current": te.recipe.Float8CurrentScaling(),
    "fp8_delayed": te.recipe.DelayedScaling(amax_history_len=4),
    "mxfp8": te.recipe.MXFP8BlockScaling(),
    "fp8_block": te.recipe.Float8BlockScaling(),
    "nvfp4": te.recipe.NVFP4BlockScaling(),
}
"""Every recipe family (NVFP4 with its defaults: RHT + SR, so bf16 inputs)."""

HIDDEN, FFN, ROWS = 128, 128, 128
"""Sizes every format accepts (FP8 block needs multiples of 128)."""


def dtype_for(recipe_name: str) -> str:
    return "bfloat16" if recipe_name == "nvfp4" else "float32"


def op_lists(ops, activation: str = "SwiGLU"):
    """Named op lists over a frontend's ops module: a norm-led MLP, a LayerNorm + Quantize
    hand-off, and a residual block with extra inputs/outputs."""
    act = getattr(ops, activation)
    gated = activation.endswith("GLU")
    fc1 = 2 * FFN if gated else FFN
    return {
        "rmsnorm_mlp": [ops.RMSNorm(HIDDEN), ops.BasicLinear(HIDDEN, fc1, amax_history_len=4), ops.Bias(fc1), act(),
                        ops.BasicLinear(FFN, HIDDEN, amax_history_len=4), ops.Bias(HIDDEN)],
        "layernorm_quantize": [ops.LayerNorm(HIDDEN), ops.Quantize(), ops.BasicLinear(HIDDEN, HIDDEN,
                                                                                          amax_history_len=4)],
        "residual": [ops.MakeExtraOutput(), ops.RMSNorm(HIDDEN), ops.BasicLinear(HIDDEN, HIDDEN, amax_history_len=4),
                     ops.ConstantScale(0.5), ops.AddExtraInput(), ops.AddExtraInput(), ops.LayerNorm(HIDDEN),
                     ops.Bias(HIDDEN), ops.GELU()],
        "linear_tails": [ops.L2Normalization(), ops.BasicLinear(HIDDEN, HIDDEN, amax_history_len=4), ops.Bias(HIDDEN),
                         ops.AddExtraInput(), ops.AddExtraInput(), ops.RMSNorm(HIDDEN), ops.Identity(),
                         ops.BasicLinear(HIDDEN, HIDDEN, amax_history_len=4), ops.AddExtraInput(), ops.SReLU(),
                         ops.Quantize(), ops.BasicLinear(HIDDEN, HIDDEN, amax_history_len=4),
                         ops.Reshape((-1, HIDDEN)), ops.Dropout(0.0), ops.Reshape((2, ROWS // 2, HIDDEN))],
    }


EXTRA_INPUTS = {"rmsnorm_mlp": 0, "layernorm_quantize": 0, "residual": 2, "linear_tails": 3}
"""Extra inputs (AddExtraInput) each op list takes.

Groups covered: norm -> quantized Linear input, norm + Quantize, activation + Quantize,
BasicLinear + Bias + activation (backward dact + dbias + quantize), LinearBiasAdd, LinearAdd,
LinearScaleAdd, Add + norm (AddRMSNorm / AddLayerNorm), Bias + activation, and the plain ops."""

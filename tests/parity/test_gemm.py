"""The same NumPy operands through twinengine.pytorch.gemm and twinengine.jax.gemm give
identical bytes, for every format and every Linear operand usage."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import twinengine.jax as tj
import twinengine.pytorch as tp
from twinengine.quantizers import (Float8BlockQuantizer, Float8CurrentScalingQuantizer, Float8DelayedScalingQuantizer,
                                   MXFP8Quantizer, NVFP4Quantizer)

QUANTIZERS = {
    "high_precision": None,
    "fp8_current": (Float8CurrentScalingQuantizer("e4m3"), Float8CurrentScalingQuantizer("e5m2")),
    "fp8_delayed": (Float8DelayedScalingQuantizer("e4m3"), Float8DelayedScalingQuantizer("e5m2")),
    "mxfp8": (MXFP8Quantizer("e4m3"), MXFP8Quantizer("e5m2")),
    "fp8_block": (Float8BlockQuantizer("e4m3"), Float8BlockQuantizer("e5m2")),
    "nvfp4": (NVFP4Quantizer(), NVFP4Quantizer()),
}
USAGES = {"fprop": ("x", "w", False, False), "dgrad": ("dy", "w", False, True), "wgrad": ("dy", "x", True, True)}
RNG = np.random.default_rng(11)
ARRAYS = {"x": RNG.standard_normal((128, 384)).astype(np.float32),
          "w": RNG.standard_normal((256, 384)).astype(np.float32) * 0.1,
          "dy": RNG.standard_normal((128, 256)).astype(np.float32) * 1e-2}
BIAS = RNG.standard_normal(384).astype(np.float32)


def _operand(fe, name, fmt, dtype):
    x = ARRAYS[name]
    x = torch.from_numpy(x).to(dtype) if fe is tp else jnp.asarray(x, dtype=str(dtype)[6:])
    if QUANTIZERS[fmt] is None:
        return x
    q = QUANTIZERS[fmt][name == "dy"]
    scale = None
    if fmt == "fp8_delayed":
        scale = torch.tensor([4.0]) if fe is tp else np.array([4.0], np.float32)
    return fe.quantize(x, q, scale=scale)


@pytest.mark.parametrize("usage", USAGES)
@pytest.mark.parametrize("fmt", QUANTIZERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_torch_and_jax_bytes_identical(fmt, usage, dtype):
    a_name, b_name, a_col, b_col = USAGES[usage]
    outs = []
    for fe in (tp, tj):
        a, b = _operand(fe, a_name, fmt, dtype), _operand(fe, b_name, fmt, dtype)
        n = ARRAYS[b_name].shape[1 if b_col else 0]
        bias = BIAS[:n] if usage != "wgrad" else None
        if fe is tp:
            out = tp.gemm(a, b, None if bias is None else torch.from_numpy(bias.copy()), a_columnwise=a_col,
                          b_columnwise=b_col, out_dtype=dtype)
            outs.append(out.view(torch.int16 if dtype == torch.bfloat16 else torch.int32).numpy())
        else:
            out = tj.gemm(a, b, bias, a_columnwise=a_col, b_columnwise=b_col, out_dtype=str(dtype)[6:])
            outs.append(np.asarray(out).view(np.int16 if dtype == torch.bfloat16 else np.int32))
    bad = np.argwhere(outs[0] != outs[1])
    assert bad.size == 0, f"first differing index {tuple(bad[0])}"

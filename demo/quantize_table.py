"""Quantizes one tensor with every format in PyTorch and JAX and prints the parity and error table.

For each quantizer: whether the two frameworks produced identical bytes (data, scales, amaxes),
and the relative RMS error of the dequantized rowwise copy against the input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep

QUANTIZERS = {
    "FP8 current E4M3": te.Float8CurrentScalingQuantizer("e4m3"),
    "FP8 current E5M2": te.Float8CurrentScalingQuantizer("e5m2"),
    "FP8 delayed E4M3": te.Float8DelayedScalingQuantizer("e4m3"),
    "MXFP8 E4M3": te.MXFP8Quantizer("e4m3"),
    "MXFP8 E4M3 2D": te.MXFP8Quantizer("e4m3", with_2d_quantization=True),
    "FP8 block 1x128": te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    "FP8 block 128x128": te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    "NVFP4": te.NVFP4Quantizer(),
    "NVFP4 RHT+SR": te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
    "NVFP4 2D": te.NVFP4Quantizer(with_2d_quantization=True),
}


def _bytes(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.contiguous().view(torch.uint8).numpy().reshape(-1)
    return np.asarray(value).reshape(-1).view(np.uint8)


def main(rows: int = 256, cols: int = 512) -> bool:
    """Prints the table; returns True when every format's bytes match across frameworks."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-4, 4, (rows, 1)))).astype(np.float32)
    x_torch = torch.from_numpy(x).to(torch.bfloat16)
    x_jax = jnp.asarray(x, jnp.bfloat16)
    x_ref = x_torch.float().numpy()
    rng_state = np.array([1234, 0], np.uint32)
    print(f"input: {rows}x{cols} bfloat16, rows scaled over ~7 decades")
    print(f"{'format':<20}{'torch == jax':>14}{'rel. RMS error':>16}")
    all_equal = True
    for name, q in QUANTIZERS.items():
        kwargs_t, kwargs_j = {}, {}
        if q.scaling_mode == "fp8_delayed":
            kwargs_t["scale"], kwargs_j["scale"] = torch.tensor([0.25]), jnp.array([0.25], jnp.float32)
        if getattr(q, "stochastic_rounding", False):
            kwargs_t["rng"], kwargs_j["rng"] = torch.from_numpy(rng_state.astype(np.int64)), jnp.asarray(rng_state)
        qt_t = tep.quantize(x_torch, q, **kwargs_t)
        qt_j = jax.jit(lambda v, kw: tej.quantize(v, q, **kw))(x_jax, kwargs_j)
        equal = all(
            (a is None and b is None) or np.array_equal(_bytes(a), _bytes(b))
            for a, b in zip(qt_t.tree_flatten()[0], qt_j.tree_flatten()[0])
        )
        all_equal &= equal
        y = tep.dequantize(qt_t, torch.float32).numpy()
        error = float(np.sqrt(np.mean((y - x_ref) ** 2) / np.mean(x_ref ** 2)))
        print(f"{name:<20}{'identical' if equal else 'DIFFERENT':>14}{error:>16.3e}")
    return all_equal


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)

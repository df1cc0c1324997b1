"""Large inputs, split into several pieces run on different pools: the JAX path runs them on
XLA's intra-op thread pool (whose threads keep FTZ/DAZ set, so each worker must clear them),
the torch path on twinengine's pool at 1 and 3 threads. All give the same bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_quantized_equal, fields_as_numpy, make_input, to_torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep

SHAPE = (1536, 1024)  # 6 pieces of 2^18 elements


def _input(dtype: str) -> np.ndarray:
    x = make_input("mixed_scales", SHAPE, "float32", seed=3)
    sub = make_input("subnormal", SHAPE, "float32", seed=4)
    pick = np.random.default_rng(5).random(SHAPE)
    x = np.where(pick < 0.05, sub, x).astype(np.float32)
    return np.asarray(jnp.asarray(x).astype(dtype))


@pytest.mark.parametrize("q", [te.Float8CurrentScalingQuantizer("e4m3"), te.MXFP8Quantizer("e4m3"),
                               te.Float8BlockQuantizer("e4m3", block_scaling_dim=2), te.NVFP4Quantizer()],
                         ids=lambda q: type(q).__name__)
def test_xla_pool_and_torch_threads_give_the_same_bytes(q):
    x = _input("bfloat16")
    qt_jax = jax.jit(tej.quantize, static_argnums=1)(jnp.asarray(x), q)
    saved = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            qt_torch = tep.quantize(to_torch(x), q)
            assert_quantized_equal(fields_as_numpy(qt_torch), fields_as_numpy(qt_jax), f"torch@{n} vs jax {q!r}")
    finally:
        torch.set_num_threads(saved)

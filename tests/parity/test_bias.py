"""Bias family: the same input through both frontends gives identical bytes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from elementwise_cases import DTYPES
from helpers import assert_bytes_equal, from_torch, make_input, to_torch

from twinengine.jax._ops import bias as JB
from twinengine.pytorch._ops import bias as TB

TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
JNP = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _same(t, j, what: str) -> None:
    assert_bytes_equal(from_torch(t), np.asarray(j), what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_bytes_identical_across_frameworks(dtype):
    x = make_input("nan_inf", (70, 40), dtype, seed=3)
    b = make_input("mixed_scales", (40,), "float32", seed=4)
    _same(TB.bias_add(to_torch(x), to_torch(b)), JB.bias_add(jnp.asarray(x), jnp.asarray(b)), "bias_add")
    _same(TB.add(to_torch(x), to_torch(x)), JB.add(jnp.asarray(x), jnp.asarray(x)), "add")
    _same(TB.scale(to_torch(x), 0.1), JB.scale(jnp.asarray(x), 0.1), "scale")
    for out in DTYPES:
        _same(TB.bias_grad(to_torch(x), TORCH[out]), JB.bias_grad(jnp.asarray(x), JNP[out]), f"bias_grad {out}")

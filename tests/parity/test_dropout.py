"""Dropout: the same input and rng through both frontends give identical bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from elementwise_cases import DTYPES
from helpers import assert_bytes_equal, from_torch, make_input, to_torch

from twinengine.jax._ops import dropout as JD
from twinengine.pytorch._ops import dropout as TD


def _same(t, j, what: str) -> None:
    assert_bytes_equal(from_torch(t), np.asarray(j), what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_bytes_identical_across_frameworks(dtype):
    x = make_input("nan_inf", (33, 47), dtype, seed=2)
    for rng in (np.array([1, 2], np.int32), np.array([0xFFFFFFFF, 0x80000000], np.uint32)):
        yt, mt = TD.dropout_fwd(to_torch(x), 0.3, torch.from_numpy(rng.astype(np.int64)))
        yj, mj = jax.jit(lambda v, r: JD.dropout_fwd(v, 0.3, r))(jnp.asarray(x), jnp.asarray(rng))
        _same(yt, yj, "y")
        _same(mt, mj, "mask")
        _same(TD.dropout_bwd(to_torch(x), mt, 0.3), JD.dropout_bwd(jnp.asarray(x), mj, 0.3), "dx")

"""Rope family: the same input through both frontends gives identical bytes (forward and
gradient, every format, interleaved and partial rotary), and RotaryPositionEmbedding agrees."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from elementwise_cases import DTYPES
from helpers import assert_bytes_equal, from_torch, make_input, to_torch

import twinengine.jax as tej
import twinengine.pytorch as tep

CU = np.array([0, 5, 5, 11], np.int32)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_bytes_identical_across_frameworks(dtype, tensor_format, interleaved):
    shape = {"sbhd": (6, 2, 3, 20), "bshd": (2, 6, 3, 20), "thd": (12, 3, 20)}[tensor_format]
    t = make_input("normal_1e3", shape, dtype, seed=1)
    dy = make_input("normal_1", shape, dtype, seed=2)
    cu = CU if tensor_format == "thd" else None
    kw = dict(rotary_percent=0.8, interleaved=interleaved, seq_len_interpolation_factor=2.0)
    ft, fj = tep.RotaryPositionEmbedding(20, **kw)(8, offset=100), tej.RotaryPositionEmbedding(20, **kw)(8, offset=100)
    assert_bytes_equal(from_torch(ft), np.asarray(fj), "freqs")
    x = to_torch(t).requires_grad_(True)
    yt = tep.apply_rotary_pos_emb(x, ft, tensor_format, interleaved, cu_seqlens=None if cu is None else torch.from_numpy(cu))
    (dxt,) = torch.autograd.grad(yt, x, to_torch(dy))
    yj, vjp = jax.vjp(lambda v: tej.apply_rotary_pos_emb(v, fj, tensor_format, interleaved,
                                                         cu_seqlens=None if cu is None else jnp.asarray(cu)),
                      jnp.asarray(t))
    (dxj,) = vjp(jnp.asarray(dy))
    assert_bytes_equal(from_torch(yt), np.asarray(yj), "forward")
    assert_bytes_equal(from_torch(dxt), np.asarray(dxj), "gradient")

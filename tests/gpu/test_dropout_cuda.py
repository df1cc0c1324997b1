"""Dropout on CUDA: masks, values and gradients byte-identical to the CPU kernels (skipped
without a CUDA device or CUDA kernels)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from elementwise_cases import DTYPES, assert_bytes_equal_nan
from helpers import from_torch, make_input, to_torch

import twinengine as te
from twinengine.pytorch._ops import dropout as D

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not te._C.has_cuda(), reason="twinengine was built without its CUDA kernels (nvcc not found)"),
]


def _both(fn, *arrays):
    """fn on CPU tensors and on CUDA tensors."""
    cpu = fn(*[None if a is None else to_torch(a) for a in arrays])
    gpu = fn(*[None if a is None else to_torch(a).cuda() for a in arrays])
    return cpu, gpu


def _same(cpu, gpu, what: str) -> None:
    assert_bytes_equal_nan(from_torch(gpu), from_torch(cpu), what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.75])
def test_dropout_cuda_matches_cpu(p, dtype):
    x = make_input("nan_inf", (333, 47), dtype, seed=2)
    rng = np.array([0x1234ABCD, 4_000_000_007], np.int64)
    cpu, gpu = _both(lambda v, r: D.dropout_fwd(v, p, r), x, rng)
    _same(cpu[0], gpu[0], "y")
    _same(cpu[1], gpu[1], "mask")
    dx_cpu = D.dropout_bwd(to_torch(x), cpu[1], p)
    dx_gpu = D.dropout_bwd(to_torch(x).cuda(), gpu[1], p)
    _same(dx_cpu, dx_gpu, "dx")

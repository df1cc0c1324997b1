"""Bias family on CUDA: bias add, residual add, scale and the canonical-sum bias gradient
byte-identical to the CPU kernels (skipped without a CUDA device or CUDA kernels)."""

from __future__ import annotations

import pytest
import torch
from elementwise_cases import DTYPES, assert_bytes_equal_nan
from helpers import from_torch, make_input, to_torch

import twinengine as te
from twinengine.pytorch._ops import bias as B

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not te._C.has_cuda(), reason="twinengine was built without its CUDA kernels (nvcc not found)"),
]

TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _both(fn, *arrays):
    """fn on CPU tensors and on CUDA tensors."""
    cpu = fn(*[None if a is None else to_torch(a) for a in arrays])
    gpu = fn(*[None if a is None else to_torch(a).cuda() for a in arrays])
    return cpu, gpu


def _same(cpu, gpu, what: str) -> None:
    assert_bytes_equal_nan(from_torch(gpu), from_torch(cpu), what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_cuda_matches_cpu(dtype):
    x = make_input("nan_inf", (1000, 72), dtype, seed=3)
    b = make_input("mixed_scales", (72,), "float16", seed=4)
    _same(*_both(B.bias_add, x, b), "bias_add")
    _same(*_both(B.add, x, x), "add")
    _same(*_both(lambda v: B.scale(v, 0.3), x), "scale")
    for out in DTYPES:
        _same(*_both(lambda v: B.bias_grad(v, TORCH[out]), x), f"bias_grad {out}")
    _same(*_both(lambda v: B.bias_grad(v, torch.float32), x[:0]), "bias_grad zero rows")

"""Rope family on CUDA: apply_rotary_pos_emb forward and backward byte-identical to the CPU kernel
for every format, interleaved and partial rotary, special angles; compiled on CUDA == eager
(skipped without a CUDA device or CUDA kernels)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from elementwise_cases import DTYPES, assert_bytes_equal_nan
from helpers import from_torch, make_input, to_torch

import twinengine as te
import twinengine.pytorch as tep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not te._C.has_cuda(), reason="twinengine was built without its CUDA kernels (nvcc not found)"),
]


def _run(device, t, freqs, dy, tensor_format, interleaved, cu):
    x = to_torch(t).to(device).requires_grad_(True)
    cu_t = None if cu is None else torch.from_numpy(cu).to(device)
    y = tep.apply_rotary_pos_emb(x, torch.from_numpy(freqs).to(device), tensor_format, interleaved, cu_seqlens=cu_t)
    (dx,) = torch.autograd.grad(y, x, to_torch(dy).to(device))
    return y.detach().cpu(), dx.cpu()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_cuda_matches_cpu(dtype, tensor_format, interleaved):
    shape = {"sbhd": (64, 3, 4, 72), "bshd": (3, 64, 4, 72), "thd": (150, 4, 72)}[tensor_format]
    t = make_input("normal_1e3", shape, dtype, seed=1)
    dy = make_input("normal_1", shape, dtype, seed=2)
    freqs = (make_input("normal_1", (70, 1, 1, 48), "float32", seed=3) * np.float32(1e4)).astype(np.float32)
    freqs.reshape(-1)[:6] = [np.nan, np.inf, -0.0, 3e38, 16777216.0, -1e7]
    cu = np.array([0, 40, 40, 100, 140], np.int32) if tensor_format == "thd" else None
    cpu = _run("cpu", t, freqs, dy, tensor_format, interleaved, cu)
    gpu = _run("cuda", t, freqs, dy, tensor_format, interleaved, cu)
    assert_bytes_equal_nan(from_torch(gpu[0]), from_torch(cpu[0]), "forward")
    assert_bytes_equal_nan(from_torch(gpu[1]), from_torch(cpu[1]), "backward")


def test_rope_cuda_compiled_matches_eager():
    emb = tep.RotaryPositionEmbedding(32, rotary_percent=0.5, device="cuda")
    fn = lambda x, f: tep.apply_rotary_pos_emb(x, f, "bshd")  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True)
    x = torch.randn(2, 33, 4, 32, device="cuda", dtype=torch.bfloat16)
    f = emb(33)
    assert torch.equal(compiled(x, f), fn(x, f))
    assert torch.equal(f.cpu(), tep.RotaryPositionEmbedding(32, rotary_percent=0.5)(33))

"""Attention on CUDA (csrc/cuda/attention.cu, high precision): forward and backward byte-identical
to the CPU kernel for every shared case (skipped without a CUDA device or CUDA kernels); FP8
attention on CUDA tensors raises (CPU-only). Host emulation of the same kernels without a device:
tests/gpu/emulation/run.sh attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attention_cases import CASE_IDS, CASES, THD_CASES, THD_IDS
from helpers import assert_bytes_equal, from_torch, to_torch

import twinengine as te
from twinengine.pytorch._ops import attention as ta

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not te._C.has_cuda(), reason="twinengine was built without its CUDA kernels (nvcc not found)"),
]


def _kwargs(kw: dict, device: str) -> dict:
    return {n: (torch.from_numpy(v).to(device) if isinstance(v, np.ndarray) else v) for n, v in kw.items()}


@pytest.mark.parametrize("case", CASES + THD_CASES, ids=CASE_IDS + THD_IDS)
def test_attention_cuda_matches_cpu_bytes(case):
    a, kw = case.inputs(seed=5), case.kwargs()
    results = {}
    for device in ("cpu", "cuda"):
        q, k, v, dout = (to_torch(a[n]).to(device) for n in ("q", "k", "v", "dout"))
        dkw = _kwargs(kw, device)
        out, lse = ta.attention_fwd(q, k, v, **dkw)
        results[device] = (out, lse) + tuple(ta.attention_bwd(dout, q, k, v, out, lse, **dkw))
    for name, c, g in zip(("out", "lse", "dq", "dk", "dv"), results["cpu"], results["cuda"], strict=True):
        assert_bytes_equal(from_torch(g.cpu()), from_torch(c), f"{case.name} {name}: cuda vs cpu")


def test_attention_fp8_on_cuda_is_unsupported():
    q = torch.randn(1, 8, 2, 16, device="cuda")
    with pytest.raises(Exception, match="FP8 attention has no CUDA kernel yet"):
        ta.attention_fwd(q, q, q, mask_type="causal", fp8=True)

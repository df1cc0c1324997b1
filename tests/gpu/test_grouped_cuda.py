"""Grouped GEMMs and the padding kernels on CUDA (skipped without a CUDA device): the padding
maps and padded tensors equal the CPU bytes; grouped fprop / dgrad / wgrad / bias grad equal
the CPU kernels within fp32 summation-order error (NUMERICS.md §8), padding rows exactly zero;
a new split under torch.compile does not recompile."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, from_torch, no_recompiles

import twinengine._C as _C
import twinengine.pytorch as tep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and _C.has_cuda()),
                       reason="needs a CUDA device and a CUDA build of twinengine"),
]


def _pad_run(device):
    rng = np.random.default_rng(0)
    mask = torch.from_numpy(rng.random((37, 5)) < 0.4).to(device)
    x = torch.from_numpy(rng.standard_normal((37, 24)).astype(np.float32)).to(device).requires_grad_()
    probs = torch.from_numpy(rng.random((37, 5)).astype(np.float32)).to(device)
    out, pp, row_id_map, pad_offsets, target = tep.moe_permute_and_pad_with_probs(x, probs, mask, mask.sum(0), 16)
    back = tep.moe_unpermute(out, row_id_map, probs, pad_offsets=pad_offsets)
    padded, padded_splits = tep.moe_pad_splits(x, torch.tensor([7, 0, 30], device=device), 16)
    back.sum().backward()
    return [from_torch(t.cpu()) for t in (out, pp, row_id_map, pad_offsets, target, back, padded, padded_splits,
                                          x.grad)]


def test_padding_cuda_matches_cpu_bytes():
    for i, (gpu, cpu) in enumerate(zip(_pad_run("cuda"), _pad_run("cpu"))):
        assert_bytes_equal(gpu, cpu, f"result {i}")


def _grouped_run(device, splits):
    torch.manual_seed(0)
    layer = tep.GroupedLinear(4, 40, 24).to(device)
    x = torch.randn(64, 40, device=device, requires_grad=True)
    y = layer(x, torch.tensor(splits, device=device))
    y.backward(torch.ones_like(y))
    return [y, x.grad] + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("splits", [[10, 0, 40, 14], [0, 64, 0, 0], [16, 16, 16, 16]], ids=str)
def test_grouped_linear_cuda_matches_cpu(splits):
    for gpu, cpu in zip(_grouped_run("cuda", splits), _grouped_run("cpu", splits)):
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-5)


def test_grouped_linear_cuda_compiled_new_split_does_not_recompile():
    layer = tep.GroupedLinear(4, 32, 16).cuda()
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    x = torch.randn(32, 32, device="cuda")
    compiled(x, torch.tensor([8, 8, 8, 8], device="cuda"))
    with no_recompiles():
        y = compiled(x, torch.tensor([0, 32, 0, 0], device="cuda"))
    torch.testing.assert_close(y, layer(x, torch.tensor([0, 32, 0, 0], device="cuda")), rtol=1e-5, atol=1e-5)


def test_grouped_linear_cuda_bias_is_added_after_the_output_rounding():
    """CUDA epilogue = the CPU rule: each expert's GEMM output rounded to bf16, then fl(y + b)."""
    torch.manual_seed(1)
    splits = torch.tensor([7, 0, 25], device="cuda")
    x = torch.randn(32, 48, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(24, 48, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    bs = [torch.randn(24, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    y = tep.grouped_linear(x, ws, splits, bs)
    plain = tep.grouped_linear(x, ws, splits)
    rows = torch.repeat_interleave(torch.arange(3, device="cuda"), splits)
    expected = (plain.float() + torch.stack(bs).float()[rows]).to(torch.bfloat16)
    assert_bytes_equal(from_torch(y.cpu()), from_torch(expected.cpu()), "bias epilogue")

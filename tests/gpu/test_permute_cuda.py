"""MoE permutation on CUDA: byte equality with the CPU kernels for every op and gradient, both
frontends, plus a CUDA-graph-safe jitted JAX run (skipped without a CUDA device)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, from_torch, to_torch
from permute_cases import CASES, build, case_id, make_case

import twinengine as te
import twinengine.pytorch as tep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not te._C.has_cuda(), reason="twinengine was built without its CUDA kernels"),
]


def _round_trip(device, case, with_probs):
    """Forward and backward of permute(_with_probs) + unpermute on `device`, as NumPy arrays."""
    x = to_torch(case.x).to(device).requires_grad_()
    probs = to_torch(case.probs).to(device).requires_grad_()
    merging = to_torch(case.probs).to(device).requires_grad_()
    routing_map = torch.from_numpy(case.routing_map).to(device)
    n_out = case.resolved_num_out
    if with_probs:
        out, pp, row_id_map = tep.moe_permute_with_probs(x, probs, routing_map, n_out, map_type=case.map_type)
    else:
        (out, row_id_map), pp = tep.moe_permute(x, routing_map, n_out, map_type=case.map_type), None
    back = tep.moe_unpermute(out * 1, row_id_map, merging_probs=merging if with_probs else None,
                             restore_shape=case.x.shape, map_type=case.map_type)
    rng = np.random.default_rng(1)
    g_back = to_torch(rng.standard_normal(case.x.shape).astype(np.float32)).to(x.dtype).to(device)
    g_out = to_torch(rng.standard_normal((n_out, case.x.shape[1])).astype(np.float32)).to(x.dtype).to(device)
    outputs, grads = [back, out], [g_back, g_out]
    if with_probs:
        outputs.append(pp)
        grads.append(torch.ones_like(pp))
    torch.autograd.backward(outputs, grads)
    results = [out, row_id_map, back, x.grad] + ([pp, probs.grad, merging.grad] if with_probs else [])
    return [from_torch(t) for t in results]


@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("params", CASES, ids=case_id)
def test_moe_permute_cuda_matches_cpu(params, with_probs):
    case = build(params)
    cpu = _round_trip("cpu", case, with_probs)
    cuda = _round_trip("cuda", case, with_probs)
    for i, (c, g) in enumerate(zip(cpu, cuda)):
        assert_bytes_equal(g, c, f"result {i}")


def test_moe_permute_cuda_large_matches_cpu():
    # Many merge-sort passes (T·topK = 49152 keys) and multi-tile expert scans.
    for map_type in ("index", "mask"):
        case = make_case(3, 6144, 64, 8, 32, "bfloat16", map_type, drop=True)
        cpu = _round_trip("cpu", case, True)
        cuda = _round_trip("cuda", case, True)
        for i, (c, g) in enumerate(zip(cpu, cuda)):
            assert_bytes_equal(g, c, f"{map_type} result {i}")


def test_moe_permute_quantized_and_chunks_cuda_match_cpu():
    case = make_case(21, 64, 8, 2, 64, "bfloat16", "mask", drop=True)
    quantizer = te.MXFP8Quantizer("e4m3", columnwise=False)
    split = torch.tensor([10, 0, 30, 24], dtype=torch.int32)
    order = torch.tensor([2, 3, 1, 0], dtype=torch.int32)
    results = []
    for device in ("cpu", "cuda"):
        x = to_torch(case.x).to(device)
        qt = tep.quantize(x, quantizer)
        out, _ = tep.moe_permute(qt, torch.from_numpy(case.mask).to(device), case.num_out_tokens)
        chunks = tep.moe_sort_chunks_by_index(x, split.to(device), order.to(device))
        results.append([from_torch(out.rowwise_data).view(np.uint8), from_torch(out.rowwise_scale_inv),
                        from_torch(chunks)])
    for i, (c, g) in enumerate(zip(*results)):
        assert_bytes_equal(g, c, f"result {i}")


def test_moe_permute_jax_cuda_matches_cpu():
    jax = pytest.importorskip("jax")
    import twinengine.jax as tej

    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax has no CUDA device")
    case = make_case(7, 33, 16, 4, 64, "bfloat16", "mask", drop=True)
    n_out = case.resolved_num_out

    def run(x, probs, mask):
        out, pp, row_id_map = tej.moe_permute_with_probs(x, probs, mask, n_out)
        return out, pp, row_id_map, tej.moe_unpermute(out, row_id_map, merging_probs=probs)

    args = (case.x, case.probs, case.mask)
    cpu = jax.jit(run)(*[jax.device_put(a, jax.devices("cpu")[0]) for a in args])
    gpu = jax.jit(run)(*[jax.device_put(a, jax.devices("gpu")[0]) for a in args])
    for i, (c, g) in enumerate(zip(cpu, gpu)):
        assert_bytes_equal(np.asarray(g), np.asarray(c), f"result {i}")

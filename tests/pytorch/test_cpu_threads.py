"""CPU kernels give the same bytes at every thread count (torch.set_num_threads 1, 2, 3).

Every family's op runs on inputs large enough to be split into several pieces, with
subnormals, zeros and non-finite values mixed in (each worker thread must clear FTZ/DAZ
itself), and its outputs are compared byte for byte with the single-thread run. The
single-thread quantize output is also checked against the NumPy reference, so the
comparison is anchored to NUMERICS.md and not only to itself (the other formats' multi-thread
bytes meet their references in test_quantize_fp8_block.py / test_quantize_nvfp4.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch, make_input, to_torch
from quantize_cases import reference_quantize

import twinengine as te
import twinengine.pytorch as tep
from twinengine.pytorch._ops import activation as A
from twinengine.pytorch._ops import bias as B
from twinengine.pytorch._ops import dropout as D
from twinengine.pytorch._ops import norm as N

THREADS = (1, 2, 3)
SHAPE = (1536, 1024)  # 6 pieces of 2^18 elements for the per-element kernels


def _mixed(shape, seed=0) -> np.ndarray:
    """float32 normal values of mixed scales with subnormals and zeros sprinkled in."""
    x = make_input("mixed_scales", shape, "float32", seed=seed).astype(np.float32)
    sub = make_input("subnormal", shape, "float32", seed=seed + 1).astype(np.float32)
    rng = np.random.default_rng(seed)
    pick = rng.random(shape)
    x = np.where(pick < 0.05, sub, x)
    x = np.where(pick > 0.999, np.float32(0.0), x)
    return x.astype(np.float32)


def _bytes(result) -> list[np.ndarray]:
    """Every array of an op's result (tensors, QuantizedTensors, tuples) as raw bytes."""
    if result is None:
        return []
    if isinstance(result, (tuple, list)):
        return [b for r in result for b in _bytes(r)]
    if isinstance(result, te.QuantizedTensor):
        fields = fields_as_numpy(result)
        return [np.ascontiguousarray(fields[k]).view(np.uint8).reshape(-1) for k in sorted(fields)
                if fields[k] is not None]
    assert isinstance(result, torch.Tensor), type(result)
    return [from_torch(result.contiguous()).view(np.uint8).reshape(-1)]


def _run_at_threads(fn) -> list[list[np.ndarray]]:
    saved = torch.get_num_threads()
    try:
        out = []
        for n in THREADS:
            torch.set_num_threads(n)
            assert torch.get_num_threads() == n
            out.append(_bytes(fn()))
        return out
    finally:
        torch.set_num_threads(saved)


def _assert_same_at_every_thread_count(fn, what: str) -> None:
    runs = _run_at_threads(fn)
    assert runs[0], what
    for n, run in zip(THREADS[1:], runs[1:]):
        assert len(run) == len(runs[0])
        for i, (a, b) in enumerate(zip(runs[0], run)):
            assert_bytes_equal(b, a, f"{what}: output {i} at {n} threads vs 1 thread")


QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3"),
    te.Float8CurrentScalingQuantizer("e5m2", rowwise=False),
    te.MXFP8Quantizer("e4m3"),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    te.NVFP4Quantizer(),
    te.NVFP4Quantizer(with_rht=True, with_2d_quantization=True, stochastic_rounding=True),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: repr(q))
def test_quantize_bytes_do_not_depend_on_threads(q, dtype):
    if getattr(q, "with_rht", False) and dtype != "bfloat16":
        q = q.with_usage(columnwise=False)  # the columnwise RHT is defined for bf16 input only
    x_np = _mixed(SHAPE)
    x = to_torch(x_np).to(getattr(torch, dtype))
    rng = torch.tensor([12345, 678], dtype=torch.int64) if getattr(q, "stochastic_rounding", False) else None
    _assert_same_at_every_thread_count(lambda: tep.quantize(x, q, rng=rng), f"quantize {q!r} {dtype}")
    if q.scaling_mode in ("fp8_current", "mxfp8"):  # the formats reference_quantize covers
        saved = torch.get_num_threads()
        torch.set_num_threads(3)
        try:
            qt = tep.quantize(x, q)
        finally:
            torch.set_num_threads(saved)
        assert_quantized_equal(fields_as_numpy(qt), reference_quantize(from_torch(x), q), f"{q!r} {dtype} at 3 threads")


def test_dequantize_bytes_do_not_depend_on_threads():
    x = to_torch(_mixed(SHAPE))
    for q in QUANTIZERS[:5]:
        qt = tep.quantize(x, q)
        _assert_same_at_every_thread_count(lambda: tep.dequantize(qt, torch.float32, columnwise=not q.rowwise),
                                           f"dequantize {q!r}")


def test_norm_bytes_do_not_depend_on_threads():
    x = to_torch(_mixed(SHAPE))
    w = torch.randn(SHAPE[1], generator=torch.Generator().manual_seed(1))
    b = torch.randn(SHAPE[1], generator=torch.Generator().manual_seed(2))
    dy = torch.randn(SHAPE, generator=torch.Generator().manual_seed(3))
    xf = torch.randn(SHAPE, generator=torch.Generator().manual_seed(4))  # finite: meaningful backward sums
    _assert_same_at_every_thread_count(lambda: N.layernorm_fwd(x, w, b, 1e-5, False), "layernorm_fwd")
    _assert_same_at_every_thread_count(
        lambda: N.rmsnorm_fwd(x, w, 1e-5, False, quantizer=te.MXFP8Quantizer()), "rmsnorm_fwd + mxfp8")
    _, mu, rstd, _ = N.layernorm_fwd(xf, w, b, 1e-5, False)
    _assert_same_at_every_thread_count(lambda: N.layernorm_bwd(dy, xf, mu, rstd, w, False), "layernorm_bwd")


def test_activation_bias_dropout_bytes_do_not_depend_on_threads():
    x = to_torch(_mixed(SHAPE))
    dy = torch.randn(SHAPE[0], SHAPE[1] // 2, generator=torch.Generator().manual_seed(5))
    bias = torch.randn(SHAPE[1], generator=torch.Generator().manual_seed(6))
    rng = torch.tensor([0x1234ABCD, 7], dtype=torch.int64)
    _assert_same_at_every_thread_count(lambda: A.activation_fwd(x, "gelu"), "gelu")
    _assert_same_at_every_thread_count(
        lambda: A.activation_fwd(x, "swiglu", quantizer=te.Float8CurrentScalingQuantizer()), "swiglu + fp8")
    _assert_same_at_every_thread_count(lambda: A.activation_bwd(dy, x, "swiglu"), "swiglu backward")
    _assert_same_at_every_thread_count(lambda: B.bias_add(x, bias), "bias_add")
    _assert_same_at_every_thread_count(lambda: B.bias_grad(x, torch.float32), "bias_grad")
    _assert_same_at_every_thread_count(lambda: D.dropout_fwd(x, 0.3, rng), "dropout_fwd")


def test_permute_and_gemm_bytes_do_not_depend_on_threads():
    tokens, hidden, experts = 2048, 512, 8
    g = torch.Generator().manual_seed(7)
    x = torch.randn(tokens, hidden, generator=g)
    routing = (torch.rand(tokens, experts, generator=g) < 0.3).to(torch.uint8)
    probs = torch.rand(tokens, experts, generator=g) * routing
    _assert_same_at_every_thread_count(lambda: tep.moe_permute(x, routing), "moe_permute")
    out, row_id_map = tep.moe_permute(x, routing)
    _assert_same_at_every_thread_count(lambda: tep.moe_unpermute(out, row_id_map, merging_probs=probs),
                                       "moe_unpermute")
    a = to_torch(_mixed((256, 512), seed=8))
    w = torch.randn(384, 512, generator=g)
    _assert_same_at_every_thread_count(lambda: tep.gemm(a, w), "gemm fp32")
    qa, qw = tep.quantize(a, te.MXFP8Quantizer()), tep.quantize(w, te.MXFP8Quantizer())
    _assert_same_at_every_thread_count(lambda: tep.gemm(qa, qw), "gemm mxfp8")

"""Norm family on CUDA: byte equality with the CPU kernels forward, backward and fused-quantized,
in both frontends (skipped without a CUDA device)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_quantized_equal, fields_as_numpy, from_torch, to_torch
from norm_cases import (DTYPES, FUSED_QUANTIZERS, FUSED_SHAPE, KS, NORMS, assert_norm_equal, case_id, fused_dtype,
                        make_param, make_rows, param_dtype, quantize_kwargs, run_norm)

import twinengine as te
from twinengine.pytorch._ops import norm as tn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not te._C.has_cuda(), reason="twinengine was built without its CUDA kernels"),
]


def _on(device, arrays):
    return [None if a is None else to_torch(a).to(device) for a in arrays]


def _run(device, norm, x, weight, bias, zcg, dy, q=None):
    kwargs = {name: t.to(device) for name, t in quantize_kwargs(q, torch.from_numpy).items()} if q else {}
    fwd, qt, bwd = run_norm(tn, norm, *_on(device, (x, weight, bias)), zcg, _on(device, (dy,))[0], quantizer=q,
                            **kwargs)
    return [from_torch(t) for t in (*fwd, *bwd)], qt


@pytest.mark.parametrize("k", KS + (4096,))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", NORMS)
def test_norm_cuda_matches_cpu(norm, dtype, k):
    for rows, family, zcg in ((37, "mixed", True), (300, "nan_inf", False), (0, "mixed", False), (1, "mixed", True)):
        x = make_rows(max(rows, 1), k, dtype, family, seed=k)[:rows]
        weight = make_param(k, param_dtype(dtype, 1), k) if norm != "l2norm" else None
        bias = make_param(k, param_dtype(dtype, 2), k + 1) if norm == "layernorm" else None
        dy = make_rows(max(rows, 1), k, dtype, "mixed", seed=k + 2)[:rows]
        zcg = zcg and norm != "l2norm"
        cpu, _ = _run("cpu", norm, x, weight, bias, zcg, dy)
        cuda, _ = _run("cuda", norm, x, weight, bias, zcg, dy)
        for i, (c, g) in enumerate(zip(cpu, cuda, strict=True)):
            # NaN payloads differ by design (CUDA returns its canonical NaN): compared by predicate.
            assert_norm_equal(g, c, f"{norm} {dtype} K={k} rows={rows} output {i}")


@pytest.mark.parametrize("q", FUSED_QUANTIZERS, ids=case_id)
@pytest.mark.parametrize("norm", NORMS)
def test_norm_cuda_fused_quantize_matches_cpu(norm, q):
    dtype, k = fused_dtype(q), FUSED_SHAPE[-1]
    x = make_rows(128, k, dtype, "mixed", seed=3).reshape(FUSED_SHAPE)
    weight = make_param(k, "bfloat16", 3) if norm != "l2norm" else None
    bias = make_param(k, "float32", 4) if norm == "layernorm" else None
    cpu, cpu_qt = _run("cpu", norm, x, weight, bias, False, x, q)
    cuda, cuda_qt = _run("cuda", norm, x, weight, bias, False, x, q)
    for i, (c, g) in enumerate(zip(cpu, cuda, strict=True)):
        assert_norm_equal(g, c, f"{norm} fused output {i}")
    assert_quantized_equal(fields_as_numpy(cuda_qt), fields_as_numpy(cpu_qt), f"{norm} {case_id(q)} cuda vs cpu")


@pytest.mark.parametrize("q", [None, te.Float8CurrentScalingQuantizer("e4m3"), te.MXFP8Quantizer("e4m3"),
                               te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True)], ids=case_id)
def test_norm_cuda_graph_replay_matches_cpu(q):
    """Capturable: forward (with the fused quantization) and backward replay with no host sync."""
    k, dtype = 256, "bfloat16"
    weight = to_torch(make_param(k, "float32", 30)).cuda()
    bias = to_torch(make_param(k, "bfloat16", 31)).cuda()
    static_x = to_torch(make_rows(128, k, dtype, "mixed", seed=32)).cuda()
    static_dy = to_torch(make_rows(128, k, dtype, "mixed", seed=33)).cuda()
    kwargs = {name: t.cuda() for name, t in quantize_kwargs(q, torch.from_numpy).items()} if q else {}

    def step():
        fwd, qt, bwd = run_norm(tn, "layernorm", static_x, weight, bias, True, static_dy, quantizer=q, **kwargs)
        return fwd, qt, bwd

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graph expects
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    x = make_rows(128, k, dtype, "nan_inf", seed=34)
    static_x.copy_(to_torch(x).cuda())
    graph.replay()
    torch.cuda.synchronize()
    want, want_qt = _run("cpu", "layernorm", x, from_torch(weight), from_torch(bias), True, from_torch(static_dy), q)
    got = [from_torch(t) for t in (*captured[0], *captured[2])]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_norm_equal(g, w, f"graph replay output {i}")
    if q is not None:
        assert_quantized_equal(fields_as_numpy(captured[1]), fields_as_numpy(want_qt), "graph replay qt")


def test_norm_cuda_jax_matches_torch():
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU device")
    import jax.numpy as jnp

    from twinengine.jax._ops import norm as jn

    x = make_rows(96, 256, "bfloat16", "mixed", seed=11)
    weight, dy = make_param(256, "float32", 11), make_rows(96, 256, "bfloat16", "mixed", seed=12)
    q = te.MXFP8Quantizer()
    torch_out, torch_qt = _run("cuda", "rmsnorm", x, weight, None, True, dy, q)
    gpu = next(d for d in jax.devices() if d.platform == "gpu")
    j_fwd, j_qt, j_bwd = jax.jit(lambda x, w, dy: run_norm(jn, "rmsnorm", x, w, None, True, dy, quantizer=q))(
        *(jax.device_put(jnp.asarray(a), gpu) for a in (x, weight, dy)))
    for i, (t, j) in enumerate(zip(torch_out, [np.asarray(a) for a in (*j_fwd, *j_bwd)], strict=True)):
        assert_norm_equal(j, t, f"jax vs torch output {i}")
    assert_quantized_equal(fields_as_numpy(j_qt), fields_as_numpy(torch_qt), "jax vs torch qt")

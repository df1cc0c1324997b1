"""The cuBLASLt GEMM path on a CUDA device: every format through its Linear GEMMs (fprop,
dgrad, wgrad) against the CPU GEMM and the NumPy reference within the per-format tolerance
of docs/cuda.md (cuBLASLt's accumulation order is its own, so bytes may differ), the
dequantize fallback, the epilogues, the swizzle kernel against the host function, CUDA-graph
capture, and JAX on the GPU against torch on the GPU. Skipped without a CUDA device."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from reference.gemm import (fp8_block_operand_ref, gemm_cuda_tolerance_ref, gemm_ref, high_precision_operand_ref,
                            mxfp8_operand_ref, nvfp4_operand_ref, per_tensor_operand_ref)

import twinengine._C as _C
import twinengine.pytorch as te
from twinengine.ops.gemm import GEMM_PATHS
from twinengine.quantizers import Float8BlockQuantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, NVFP4Quantizer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and _C.has_cuda()),
                       reason="needs a CUDA device and a CUDA build of twinengine"),
]

# (input/weight quantizer, weight quantizer, grad quantizer) per format, as the recipes make them
# (NUMERICS.md §9): per-tensor FP8 gradients in E5M2, so dgrad/wgrad run E4M3 x E5M2.
RECIPES = {
    "fp8_current": (Float8CurrentScalingQuantizer(), Float8CurrentScalingQuantizer(),
                    Float8CurrentScalingQuantizer(fp8_dtype="e5m2")),
    "mxfp8": (MXFP8Quantizer(), MXFP8Quantizer(), MXFP8Quantizer()),
    "fp8_block": (Float8BlockQuantizer(), Float8BlockQuantizer(block_scaling_dim=2), Float8BlockQuantizer()),
    "nvfp4": (NVFP4Quantizer(), NVFP4Quantizer(with_2d_quantization=True), NVFP4Quantizer()),
}


def _to_cuda(qt):
    fields = {f.name: getattr(qt, f.name) for f in dataclasses.fields(qt)}
    return dataclasses.replace(qt, **{k: v.cuda() for k, v in fields.items() if isinstance(v, torch.Tensor)})


def _clone(qt):
    fields = {f.name: getattr(qt, f.name) for f in dataclasses.fields(qt)}
    return dataclasses.replace(qt, **{k: v.clone() for k, v in fields.items() if isinstance(v, torch.Tensor)})


def _operand_ref(x, columnwise: bool):
    """The reference (values, scales) of the copy the GEMM reads, from its stored bytes."""
    if isinstance(x, torch.Tensor):
        return high_precision_operand_ref(x.float().numpy(), columnwise)
    q = x.quantizer
    prefix = "columnwise" if columnwise else "rowwise"
    data = getattr(x, f"{prefix}_data").view(torch.uint8).numpy()
    scale = getattr(x, f"{prefix}_scale_inv").numpy()
    if q.scaling_mode == "mxfp8":
        return mxfp8_operand_ref(data, q.fp8_dtype, scale, columnwise)
    if q.scaling_mode == "fp8_block":
        return fp8_block_operand_ref(data, q.fp8_dtype, scale, q.block_scaling_dim == 2)
    if q.scaling_mode == "nvfp4":
        return nvfp4_operand_ref(data, scale, (x.columnwise_amax if columnwise else x.amax).numpy())
    return per_tensor_operand_ref(data, q.fp8_dtype, scale)


def _assert_within(got, a, b, a_col, b_col, bias, out_dtype, fmt, context):
    ra, rb = _operand_ref(a, a_col), _operand_ref(b, b_col)
    exact, magnitude = gemm_ref(ra, rb, None if bias is None else bias.float().numpy())
    tol = gemm_cuda_tolerance_ref(exact, magnitude, ra[0].shape[1], out_dtype, fmt)
    err = np.abs(got.float().cpu().numpy() - exact)
    worst = np.unravel_index(np.argmax(err - tol), err.shape)
    assert np.all(err <= tol), f"{context}: |err| {err[worst]:.3g} > tol {tol[worst]:.3g} at {worst}"


def _plan_path(a, b, a_col, b_col, bias, out_dtype):
    from twinengine.ops.gemm import gemm_plan_query
    from twinengine.pytorch._library import meta

    major, minor = torch.cuda.get_device_capability()
    desc = [x if not isinstance(x, torch.Tensor) else meta(x) for x in (a, b)]
    query = gemm_plan_query(*desc, meta(bias), a_columnwise=a_col, b_columnwise=b_col, out_dtype=out_dtype,
                            sm=10 * major + minor, cublaslt_version=_C.gemm_cublaslt_version())
    return GEMM_PATHS[_C.gemm_plan(query)["path"]]


def test_gemm_cublaslt_loads_on_the_device_machine():
    """scripts/setup.sh installs the nvidia-cublas wheel for CUDA builds; the extension finds it."""
    assert _C.gemm_cublaslt_version() >= 120800


M, K, N = 256, 512, 384


@pytest.fixture(scope="module")
def tensors():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(M, K, generator=g), "w": torch.randn(N, K, generator=g) * 0.5,
            "dy": torch.randn(M, N, generator=g) * 0.1}


@pytest.mark.parametrize("fmt", list(RECIPES))
@pytest.mark.parametrize("gemm", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("out_dtype, bias_dtype", [("float32", None), ("bfloat16", "bfloat16"), ("float16", "float32")])
def test_gemm_cublaslt_matches_cpu_within_format_tolerance(tensors, fmt, gemm, out_dtype, bias_dtype):
    qx, qw, qg = RECIPES[fmt]
    x, w, dy = te.quantize(tensors["x"], qx), te.quantize(tensors["w"], qw), te.quantize(tensors["dy"], qg)
    a, b, a_col, b_col = {"fprop": (x, w, False, False), "dgrad": (dy, w, False, True),
                          "wgrad": (dy, x, True, True)}[gemm]
    n_out = {"fprop": N, "dgrad": K, "wgrad": K}[gemm]
    bias = None if bias_dtype is None else (torch.randn(n_out) * 0.1).to(getattr(torch, bias_dtype))
    kwargs = {"a_columnwise": a_col, "b_columnwise": b_col, "out_dtype": getattr(torch, out_dtype)}
    cpu = te.gemm(a, b, bias, **kwargs)
    gpu = te.gemm(_to_cuda(a), _to_cuda(b), None if bias is None else bias.cuda(), **kwargs)
    path = _plan_path(a, b, a_col, b_col, bias, out_dtype)
    assert path in ("cublaslt", "dequant_cublaslt")
    context = f"{fmt} {gemm} out={out_dtype} bias={bias_dtype} path={path}"
    _assert_within(gpu, a, b, a_col, b_col, bias, out_dtype, fmt, context)
    _assert_within(cpu, a, b, a_col, b_col, bias, out_dtype, "high_precision", "cpu " + context)


@pytest.mark.parametrize("fmt, shape", [("fp8_current", (72, 80, 128)), ("nvfp4", (48, 64, 1040)),
                                        ("mxfp8", (96, 160, 64))])
def test_gemm_cublaslt_unaligned_shapes(fmt, shape):
    """Shapes off the native kernels' alignment take the dequantize + bf16/fp32 cuBLASLt path."""
    m, n, k = shape
    qx, qw, _ = RECIPES[fmt]
    g = torch.Generator().manual_seed(1)
    a, b = te.quantize(torch.randn(m, k, generator=g), qx), te.quantize(torch.randn(n, k, generator=g), qw)
    gpu = te.gemm(_to_cuda(a), _to_cuda(b), out_dtype=torch.bfloat16)
    _assert_within(gpu, a, b, False, False, None, "bfloat16", fmt, f"{fmt} {shape}")
    if fmt != "mxfp8":
        assert _plan_path(a, b, False, False, None, "bfloat16") == "dequant_cublaslt"


@pytest.mark.parametrize("a_dtype, b_dtype, out_dtype, bias_dtype", [
    ("bfloat16", "bfloat16", "bfloat16", "bfloat16"),  # cuBLASLt bias epilogue
    ("float32", "float32", "float32", "float32"),      # fp32 GEMM, bias added after
    ("float16", "bfloat16", "float16", None),          # mixed dtypes: widened to fp32
    ("float32", "float32", "bfloat16", "float16"),     # fp32 staging, one rounding
])
@pytest.mark.parametrize("columnwise", [(False, False), (True, True)], ids=["nt", "tn"])
def test_gemm_cublaslt_high_precision(a_dtype, b_dtype, out_dtype, bias_dtype, columnwise):
    g = torch.Generator().manual_seed(2)
    a_col, b_col = columnwise
    a = torch.randn(*((K, M) if a_col else (M, K)), generator=g).to(getattr(torch, a_dtype))
    b = torch.randn(*((K, N) if b_col else (N, K)), generator=g).to(getattr(torch, b_dtype))
    bias = None if bias_dtype is None else torch.randn(N, generator=g).to(getattr(torch, bias_dtype))
    kwargs = {"a_columnwise": a_col, "b_columnwise": b_col, "out_dtype": getattr(torch, out_dtype)}
    gpu = te.gemm(a.cuda(), b.cuda(), None if bias is None else bias.cuda(), **kwargs)
    _assert_within(gpu, a, b, a_col, b_col, bias, out_dtype, "high_precision", f"{a_dtype}x{b_dtype}->{out_dtype}")


@pytest.mark.parametrize("shape, transposed", [((256, 8), False), ((384, 12), False), ((4, 256), True)])
def test_gemm_swizzle_scales_cuda_matches_host(shape, transposed):
    compact = torch.randint(0, 256, shape, dtype=torch.uint8)

    def run(x, device_code, stream):
        out = torch.empty(x.numel(), dtype=torch.uint8, device=x.device)
        _C.call("gemm_swizzle_scales", [(x.data_ptr(), 5, device_code, tuple(x.shape))],
                [(out.data_ptr(), 5, device_code, tuple(out.shape))], {"transposed": int(transposed), "inverse": 0},
                stream)
        return out

    host = run(compact, 0, 0)
    dev = compact.cuda()
    gpu = run(dev, 1, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.equal(gpu.cpu(), host)


@pytest.mark.parametrize("fmt", ["fp8_current", "mxfp8", "nvfp4"])
def test_gemm_cublaslt_cuda_graph_replay(fmt):
    """No host sync and framework-allocated workspace: a captured GEMM replays on new data."""
    qx, qw, _ = RECIPES[fmt]
    g = torch.Generator().manual_seed(3)
    a1, a2 = (_to_cuda(te.quantize(torch.randn(M, K, generator=g), qx)) for _ in range(2))
    b1, b2 = (_to_cuda(te.quantize(torch.randn(N, K, generator=g), qw)) for _ in range(2))
    static_a, static_b = _clone(a1), _clone(b1)
    te.gemm(static_a, static_b, out_dtype=torch.bfloat16)  # warm up (handle, heuristics)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = te.gemm(static_a, static_b, out_dtype=torch.bfloat16)
    for src_a, src_b in ((a2, b2), (a1, b1)):
        for f in dataclasses.fields(src_a):
            for dst, src in ((static_a, src_a), (static_b, src_b)):
                t = getattr(src, f.name)
                if isinstance(t, torch.Tensor):
                    getattr(dst, f.name).copy_(t)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, te.gemm(src_a, src_b, out_dtype=torch.bfloat16))


def test_gemm_cublaslt_jax_matches_torch_on_gpu(tensors):
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax has no GPU backend (install a CUDA jaxlib plugin)")
    import twinengine.jax as tej

    q = MXFP8Quantizer()
    x, w = te.quantize(tensors["x"], q), te.quantize(tensors["w"], q)
    expected = te.gemm(_to_cuda(x), _to_cuda(w), out_dtype=torch.bfloat16).float().cpu().numpy()
    jx = tej.quantize(jax.device_put(tensors["x"].numpy(), gpu), q)
    jw = tej.quantize(jax.device_put(tensors["w"].numpy(), gpu), q)
    got = jax.jit(lambda a, b: tej.gemm(a, b, out_dtype=jax.numpy.bfloat16))(jx, jw)
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32), expected)

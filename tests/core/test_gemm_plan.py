"""The GEMM dispatcher (csrc/abi/gemm_plan.cc, one C++ table) checked on the host for every
combination of format × operand dtypes × device capability × cuBLASLt version × layout ×
output/bias dtype, against the rules of NUMERICS.md §8 and docs/cuda.md restated here; and
core's workspace size (core/ops/gemm.py) against the plan's."""

from __future__ import annotations

import itertools

import pytest

import twinengine._C as _C
from twinengine.dtypes import ABI_CODES
from twinengine.ops.gemm import (GEMM, GEMM_EPILOGUES, GEMM_PATHS, GEMM_STAGINGS, gemm_plan_query,
                                 gemm_workspace_bytes, with_workspace)
from twinengine.ops.quantize import ArrayMeta
from twinengine.quantized_tensor import QuantizedTensor
from twinengine.quantizers import Float8BlockQuantizer, MXFP8Quantizer, NVFP4Quantizer

HP, PER_TENSOR, MXFP8, BLOCK, NVFP4 = range(5)
F32, BF16, F16, E4M3, E5M2, U8 = (ABI_CODES[n] for n in
                                  ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "uint8"))
SMS = [80, 89, 90, 100, 103, 120]
VERSIONS = [0, 120800, 120900, 130002]
SCALE_MODE = {PER_TENSOR: 0, NVFP4: 1, MXFP8: 2}  # cublasLtMatmulMatrixScale_t (cublasLt.h)

OPERAND_DTYPES = {
    HP: list(itertools.product([F32, BF16, F16], repeat=2)),
    PER_TENSOR: list(itertools.product([E4M3, E5M2], repeat=2)),
    MXFP8: list(itertools.product([E4M3, E5M2], repeat=2)),
    BLOCK: list(itertools.product([E4M3, E5M2], repeat=2)),
    NVFP4: [(U8, U8)],
}


def _layouts(scaling):
    """(a_k_major, b_k_major, a_block_2d, b_block_2d) the ABI accepts for a format."""
    if scaling in (HP, MXFP8):
        return [(ak, bk, 0, 0) for ak, bk in itertools.product([1, 0], repeat=2)]
    if scaling == BLOCK:
        return [(1, 1, 0, 0), (1, 1, 0, 1), (1, 1, 1, 0)]
    return [(1, 1, 0, 0)]


def _query(scaling, dtypes, layout, sm, version, *, m=256, n=512, k=1024, out=BF16, bias=None, device=1):
    return {"scaling": scaling, "a_dtype": dtypes[0], "b_dtype": dtypes[1], "out_dtype": out,
            "has_bias": int(bias is not None), "bias_dtype": bias if bias is not None else 0,
            "a_k_major": layout[0], "b_k_major": layout[1], "a_block_2d": layout[2], "b_block_2d": layout[3],
            "m": m, "n": n, "k": k, "a_scale_bytes": 4096 if scaling in (MXFP8, NVFP4) else 0,
            "b_scale_bytes": 8192 if scaling in (MXFP8, NVFP4) else 0, "device": device, "sm": sm,
            "cublaslt_version": version}


def _expected_native(q):
    """NUMERICS.md §8 / docs/cuda.md: where a format runs natively in cuBLASLt."""
    s, sm, v = q["scaling"], q["sm"], q["cublaslt_version"]
    both_e5m2 = q["a_dtype"] == E5M2 and q["b_dtype"] == E5M2
    tn = q["a_k_major"] and q["b_k_major"]
    m, n, k = q["m"], q["n"], q["k"]
    if s == HP:
        return q["a_dtype"] == q["b_dtype"]
    if s == PER_TENSOR:
        return sm >= 89 and not both_e5m2 and k % 16 == 0 and m % 16 == 0 and n % 16 == 0
    if s == MXFP8:
        return sm >= 100 and v >= 120800 and not both_e5m2 and (tn or 100 <= sm < 120) and k % 32 == 0
    if s == BLOCK:
        return sm == 90 and v >= 120900 and not both_e5m2 and k % 128 == 0 and m % 16 == 0 and n % 16 == 0
    return sm >= 100 and v >= 120800 and k % 32 == 0 and m % 32 == 0 and n % 32 == 0


def _expected_staging(q, native):
    s = q["scaling"]
    if native:
        return "swizzle" if s in (MXFP8, NVFP4) else "none"
    return "bfloat16" if s in (MXFP8, NVFP4) else "float32"


def _expected_epilogue(q, compute, native):
    out, bias = q["out_dtype"], q["bias_dtype"] if q["has_bias"] else None
    direct = {F32: out == F32, BF16: out in (BF16, F32), F16: out in (F16, F32)}.get(
        compute, out != F16 or (native and q["scaling"] != BLOCK))
    if not direct:
        return "staged"
    if bias is None:
        return "direct"
    if out != F32 and bias == out and (q["scaling"] in (HP, PER_TENSOR) or not native):
        return "cublas_bias"
    return "bias_add" if out == F32 else "staged"


def _all_queries():
    for scaling, dtype_list in OPERAND_DTYPES.items():
        for dtypes, layout, sm, version in itertools.product(dtype_list, _layouts(scaling), SMS, VERSIONS):
            yield _query(scaling, dtypes, layout, sm, version)


def _check(q):
    plan = _C.gemm_plan(q)
    path = GEMM_PATHS[plan["path"]]
    if q["cublaslt_version"] == 0:
        assert path == "tiled", plan
        assert plan["workspace_bytes"] == 0 == gemm_workspace_bytes(plan, q)
        return plan
    native = _expected_native(q)
    assert path == ("cublaslt" if native else "dequant_cublaslt"), (q, plan)
    # cuBLASLt computes outᵀ = B·Aᵀ column-major: its A is our B (T when K-major), its B our A.
    assert plan["cublas_transa"] == (1 if q["b_k_major"] else 0)
    assert plan["cublas_transb"] == (0 if q["a_k_major"] else 1)
    staging = _expected_staging(q, native)
    assert GEMM_STAGINGS[plan["a_staging"]] == staging == GEMM_STAGINGS[plan["b_staging"]]
    if native and q["scaling"] != HP:
        if q["scaling"] == BLOCK:
            modes = [5 if q[f"{x}_block_2d"] else 4 for x in "ab"]  # BLK128x128_32F / VEC128_32F
        else:
            modes = [SCALE_MODE[q["scaling"]]] * 2
        assert [plan["a_scale_mode"], plan["b_scale_mode"]] == modes
        assert (plan["a_compute_dtype"], plan["b_compute_dtype"]) == (q["a_dtype"], q["b_dtype"])
    else:
        assert plan["a_scale_mode"] == plan["b_scale_mode"] == -1
        expect = {"none": (q["a_dtype"], q["b_dtype"]), "bfloat16": (BF16, BF16), "float32": (F32, F32)}[staging]
        assert (plan["a_compute_dtype"], plan["b_compute_dtype"]) == expect
    assert GEMM_EPILOGUES[plan["epilogue"]] == _expected_epilogue(q, plan["a_compute_dtype"], native), (q, plan)
    assert plan["workspace_bytes"] == gemm_workspace_bytes(plan, q) > 32 * 2**20
    if not native:
        assert plan["reason"].startswith("dequantize: ")
    return plan


def test_gemm_plan_every_format_capability_version_layout():
    count = 0
    for q in _all_queries():
        _check(q)
        count += 1
    assert count == 6 * 4 * (9 * 4 + 4 + 4 * 4 + 4 * 3 + 1)


@pytest.mark.parametrize("scaling, dtypes", [(HP, (BF16, BF16)), (HP, (F32, BF16)), (PER_TENSOR, (E4M3, E5M2)),
                                             (MXFP8, (E4M3, E4M3)), (BLOCK, (E4M3, E4M3)), (NVFP4, (U8, U8))])
@pytest.mark.parametrize("sm", [89, 90, 100])
def test_gemm_plan_every_output_and_bias_dtype(scaling, dtypes, sm):
    for out, bias in itertools.product([F32, BF16, F16], [None, F32, BF16, F16]):
        _check(_query(scaling, dtypes, _layouts(scaling)[0], sm, 130002, out=out, bias=bias))


@pytest.mark.parametrize("scaling, dtypes, shape, reason", [
    (PER_TENSOR, (E4M3, E4M3), (256, 512, 1000), "K=1000 not a multiple of 16"),
    (PER_TENSOR, (E4M3, E4M3), (70, 512, 1024), "not multiples of 16"),
    (BLOCK, (E4M3, E4M3), (256, 512, 1088), "K=1088 not a multiple of 128"),
    (NVFP4, (U8, U8), (48, 512, 1024), "not multiples of 32"),
    (NVFP4, (U8, U8), (256, 512, 1040), "K=1040 not a multiple of 32"),
])
def test_gemm_plan_unaligned_shapes_dequantize(scaling, dtypes, shape, reason):
    m, n, k = shape
    sm = 90 if scaling == BLOCK else 100
    plan = _check(_query(scaling, dtypes, (1, 1, 0, 0), sm, 130002, m=m, n=n, k=k))
    assert GEMM_PATHS[plan["path"]] == "dequant_cublaslt" and reason in plan["reason"]


def test_gemm_plan_degenerate_and_cpu():
    q = _query(MXFP8, (E4M3, E4M3), (1, 1, 0, 0), 100, 130002)
    assert GEMM_PATHS[_C.gemm_plan({**q, "m": 0})["path"]] == "none"
    assert GEMM_PATHS[_C.gemm_plan({**q, "n": 0})["path"]] == "none"
    assert GEMM_PATHS[_C.gemm_plan({**q, "k": 0})["path"]] == "tiled"
    cpu = _C.gemm_plan({**q, "device": 0, "sm": 0})
    assert GEMM_PATHS[cpu["path"]] == "cpu" and cpu["workspace_bytes"] == 0


@pytest.mark.parametrize("change, message", [
    ({"scaling": NVFP4, "a_dtype": U8, "b_dtype": U8, "a_k_major": 0}, "must be K-major"),
    ({"scaling": PER_TENSOR, "b_k_major": 0}, "must be K-major"),
    ({"scaling": BLOCK, "a_block_2d": 1, "b_block_2d": 1}, "both are 2D"),
    ({"a_block_2d": 1}, "block_2d applies to FP8 block operands only"),
    ({"a_dtype": BF16}, "does not fit the GEMM format"),
    ({"scaling": NVFP4}, "does not fit the GEMM format"),
    ({"scaling": 7}, "unknown GEMM scaling mode 7"),
    ({"out_dtype": E4M3}, "out must be float32, bfloat16 or float16"),
    ({"has_bias": 1, "bias_dtype": U8}, "bias must be float32, bfloat16 or float16"),
    ({"sm": 0}, "needs the compute capability"),
    ({"k": -1}, "must be >= 0"),
])
def test_gemm_plan_rejects_impossible_combinations(change, message):
    q = {**_query(MXFP8, (E4M3, E4M3), (1, 1, 0, 0), 100, 130002), **change}
    with pytest.raises(ValueError, match=message):
        _C.gemm_plan(q)


def _qt(quantizer, data_shape, data_dtype, scale_shape, scale_dtype, shape, columnwise=False):
    prefix = "columnwise" if columnwise else "rowwise"
    return QuantizedTensor(**{f"{prefix}_data": ArrayMeta(data_shape, data_dtype),
                              f"{prefix}_scale_inv": ArrayMeta(scale_shape, scale_dtype)},
                           amax=ArrayMeta((1,), "float32"), columnwise_amax=ArrayMeta((1,), "float32"),
                           quantizer=quantizer, shape=shape)


def test_gemm_plan_query_from_core_descriptions():
    """core builds the query (layout, K, scale bytes) from the same descriptions the op checks."""
    mx = MXFP8Quantizer()
    # wgrad-like: both MXFP8 columnwise copies (same (R, K) shape as rowwise, K-minor for the GEMM).
    a = _qt(mx, (256, 128), "float8_e4m3fn", (8, 128), "uint8", (256, 128), columnwise=True)
    b = _qt(mx, (256, 64), "float8_e4m3fn", (8, 128), "uint8", (256, 64), columnwise=True)
    q = gemm_plan_query(a, b, None, a_columnwise=True, b_columnwise=True, out_dtype="bfloat16", sm=100,
                        cublaslt_version=130002)
    assert (q["m"], q["n"], q["k"], q["a_k_major"], q["b_k_major"]) == (128, 64, 256, 0, 0)
    assert (q["a_scale_bytes"], q["b_scale_bytes"], q["a_dtype"]) == (1024, 1024, E4M3)
    plan = _C.gemm_plan(q)
    assert GEMM_PATHS[plan["path"]] == "cublaslt" and (plan["cublas_transa"], plan["cublas_transb"]) == (0, 1)
    nv = NVFP4Quantizer()
    x = _qt(nv, (256, 512), "uint8", (256, 64), "uint8", (256, 1024))
    w = _qt(nv, (128, 512), "uint8", (128, 64), "uint8", (128, 1024))
    q = gemm_plan_query(x, w, ArrayMeta((128,), "bfloat16"), out_dtype="bfloat16", sm=90, cublaslt_version=130002)
    assert (q["m"], q["n"], q["k"], q["has_bias"], q["bias_dtype"]) == (256, 128, 1024, 1, BF16)
    plan = _C.gemm_plan(q)
    assert GEMM_PATHS[plan["path"]] == "dequant_cublaslt"
    ws = gemm_workspace_bytes(plan, q)
    assert ws == plan["workspace_bytes"] == 32 * 2**20 + 256 * 1024 * 2 + 128 * 1024 * 2 + 512
    blk = Float8BlockQuantizer(block_scaling_dim=2)
    w2 = _qt(blk, (128, 1024), "float8_e4m3fn", (1, 8), "float32", (128, 1024))
    x1 = _qt(Float8BlockQuantizer(), (256, 1024), "float8_e4m3fn", (8, 256), "float32", (256, 1024))
    q = gemm_plan_query(x1, w2, out_dtype="float32", sm=90, cublaslt_version=130002)
    assert (q["a_block_2d"], q["b_block_2d"], q["b_scale_bytes"]) == (0, 1, 32)
    plan = _C.gemm_plan(q)
    assert GEMM_PATHS[plan["path"]] == "cublaslt" and (plan["a_scale_mode"], plan["b_scale_mode"]) == (4, 5)
    call = with_workspace(GEMM.infer(x1, w2, out_dtype="float32"), gemm_workspace_bytes(plan, q))
    assert [(s.name, s.shape, s.dtype) for s in call.outputs] == [
        ("out", (256, 128), "float32"), ("workspace", (plan["workspace_bytes"],), "uint8")]
    assert with_workspace(call, 0) is call


def test_gemm_cublaslt_loads_in_cuda_builds():
    """A CUDA build finds libcublasLt at run time (the wheel beside the installed extension, or
    the one it was built with) even without a GPU or driver; a CPU build reports none."""
    version = _C.gemm_cublaslt_version()
    if _C.has_cuda():
        assert version >= 120800
    else:
        assert version == 0

"""The CUDA GEMM against the CPU GEMM and the NumPy reference (NUMERICS.md §8: equal within the
per-format CUDA tolerance of docs/cuda.md; more cases in test_gemm_cublaslt.py)."""

import dataclasses

import numpy as np
import pytest
import torch

import twinengine._C as _C
import twinengine.pytorch as te
from twinengine.quantizers import Float8BlockQuantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, NVFP4Quantizer
from reference.gemm import (fp8_block_operand_ref, gemm_cuda_tolerance_ref, gemm_ref, mxfp8_operand_ref,
                            nvfp4_operand_ref, per_tensor_operand_ref)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and _C.has_cuda()),
                       reason="needs a CUDA device and a CUDA build of twinengine"),
]


def _to_cuda(qt):
    fields = {f.name: getattr(qt, f.name) for f in dataclasses.fields(qt)}
    return dataclasses.replace(qt, **{k: v.cuda() for k, v in fields.items() if isinstance(v, torch.Tensor)})


QUANTIZERS = [Float8CurrentScalingQuantizer(), MXFP8Quantizer(), Float8BlockQuantizer(), NVFP4Quantizer()]


@pytest.mark.parametrize("quantizer", QUANTIZERS, ids=["fp8", "mxfp8", "fp8_block", "nvfp4"])
@pytest.mark.parametrize("usage", [(False, False), (True, True)], ids=["fprop", "wgrad"])
def test_gemm_cuda_matches_reference(quantizer, usage):
    rng = np.random.default_rng(0)
    a_col, b_col = usage
    a = te.quantize(torch.from_numpy(rng.standard_normal((128, 256)).astype(np.float32)), quantizer)
    b = te.quantize(torch.from_numpy(rng.standard_normal((128 if a_col else 256, 256)).astype(np.float32)), quantizer)
    out = te.gemm(_to_cuda(a), _to_cuda(b), a_columnwise=a_col, b_columnwise=b_col).cpu()

    def ref(qt, col):
        prefix = "columnwise" if col else "rowwise"
        data = getattr(qt, f"{prefix}_data").view(torch.uint8).numpy()
        scale = getattr(qt, f"{prefix}_scale_inv").numpy()
        if quantizer.scaling_mode == "mxfp8":
            return mxfp8_operand_ref(data, "e4m3", scale, col)
        if quantizer.scaling_mode == "fp8_block":
            return fp8_block_operand_ref(data, "e4m3", scale, False)
        if quantizer.scaling_mode == "nvfp4":
            return nvfp4_operand_ref(data, scale, (qt.columnwise_amax if col else qt.amax).numpy())
        return per_tensor_operand_ref(data, "e4m3", scale)

    ra, rb = ref(a, a_col), ref(b, b_col)
    exact, magnitude = gemm_ref(ra, rb)
    tol = gemm_cuda_tolerance_ref(exact, magnitude, ra[0].shape[1], "float32", quantizer.scaling_mode)
    assert np.all(np.abs(out.numpy() - exact) <= tol)


def test_gemm_cuda_high_precision_matches_cpu_within_tolerance():
    x, w = torch.randn(70, 50), torch.randn(30, 50)
    cpu = te.gemm(x, w, torch.ones(30))
    gpu = te.gemm(x.cuda(), w.cuda(), torch.ones(30).cuda()).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-5)

"""torch.ops.twinengine.gemm / gemm_quantized against the NumPy reference (NUMERICS.md §8)."""

import numpy as np
import pytest
import torch

import twinengine.pytorch as te
from twinengine.quantizers import (Float8BlockQuantizer, Float8CurrentScalingQuantizer, Float8DelayedScalingQuantizer,
                                   MXFP8Quantizer, NVFP4Quantizer)
from reference.gemm import (fp8_block_operand_ref, gemm_ref, gemm_tolerance_ref, high_precision_operand_ref,
                            mxfp8_operand_ref, nvfp4_operand_ref, per_tensor_operand_ref)

# format -> role -> quantizer (None: high precision, the tensor's own dtype)
FORMATS = {
    "fp32": None,
    "bf16": None,
    "fp8_current": {"input": Float8CurrentScalingQuantizer("e4m3"), "weight": Float8CurrentScalingQuantizer("e4m3"),
                    "grad_output": Float8CurrentScalingQuantizer("e5m2")},
    "fp8_delayed": {"input": Float8DelayedScalingQuantizer("e4m3"), "weight": Float8DelayedScalingQuantizer("e4m3"),
                    "grad_output": Float8DelayedScalingQuantizer("e5m2")},
    "mxfp8": {"input": MXFP8Quantizer("e4m3"), "weight": MXFP8Quantizer("e4m3"), "grad_output": MXFP8Quantizer("e5m2")},
    "mxfp8_2d": {"input": MXFP8Quantizer("e4m3"), "weight": MXFP8Quantizer("e4m3", with_2d_quantization=True),
                 "grad_output": MXFP8Quantizer("e4m3")},
    "fp8_block": {"input": Float8BlockQuantizer("e4m3"), "weight": Float8BlockQuantizer("e4m3", block_scaling_dim=2),
                  "grad_output": Float8BlockQuantizer("e5m2")},
    "nvfp4": {"input": NVFP4Quantizer(), "weight": NVFP4Quantizer(with_2d_quantization=True),
              "grad_output": NVFP4Quantizer()},
    # bf16 inputs: the columnwise copies of input and grad_output carry the Hadamard transform
    "nvfp4_rht": {"input": NVFP4Quantizer(with_rht=True), "weight": NVFP4Quantizer(with_2d_quantization=True),
                  "grad_output": NVFP4Quantizer(with_rht=True)},
}
# FP8 block needs rows and K divisible by 128
BLOCK_128 = ("fp8_block",)
# usage -> (a role, b role, a_columnwise, b_columnwise)
USAGES = {
    "fprop": ("input", "weight", False, False),
    "dgrad": ("grad_output", "weight", False, True),
    "wgrad": ("grad_output", "input", True, True),
}
M, N, K = 64, 32, 96


def tensors(seed=0, scale=1):
    rng = np.random.default_rng(seed)
    m, n, k = M * scale, N * scale, K * scale
    x = rng.standard_normal((2, m // 2, k)).astype(np.float32) * 3
    w = rng.standard_normal((n, k)).astype(np.float32) / 4
    dy = rng.standard_normal((2, m // 2, n)).astype(np.float32) * 1e-3
    bias = rng.standard_normal(N).astype(np.float32)
    return {"input": x, "weight": w, "grad_output": dy, "bias": bias}


def operand(fmt, role, array):
    """The operand in framework `te` (torch) form for this format."""
    t = torch.from_numpy(array)
    if fmt in ("bf16", "nvfp4_rht"):
        t = t.to(torch.bfloat16)
    if FORMATS[fmt] is None:
        return t
    q = FORMATS[fmt][role]
    scale = torch.tensor([0.5 if role == "grad_output" else 8.0]) if fmt == "fp8_delayed" else None
    return te.quantize(t, q, scale=scale)


def ref_operand(fmt, x, columnwise):
    if FORMATS[fmt] is None:
        return high_precision_operand_ref(x.float().numpy(), columnwise)
    prefix = "columnwise" if columnwise else "rowwise"
    data = getattr(x, f"{prefix}_data").view(torch.uint8).numpy()
    scale = getattr(x, f"{prefix}_scale_inv").numpy()
    if fmt.startswith("mxfp8"):
        return mxfp8_operand_ref(data, x.quantizer.fp8_dtype, scale, columnwise)
    if fmt == "fp8_block":
        return fp8_block_operand_ref(data, x.quantizer.fp8_dtype, scale, x.quantizer.block_scaling_dim == 2)
    if fmt.startswith("nvfp4"):
        return nvfp4_operand_ref(data, scale, (x.columnwise_amax if columnwise else x.amax).numpy())
    return per_tensor_operand_ref(data, x.quantizer.fp8_dtype, scale)


def check_against_reference(out, fmt, a, b, a_col, b_col, bias, out_dtype):
    exact, magnitude = gemm_ref(ref_operand(fmt, a, a_col), ref_operand(fmt, b, b_col), bias)
    k = ref_operand(fmt, a, a_col)[0].shape[1]
    err = np.abs(out.float().numpy().astype(np.float64) - exact)
    tol = gemm_tolerance_ref(exact, magnitude, k, out_dtype)
    bad = np.argwhere(err > tol)
    assert bad.size == 0, f"first bad index {tuple(bad[0])}: got {out.float()[tuple(bad[0])]}, exact " \
                          f"{exact[tuple(bad[0])]}, tol {tol[tuple(bad[0])]}"


@pytest.mark.parametrize("usage", USAGES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype,with_bias", [(torch.float32, False), (torch.bfloat16, True)])
def test_gemm_matches_reference(fmt, usage, out_dtype, with_bias):
    arrays = tensors(scale=4 if fmt in BLOCK_128 else 1)
    a_role, b_role, a_col, b_col = USAGES[usage]
    a, b = operand(fmt, a_role, arrays[a_role]), operand(fmt, b_role, arrays[b_role])
    n = b.shape[0] if not b_col else b.shape[-1]
    bias = torch.from_numpy(arrays["bias"][:n].copy()) if with_bias else None
    if with_bias and n != N:
        bias = torch.ones(n)
    out = te.gemm(a, b, bias, a_columnwise=a_col, b_columnwise=b_col, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    check_against_reference(out, fmt, a, b, a_col, b_col, None if bias is None else bias.numpy(),
                            str(out_dtype).removeprefix("torch."))


def test_gemm_mxfp8_scales_each_block_partial_sum():
    # Hand-made bytes: a = 1.0 with block scale 2^-120, b = 448 with block scale 2^127 (its
    # dequantized values overflow fp32). Per §8 each block's partial sum 32·448 is scaled
    # fl(fl(p·2^-120)·2^127) = 14336·2^7, finite; two blocks add up exactly.
    from twinengine import QuantizedTensor

    def mx(code, exponent):
        data = torch.full((32, 64), code, dtype=torch.uint8).view(torch.float8_e4m3fn)
        scale = torch.zeros(128, 4, dtype=torch.uint8)
        scale[:32, :2] = exponent
        return QuantizedTensor(rowwise_data=data, rowwise_scale_inv=scale, quantizer=MXFP8Quantizer(columnwise=False),
                               shape=(32, 64))

    out = te.gemm(mx(0x38, 127 - 120), mx(0x7E, 254))
    assert torch.equal(out, torch.full((32, 32), 2 * 14336.0 * 2**7))


def test_gemm_opcheck():
    arrays = tensors()
    x, w = torch.from_numpy(arrays["input"]).reshape(M, K), torch.from_numpy(arrays["weight"])
    torch.library.opcheck(torch.ops.twinengine.gemm.default, (x, w, None, False, False, "float32"))
    q = MXFP8Quantizer()
    dy = torch.from_numpy(arrays["grad_output"]).reshape(M, N)
    qdy, qx = te.quantize(dy, q), te.quantize(x, q)
    torch.library.opcheck(torch.ops.twinengine.gemm_quantized.default,
                          (qdy.columnwise_data, qdy.columnwise_scale_inv, None, q, qx.columnwise_data,
                           qx.columnwise_scale_inv, None, q, None, True, True, "bfloat16"),
                          # test_schema perturbs inputs with arithmetic torch lacks for float8 dtypes
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_gemm_compiled_matches_eager():
    arrays = tensors()
    x, w = torch.from_numpy(arrays["input"]), torch.from_numpy(arrays["weight"])
    bias = torch.from_numpy(arrays["bias"])
    q = MXFP8Quantizer()

    def f(x, w, bias):
        qx, qw = te.quantize(x, q), te.quantize(w, q)
        return te.gemm(qx, qw, bias), te.gemm(x, w, out_dtype=torch.bfloat16)

    eager = f(x, w, bias)
    compiled = torch.compile(f, fullgraph=True, backend="inductor")(x, w, bias)
    for e, c in zip(eager, compiled):
        assert torch.equal(e.view(torch.uint8 if e.dtype != torch.float32 else torch.int32),
                           c.view(torch.uint8 if c.dtype != torch.float32 else torch.int32))


def test_gemm_rejects_mixed_formats():
    x = torch.randn(32, 32)
    with pytest.raises(TypeError, match="twinengine.gemm: a and b must use the same format"):
        te.gemm(te.quantize(x, MXFP8Quantizer()), te.quantize(x, Float8CurrentScalingQuantizer()))
    with pytest.raises(TypeError, match="twinengine.gemm: a and b must use the same format"):
        te.gemm(te.quantize(x, MXFP8Quantizer()), x)


def test_gemm_rejects_contraction_mismatch():
    with pytest.raises(ValueError, match="twinengine.gemm: a and b disagree on the contraction dimension"):
        te.gemm(torch.randn(4, 8), torch.randn(4, 9))


def test_gemm_rejects_missing_usage():
    x = torch.randn(32, 32)
    q = Float8CurrentScalingQuantizer(columnwise=False)
    with pytest.raises(ValueError, match="twinengine.gemm: b has no columnwise copy"):
        te.gemm(te.quantize(x, q), te.quantize(x, q), b_columnwise=True)


def test_gemm_rejects_bad_bias():
    with pytest.raises(ValueError, match=r"twinengine.gemm: bias must have shape \(4,\)"):
        te.gemm(torch.randn(4, 8), torch.randn(4, 8), torch.randn(5))


@pytest.mark.parametrize("fmt", ["fp32", "mxfp8"])
def test_gemm_multi_chunk_shapes_match_reference(fmt):
    # Large enough for several row chunks and worker threads; M not a multiple of the chunk.
    rng = np.random.default_rng(5)
    dy = rng.standard_normal((320, 96)).astype(np.float32)
    x = rng.standard_normal((320, 608)).astype(np.float32)
    a, b = operand(fmt, "grad_output", dy), operand(fmt, "input", x)
    check_against_reference(te.gemm(a, b, a_columnwise=True, b_columnwise=True), fmt, a, b, True, True, None,
                            "float32")
    a, b = operand(fmt, "input", x[:, :96].copy()), operand(fmt, "weight", rng.standard_normal((608, 96)).astype(np.float32))
    check_against_reference(te.gemm(a, b), fmt, a, b, False, False, None, "float32")


def test_gemm_rejects_two_2d_fp8_block_operands():
    q = Float8BlockQuantizer(block_scaling_dim=2)
    x = te.quantize(torch.randn(128, 128), q)
    with pytest.raises(ValueError, match="twinengine.gemm: FP8 block GEMMs need at least one 1D"):
        te.gemm(x, x)


def test_gemm_rejects_hadamard_copy_with_plain_copy():
    x = torch.randn(32, 32, dtype=torch.bfloat16)
    a = te.quantize(x, NVFP4Quantizer(with_rht=True))
    b = te.quantize(x, NVFP4Quantizer())
    with pytest.raises(ValueError, match="twinengine.gemm: the random Hadamard transform must apply to both"):
        te.gemm(a, b, a_columnwise=True, b_columnwise=True)


def test_gemm_empty_inner_dimension_gives_bias():
    """K = 0: an (R, 0) operand still has R rows; the product is the (broadcast) bias or zeros."""
    bias = torch.arange(8, dtype=torch.float32)
    assert torch.equal(te.gemm(torch.empty(4, 0), torch.empty(8, 0)), torch.zeros(4, 8))
    assert torch.equal(te.gemm(torch.empty(4, 0), torch.empty(8, 0), bias), bias.expand(4, 8))

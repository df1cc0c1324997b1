"""PyTorch quantize / dequantize / delayed update: bytes vs the NumPy reference, compile, opcheck."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from helpers import (INPUT_FAMILIES, assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch, make_input,
                     no_recompiles, to_torch)
from quantize_cases import DELAYED_SCALE, case_id, cases, reference_dequantize, reference_quantize, scale_for
from twinengine.testing import reference as ref

import twinengine as te
import twinengine.pytorch as tep

DTYPES = ["float32", "bfloat16", "float16"]
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _quantize(x_np: np.ndarray, q: te.Quantizer) -> te.QuantizedTensor:
    scale = scale_for(q)
    return tep.quantize(to_torch(x_np), q, scale=None if scale is None else torch.from_numpy(scale))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("q,shape", cases(), ids=case_id)
def test_quantize_matches_reference(q, shape, family, dtype):
    x = make_input(family, shape, dtype)
    qt = _quantize(x, q)
    assert qt.quantizer == q and qt.shape == shape and qt.dtype == dtype
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q), f"{case_id(q)} {family} {dtype}")


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("q,shape", cases(), ids=case_id)
def test_dequantize_matches_reference(q, shape, out_dtype):
    x = make_input("mixed_scales", shape, "float32", seed=1)
    qt = _quantize(x, q)
    expected_fields = reference_quantize(x, q)
    for columnwise in (False, True):
        if not (q.columnwise if columnwise else q.rowwise):
            with pytest.raises(ValueError, match="no (rowwise|columnwise) copy"):
                tep.dequantize(qt, TORCH_DTYPES[out_dtype], columnwise=columnwise)
            continue
        y = tep.dequantize(qt, TORCH_DTYPES[out_dtype], columnwise=columnwise)
        assert y.dtype == TORCH_DTYPES[out_dtype] and tuple(y.shape) == shape
        expected = reference_dequantize(expected_fields, q, shape, out_dtype, columnwise)
        assert_bytes_equal(from_torch(y), expected, f"dequantize columnwise={columnwise}")


def _history_cases():
    rng = np.random.default_rng(3)
    hist = np.abs(rng.standard_normal((16, 5))).astype(np.float32) * np.float32(100.0)
    hist[0, 1] = 0.0  # unused slot: unchanged
    hist[3, 2] = np.float32(1e-44)  # subnormal amax in the history
    hist[0, 3] = np.inf  # non-finite amax: keep the scale
    hist[0, 4] = np.float32(1e-45)  # tiny amax: the new scale overflows to FLT_MAX
    scale = (rng.random(5).astype(np.float32) + np.float32(0.5))
    return [(hist, scale), (hist[:1].copy(), scale), (hist[:, :1].reshape(16).copy(), scale[:1].copy())]


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 3])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("case", range(3))
def test_update_delayed_scaling_matches_reference(case, fmt, margin, algo):
    hist, scale = _history_cases()[case]
    new_hist, new_scale = tep.update_delayed_scaling(torch.from_numpy(hist), torch.from_numpy(scale), fmt,
                                                     margin=margin, amax_compute_algo=algo)
    hist2d = hist.reshape(hist.shape[0], -1)
    exp_hist, exp_scale = ref.delayed_scaling_update_ref(hist2d, scale, fmt, margin, algo)
    assert_bytes_equal(new_hist.numpy(), exp_hist.reshape(hist.shape), "amax_history")
    assert_bytes_equal(new_scale.numpy(), exp_scale, "scale")


def test_record_amax_takes_the_running_max():
    hist = torch.tensor([1.0, 5.0, 7.0])
    assert torch.equal(tep.record_amax(hist, torch.tensor([3.0])), torch.tensor([3.0, 5.0, 7.0]))
    assert torch.equal(tep.record_amax(hist, torch.tensor([0.5])), hist)


# One compiled function shared by every quantizer kind: quantize, then dequantize both copies.
def _roundtrip(x, q, scale):
    qt = tep.quantize(x, q, scale=scale)
    rows = tep.dequantize(qt, torch.float32) if q.rowwise else None
    cols = tep.dequantize(qt, torch.bfloat16, columnwise=True) if q.columnwise else None
    return qt, rows, cols


_COMPILED_ROUNDTRIP = torch.compile(_roundtrip, fullgraph=True, backend="inductor")

COMPILE_QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3", force_pow_2_scales=True),
    te.Float8DelayedScalingQuantizer("e5m2"),
    te.MXFP8Quantizer("e4m3"),
    te.MXFP8Quantizer("e4m3", with_2d_quantization=True),
]


@pytest.mark.parametrize("q", COMPILE_QUANTIZERS, ids=case_id)
def test_quantize_compiled_matches_eager(q):
    x = to_torch(make_input("nan_inf", (64, 96), "bfloat16"))
    scale = torch.from_numpy(DELAYED_SCALE) if q.scaling_mode == "fp8_delayed" else None
    eager = _roundtrip(x, q, scale)
    compiled = _COMPILED_ROUNDTRIP(x, q, scale)
    assert_quantized_equal(fields_as_numpy(compiled[0]), fields_as_numpy(eager[0]), "compiled vs eager")
    for got, want in zip(compiled[1:], eager[1:]):
        if want is not None:
            assert_bytes_equal(from_torch(got), from_torch(want), "dequantized")


def test_quantizer_equal_value_does_not_recompile():
    fn = torch.compile(lambda x, q: tep.quantize(x, q).rowwise_data, fullgraph=True, backend="eager")
    x = torch.randn(32, 32)
    fn(x, te.MXFP8Quantizer("e4m3"))
    with no_recompiles():
        fn(x, te.MXFP8Quantizer("e4m3"))  # equal value: reuses the graph
        with pytest.raises(torch._dynamo.exc.RecompileError):
            fn(x, te.MXFP8Quantizer("e5m2"))  # different value: needs a new graph


def test_delayed_scaling_step_compiles():
    q = te.Float8DelayedScalingQuantizer("e4m3")

    def step(x, scale, history):
        qt = tep.quantize(x, q, scale=scale)
        history = tep.record_amax(history, qt.amax)
        new_history, new_scale = tep.update_delayed_scaling(history, scale, "e4m3", margin=1)
        return qt.rowwise_data, new_history, new_scale

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    x, scale, history = torch.randn(16, 16) * 7, torch.ones(1), torch.zeros(8)
    for _ in range(3):
        eager_out = step(x, scale, history)
        compiled_out = compiled(x, scale, history)
        for a, b in zip(compiled_out, eager_out):
            assert_bytes_equal(from_torch(a), from_torch(b), "delayed step")
        _, history, scale = eager_out
        x = x * 2


# test_schema is left out where float8 tensors are inputs or outputs: torch's SchemaCheckMode
# multiplies them, which CPU float8 tensors do not support ("mul_cpu_reduced_float").
FP8_OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("q", [te.Float8CurrentScalingQuantizer("e4m3"), te.Float8DelayedScalingQuantizer("e5m2"),
                               te.MXFP8Quantizer("e4m3", with_2d_quantization=True)], ids=case_id)
def test_quantize_opcheck(q):
    x = torch.randn(64, 64)
    scale = torch.tensor([0.5]) if q.scaling_mode == "fp8_delayed" else None
    torch.library.opcheck(torch.ops.twinengine.quantize.default, (x, q, scale, None), test_utils=FP8_OPCHECK_UTILS)
    qt = tep.quantize(x, q, scale=scale)
    torch.library.opcheck(torch.ops.twinengine.dequantize.default,
                          (qt.rowwise_data, qt.rowwise_scale_inv, None, q, [64, 64], "float32", False),
                          test_utils=FP8_OPCHECK_UTILS)


def test_update_delayed_scaling_opcheck():
    torch.library.opcheck(torch.ops.twinengine.update_delayed_scaling.default,
                          (torch.rand(4, 2), torch.ones(2), "e4m3", 0, "max"))


def test_quantize_rejects_unsupported_device():
    with pytest.raises(ValueError, match="twinengine.quantize: x is on device 'meta'"):
        tep.quantize(torch.empty(32, 32, device="meta"), te.MXFP8Quantizer())


def test_quantize_error_under_compile_names_the_rule():
    fn = torch.compile(lambda x: tep.quantize(x, te.MXFP8Quantizer()).rowwise_data, fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="MXFP8 needs the flattened"):
        fn(torch.randn(48, 64))


def test_quantize_dynamic_batch_does_not_recompile():
    q = te.Float8CurrentScalingQuantizer("e4m3")
    fn = torch.compile(lambda x: tep.dequantize(tep.quantize(x, q), torch.float32, columnwise=True),
                       fullgraph=True, dynamic=True, backend="inductor")
    for rows in (32, 48, 96):
        x = torch.randn(rows, 64)
        with no_recompiles() if rows != 32 else contextlib.nullcontext():
            got = fn(x)
        assert_bytes_equal(from_torch(got), from_torch(tep.dequantize(tep.quantize(x, q), columnwise=True)), "dynamic")


def test_quantizer_rejects_a_tensor_field():
    with pytest.raises(TypeError, match="never tensors or process groups"):
        te.Float8CurrentScalingQuantizer("e4m3", amax_epsilon=torch.tensor(0.0))

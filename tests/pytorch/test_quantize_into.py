"""make_empty + the in-place torch.ops.twinengine.quantize_: layouts from the core shape
function, reference bytes written into the caller's buffers, opcheck, compile-clean, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_quantized_equal, fields_as_numpy, make_input, to_torch
from quantize_block_cases import RNG_STATE
from quantize_block_cases import reference_quantize as block_reference
from quantize_cases import DELAYED_SCALE, case_id
from quantize_cases import reference_quantize as per_tensor_reference

import twinengine as te
import twinengine.pytorch as tep
from twinengine.quantized_tensor import ARRAY_FIELDS

QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3"),
    te.Float8DelayedScalingQuantizer("e5m2", columnwise=False),
    te.MXFP8Quantizer("e4m3", with_2d_quantization=True),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
    te.NVFP4Quantizer(with_2d_quantization=True, rowwise=False),
]
SHAPE = (2, 128, 128)


def _extras(q):
    return {"scale": torch.from_numpy(DELAYED_SCALE) if q.scaling_mode == "fp8_delayed" else None,
            "rng": torch.from_numpy(RNG_STATE.astype(np.int64)) if getattr(q, "stochastic_rounding", False) else None}


def _reference(x, q):
    if q.scaling_mode in ("fp8_block", "nvfp4"):
        return block_reference(x, q, RNG_STATE if getattr(q, "stochastic_rounding", False) else None)
    return per_tensor_reference(x, q)


def _pointers(qt):
    return {name: getattr(qt, name).data_ptr() for name in ARRAY_FIELDS if getattr(qt, name) is not None}


@pytest.mark.parametrize("q", QUANTIZERS, ids=case_id)
def test_make_empty_has_the_layout_quantize_gives(q):
    out = tep.make_empty(q, SHAPE, torch.bfloat16)
    got = tep.quantize(torch.ones(SHAPE, dtype=torch.bfloat16), q, **_extras(q))
    for name in ARRAY_FIELDS:
        a, b = getattr(out, name), getattr(got, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert (a.shape, a.dtype) == (b.shape, b.dtype), name
            assert not a.any()
    assert (out.quantizer, out.shape, out.dtype) == (got.quantizer, got.shape, got.dtype)


@pytest.mark.parametrize("q", QUANTIZERS, ids=case_id)
def test_quantize_inplace_writes_reference_bytes_into_the_buffers(q):
    out = tep.make_empty(q, SHAPE, torch.bfloat16)
    before = _pointers(out)
    for seed in (0, 1):  # twice: the second call overwrites every byte of the first
        x = make_input("mixed_scales", SHAPE, "bfloat16", seed=seed)
        assert tep.quantize_(out, to_torch(x), **_extras(q)) is out
        assert _pointers(out) == before
        assert_quantized_equal(fields_as_numpy(out), _reference(x, q), f"{case_id(q)} seed {seed}")


@pytest.mark.parametrize("q", [QUANTIZERS[0], QUANTIZERS[2], QUANTIZERS[4]], ids=case_id)
def test_quantize_inplace_opcheck(q):
    """Every opcheck test; test_schema (which checks the declared mutations against what the
    kernel writes) runs where torch can compare the buffers: torch has no float8 arithmetic,
    so it runs on NVFP4 (uint8 data) only."""
    out = tep.make_empty(q, (128, 128), torch.bfloat16)
    buffers = [getattr(out, name) for name in ARRAY_FIELDS if getattr(out, name) is not None]
    extras = _extras(q)
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if q.scaling_mode == "nvfp4":
        utils += ("test_schema",)
    torch.library.opcheck(torch.ops.twinengine.quantize_.default,
                          (torch.randn(128, 128, dtype=torch.bfloat16), q, buffers, extras["scale"], extras["rng"]),
                          test_utils=utils)


def test_quantize_inplace_schema_mutates_out():
    schema = torch.ops.twinengine.quantize_.default._schema
    (out,) = [a for a in schema.arguments if a.name == "out"]
    assert out.alias_info is not None and out.alias_info.is_write
    assert [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write] == ["out"]


def test_quantize_inplace_compiled_matches_eager_and_keeps_buffers():
    q = te.MXFP8Quantizer("e4m3")

    def step(out, x):
        tep.quantize_(out, x * 2)
        return out.rowwise_data.view(torch.uint8).sum(dtype=torch.int64)

    compiled = torch.compile(step, fullgraph=True)
    x = to_torch(make_input("normal_1", (64, 96), "float32", seed=5))
    eager_out, compiled_out = tep.make_empty(q, x.shape), tep.make_empty(q, x.shape)
    before = _pointers(compiled_out)
    assert int(compiled(compiled_out, x)) == int(step(eager_out, x))
    assert _pointers(compiled_out) == before
    assert_quantized_equal(fields_as_numpy(compiled_out), fields_as_numpy(eager_out), "compiled vs eager")
    assert_quantized_equal(fields_as_numpy(compiled_out), _reference(make_input("normal_1", (64, 96), "float32",
                                                                                 seed=5) * 2, q), "vs reference")


def test_quantize_inplace_bad_buffers():
    q = te.Float8CurrentScalingQuantizer()
    out = tep.make_empty(q, (32, 64))
    with pytest.raises(ValueError, match=r"twinengine.quantize_: out was made for an input of shape \(32, 64\) "
                                         r"and dtype float32, got x of shape \(64, 32\)"):
        tep.quantize_(out, torch.zeros(64, 32))
    with pytest.raises(ValueError, match="out was made for an input of shape .* dtype float32, got .* bfloat16"):
        tep.quantize_(out, torch.zeros(32, 64, dtype=torch.bfloat16))
    out.columnwise_data = torch.zeros(32, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"out.columnwise_data must have shape \(64, 32\) and dtype float8_e4m3fn"):
        tep.quantize_(out, torch.zeros(32, 64))
    out.columnwise_data = torch.zeros(32, 64, dtype=torch.float8_e4m3fn).t()
    with pytest.raises(ValueError, match="out.columnwise_data is not contiguous"):
        tep.quantize_(out, torch.zeros(32, 64))
    out.columnwise_data = None
    with pytest.raises(ValueError, match="out.columnwise_data is missing"):
        tep.quantize_(out, torch.zeros(32, 64))
    rowwise_only = tep.make_empty(q.with_usage(columnwise=False), (32, 64))
    rowwise_only.columnwise_scale_inv = torch.zeros(1)
    with pytest.raises(ValueError, match="out.columnwise_scale_inv is set, but .* does not write it"):
        tep.quantize_(rowwise_only, torch.zeros(32, 64))
    with pytest.raises(TypeError, match="out must be a twinengine QuantizedTensor"):
        tep.quantize_(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="MXFP8 needs the flattened"):
        tep.make_empty(te.MXFP8Quantizer(), (48, 64))

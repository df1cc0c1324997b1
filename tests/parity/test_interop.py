"""Zero-copy hand-over of arrays and QuantizedTensors between PyTorch and JAX (DLPack):
same buffers (pointers), same bytes, writes visible across, round trips dequantize identically."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, fields_as_numpy, from_torch, make_input, to_torch
from quantize_block_cases import RNG_STATE
from quantize_cases import DELAYED_SCALE, case_id

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine.quantized_tensor import ARRAY_FIELDS

QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3"),
    te.Float8CurrentScalingQuantizer("e5m2", columnwise=False),
    te.Float8DelayedScalingQuantizer("e4m3"),
    te.MXFP8Quantizer("e4m3"),
    te.MXFP8Quantizer("e5m2", rowwise=False, with_2d_quantization=True),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=2, rowwise=False),
    te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
    te.NVFP4Quantizer(with_2d_quantization=True, columnwise=False),
]
SHAPE = (128, 256)


def _extras(q, framework):
    arrays = {"scale": DELAYED_SCALE if q.scaling_mode == "fp8_delayed" else None,
              "rng": RNG_STATE.astype(np.int64) if getattr(q, "stochastic_rounding", False) else None}
    if framework == "torch":
        return {k: None if v is None else torch.from_numpy(v) for k, v in arrays.items()}
    if arrays["rng"] is not None:
        arrays["rng"] = arrays["rng"].astype(np.uint32)
    return {k: None if v is None else jnp.asarray(v) for k, v in arrays.items()}


def _pointer(array) -> int:
    return array.data_ptr() if isinstance(array, torch.Tensor) else array.unsafe_buffer_pointer()


def _assert_shared(a, b, context):
    """Same present fields, same buffers, same dtypes, same metadata."""
    present = [name for name in ARRAY_FIELDS if getattr(a, name) is not None]
    assert present == [name for name in ARRAY_FIELDS if getattr(b, name) is not None], context
    for name in present:
        x, y = getattr(a, name), getattr(b, name)
        assert _pointer(x) == _pointer(y), f"{context}: {name} was copied"
        assert te.canonical_dtype(x.dtype) == te.canonical_dtype(y.dtype), f"{context}: {name} dtype"
        assert tuple(x.shape) == tuple(y.shape), f"{context}: {name} shape"
    assert (a.quantizer, tuple(a.shape), a.dtype) == (b.quantizer, tuple(b.shape), b.dtype)


def _dequantized(qt, framework):
    copies = [c for c, used in ((False, qt.quantizer.rowwise), (True, qt.quantizer.columnwise)) if used]
    if framework == "torch":
        return [from_torch(tep.dequantize(qt, torch.float32, columnwise=c)) for c in copies]
    return [np.asarray(tej.dequantize(qt, jnp.float32, columnwise=c)) for c in copies]


@pytest.mark.parametrize("q", QUANTIZERS, ids=case_id)
def test_quantized_tensor_torch_to_jax_to_torch_shares_buffers(q):
    x = make_input("normal_1", SHAPE, "bfloat16", seed=3)
    qt = tep.quantize(to_torch(x), q, **_extras(q, "torch"))
    in_jax = tej.from_torch(qt)
    _assert_shared(qt, in_jax, "torch -> jax")
    fields = fields_as_numpy(qt)
    for name, value in fields_as_numpy(in_jax).items():
        assert_bytes_equal(value, fields[name], f"{case_id(q)} {name}")
    for got, expected in zip(_dequantized(in_jax, "jax"), _dequantized(qt, "torch")):
        assert_bytes_equal(got, expected, f"{case_id(q)} dequantize in JAX")
    back = tep.from_jax(in_jax)
    _assert_shared(qt, back, "torch -> jax -> torch")
    for got, expected in zip(_dequantized(back, "torch"), _dequantized(qt, "torch")):
        assert_bytes_equal(got, expected, f"{case_id(q)} round trip dequantize")


@pytest.mark.parametrize("q", QUANTIZERS, ids=case_id)
def test_quantized_tensor_jax_to_torch_shares_buffers(q):
    x = make_input("mixed_scales", SHAPE, "bfloat16", seed=4)
    qt = tej.quantize(jnp.asarray(x), q, **_extras(q, "jax"))
    in_torch = tep.from_jax(qt)
    _assert_shared(qt, in_torch, "jax -> torch")
    for got, expected in zip(_dequantized(in_torch, "torch"), _dequantized(qt, "jax")):
        assert_bytes_equal(got, expected, f"{case_id(q)} dequantize in torch")


def test_writes_are_visible_across_frameworks():
    qt = tep.quantize(torch.ones(32, 32), te.MXFP8Quantizer())
    in_jax = tej.from_torch(qt)
    qt.rowwise_data.view(torch.uint8)[0, 0] = 0x7E
    qt.rowwise_scale_inv[0, 0] = 3
    assert np.asarray(in_jax.rowwise_data).view(np.uint8)[0, 0] == 0x7E
    assert np.asarray(in_jax.rowwise_scale_inv)[0, 0] == 3
    t = torch.zeros(8, dtype=torch.bfloat16)
    a = tej.from_torch(t)
    t.add_(2.5)
    assert_bytes_equal(np.asarray(a), from_torch(t), "plain bf16 array")
    back = tep.from_jax(a)
    assert back.data_ptr() == t.data_ptr()
    back.mul_(2)
    assert np.asarray(a).astype(np.float32).tolist() == [5.0] * 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int32,
                                   torch.float8_e4m3fn, torch.float8_e5m2])
def test_plain_arrays_round_trip_without_copy(dtype):
    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).to(dtype)
    a = tej.from_torch(t)
    assert a.unsafe_buffer_pointer() == t.data_ptr() and a.shape == (2, 3, 4)
    assert te.canonical_dtype(a.dtype) == te.canonical_dtype(t.dtype)
    back = tep.from_jax(a)
    assert back.data_ptr() == t.data_ptr() and back.dtype == t.dtype


@pytest.mark.parametrize("direction", ["to_torch", "to_jax"])
def test_float8_without_dlpack_code_crosses_as_uint8(monkeypatch, direction):
    """Where the installed DLPack lacks a float8 code, the bytes cross as uint8 and come back
    with the right dtype."""
    module = tep.interop if direction == "to_torch" else tej.interop
    monkeypatch.setattr(module, "_dlpack_carries", lambda name: not name.startswith("float8"))
    qt = tep.quantize(to_torch(make_input("normal_1", (64, 64), "float32")), te.Float8CurrentScalingQuantizer("e5m2"))
    moved = tej.from_torch(qt) if direction == "to_jax" else tep.from_jax(tej.from_torch(qt))
    assert te.canonical_dtype(moved.rowwise_data.dtype) == "float8_e5m2"
    assert moved.amax is not None
    for name, value in fields_as_numpy(moved).items():
        assert_bytes_equal(value, fields_as_numpy(qt)[name], name)


def test_non_contiguous_tensor_is_refused():
    t = torch.zeros(8, 6)[:, 1:]
    with pytest.raises(ValueError, match=r"twinengine.from_torch: x is not contiguous .*\.contiguous\(\)"):
        tej.from_torch(t)


def test_device_mismatch_is_refused():
    qt = tep.quantize(torch.ones(32, 32), te.Float8CurrentScalingQuantizer())
    qt.amax = torch.empty(1, device="meta")
    with pytest.raises(ValueError, match="arrays live on different devices .*amax on meta"):
        tej.from_torch(qt)
    with pytest.raises(ValueError, match="lives on meta, but JAX has no device of that kind"):
        tej.from_torch(torch.empty(4, device="meta"))


def test_bad_values_are_refused():
    with pytest.raises(TypeError, match="twinengine.from_torch: x must be a torch.Tensor"):
        tej.from_torch(np.zeros(3))
    with pytest.raises(TypeError, match="twinengine.from_jax: x must be a concrete jax.Array"):
        tep.from_jax(np.zeros(3))
    with pytest.raises(TypeError, match="not a tracer"):
        jax.jit(tep.from_jax)(jnp.zeros(3))
    with pytest.raises(TypeError, match="int64, which cannot be handed over without a copy: JAX runs without jax_enable_x64"):
        tej.from_torch(torch.zeros(3, dtype=torch.int64))


def test_int64_crosses_without_copy_under_x64():
    t = torch.arange(6, dtype=torch.int64)
    with jax.enable_x64(True):
        a = tej.from_torch(t)
        assert a.dtype == jnp.int64 and a.unsafe_buffer_pointer() == t.data_ptr()
        assert tep.from_jax(a).data_ptr() == t.data_ptr()

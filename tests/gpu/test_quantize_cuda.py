"""CUDA kernels of the quantize family: byte equality with the CPU kernels and the NumPy
reference for every quantizer x shape x input family x dtype, CUDA-graph capture,
torch.compile (inductor fullgraph and reduce-overhead) on CUDA, jax.jit on the GPU and
torch-CUDA / JAX-CUDA parity.

Skipped (with the reason) without a CUDA device or without the CUDA kernels in this build.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import INPUT_FAMILIES, assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch, make_input, to_torch
from quantize_block_cases import FP8_BLOCK_QUANTIZERS, NVFP4_QUANTIZERS, block_cases, dtypes_for, rng_for
from quantize_block_cases import reference_dequantize as block_reference_dequantize
from quantize_block_cases import reference_quantize as block_reference_quantize
from quantize_cases import MXFP8_QUANTIZERS, PER_TENSOR_QUANTIZERS, case_id, cases, reference_dequantize, reference_quantize, scale_for
from twinengine.testing import reference as ref

import twinengine as te
import twinengine.pytorch as tep
from twinengine import _C
from twinengine.quantized_tensor import ARRAY_FIELDS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not _C.has_cuda(), reason="twinengine was built without its CUDA kernels (nvcc not found)"),
]

DEVICE = "cuda"
DTYPES = ["float32", "bfloat16", "float16"]
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Shapes beyond the shared cases that cross the CUDA tiles (64x64 per-tensor, 32x128 MXFP8):
# several tiles, partial tiles at the right and bottom edges, R not a multiple of 4 / 128.
GPU_PER_TENSOR_SHAPES = [(65, 130), (2, 33, 47), (256, 1000), (130, 8)]
GPU_MXFP8_SHAPES = [(96, 160), (128, 256), (160, 4128)]
GPU_CASES = ([(q, s) for q in PER_TENSOR_QUANTIZERS for s in GPU_PER_TENSOR_SHAPES]
             + [(q, s) for q in MXFP8_QUANTIZERS for s in GPU_MXFP8_SHAPES])
# FP8 block: several 128x128 tiles; NVFP4: partial rowwise (16x256) and columnwise (64x64) tiles.
GPU_FP8_BLOCK_SHAPES = [(256, 384), (384, 128)]
GPU_NVFP4_SHAPES = [(80, 272), (2, 48, 96), (256, 512)]
GPU_BLOCK_CASES = ([(q, s, d) for q in FP8_BLOCK_QUANTIZERS for s in GPU_FP8_BLOCK_SHAPES for d in dtypes_for(q)]
                   + [(q, s, d) for q in NVFP4_QUANTIZERS for s in GPU_NVFP4_SHAPES for d in dtypes_for(q)])
BLOCK_QUANTIZERS = FP8_BLOCK_QUANTIZERS + NVFP4_QUANTIZERS
# (quantizer, input dtype) pairs valid for every quantizer (the RHT of a columnwise copy needs bf16).
QUANTIZER_DTYPES = [(q, d) for q in PER_TENSOR_QUANTIZERS + MXFP8_QUANTIZERS + BLOCK_QUANTIZERS
                    for d in DTYPES if d in dtypes_for(q)]


def _scale_tensor(q: te.Quantizer, device) -> torch.Tensor | None:
    scale = scale_for(q)
    return None if scale is None else torch.from_numpy(scale).to(device)


def _rng_tensor(q: te.Quantizer, device, dtype: torch.dtype = torch.int64) -> torch.Tensor | None:
    """The [seed, offset] array for a stochastic-rounding quantizer (low 32 bits are used)."""
    state = rng_for(q)
    if state is None:
        return None
    bits = state.astype(np.uint32)
    values = bits.view(np.int32) if dtype == torch.int32 else bits.astype(np.int64)
    return torch.from_numpy(values).to(device)


def _quantize(x: torch.Tensor, q: te.Quantizer) -> te.QuantizedTensor:
    """twinengine.pytorch.quantize with the scale / rng the quantizer takes, on x's device."""
    return tep.quantize(x, q, scale=_scale_tensor(q, x.device), rng=_rng_tensor(q, x.device))


def _on_device(qt: te.QuantizedTensor, device) -> te.QuantizedTensor:
    moved = {f: getattr(qt, f).to(device) for f in ARRAY_FIELDS if getattr(qt, f) is not None}
    return dataclasses.replace(qt, **moved)


def _assert_on_device(qt: te.QuantizedTensor) -> None:
    for field in ARRAY_FIELDS:
        value = getattr(qt, field)
        if value is not None:
            assert value.device.type == torch.device(DEVICE).type, f"{field} is on {value.device}"


# ---- quantize: CUDA == CPU == reference ---------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("q,shape", cases() + GPU_CASES, ids=case_id)
def test_quantize_cuda_matches_cpu_and_reference(q, shape, family, dtype):
    x_np = make_input(family, shape, dtype, seed=21)
    x = to_torch(x_np)
    got = tep.quantize(x.to(DEVICE), q, scale=_scale_tensor(q, DEVICE))
    _assert_on_device(got)
    assert got.quantizer == q and got.shape == shape and got.dtype == dtype
    got_fields = fields_as_numpy(got)
    context = f"{case_id(q)} {shape} {family} {dtype}"
    assert_quantized_equal(got_fields, fields_as_numpy(tep.quantize(x, q, scale=_scale_tensor(q, "cpu"))),
                           f"CUDA vs CPU {context}")
    assert_quantized_equal(got_fields, reference_quantize(x_np, q), f"CUDA vs reference {context}")


@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("q,shape,dtype", block_cases() + GPU_BLOCK_CASES, ids=case_id)
def test_quantize_block_formats_cuda_match_cpu_and_reference(q, shape, dtype, family):
    """FP8 block (§6) and NVFP4 (§7, incl. RHT, Philox stochastic rounding and 2D tiles)."""
    x_np = make_input(family, shape, dtype, seed=31)
    x = to_torch(x_np)
    got = _quantize(x.to(DEVICE), q)
    _assert_on_device(got)
    got_fields = fields_as_numpy(got)
    context = f"{case_id(q)} {shape} {family} {dtype}"
    assert_quantized_equal(got_fields, fields_as_numpy(_quantize(x, q)), f"CUDA vs CPU {context}")
    assert_quantized_equal(got_fields, block_reference_quantize(x_np, q, rng_for(q)), f"CUDA vs reference {context}")


@pytest.mark.parametrize("rng_dtype", [torch.int32, torch.int64], ids=str)
def test_quantize_nvfp4_rng_read_on_device_for_every_dtype(rng_dtype):
    """The [seed, offset] array stays on the device (no host read) and only its low 32 bits count."""
    q = te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True)
    x = to_torch(make_input("mixed_scales", (64, 128), "bfloat16", seed=32))
    got = tep.quantize(x.to(DEVICE), q, rng=_rng_tensor(q, DEVICE, rng_dtype))
    want = tep.quantize(x, q, rng=_rng_tensor(q, "cpu"))
    assert_quantized_equal(fields_as_numpy(got), fields_as_numpy(want), f"rng {rng_dtype}")


def _fp8_cast_probe(fmt: str) -> np.ndarray:
    """fp32 values around every rounding decision of an FP8 cast: all bf16 bit patterns (every
    exponent, ±0, subnormals, ±inf, NaNs of both signs), every code value, every midpoint
    between neighbouring codes (ties) and its fp32 neighbours, the overflow threshold, and 2^20
    random bit patterns."""
    bf16_patterns = (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)).view(np.float32)
    values = ref.decode_fp8_ref(np.arange(0x80, dtype=np.uint8), fmt)
    values = np.sort(values[np.isfinite(values)])
    mids = ((values[:-1].astype(np.float64) + values[1:]) / 2).astype(np.float32)  # exact in fp32
    overflow = np.float32(values[-1] + (values[-1] - values[-2]) / 2)  # 464 (E4M3), 61440 (E5M2)
    edges = np.concatenate([values, mids, [overflow, values[-1]]]).astype(np.float32)
    with np.errstate(over="ignore"):
        near = np.concatenate([edges, np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(0))])
    random_bits = np.random.default_rng(36).integers(0, 1 << 32, 1 << 20, dtype=np.uint32).view(np.float32)
    probe = np.concatenate([bf16_patterns, near, -near, random_bits]).astype(np.float32)
    return probe[: probe.size // 64 * 64]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_quantize_fp8_cast_edges_cuda_matches_cpu_and_reference(fmt):
    """The device FP8 cast (the sm_89+ hardware conversion) equals the CPU rule on every edge."""
    x = _fp8_cast_probe(fmt).reshape(64, -1)
    q = te.Float8DelayedScalingQuantizer(fmt, columnwise=False)
    one = torch.ones(1)
    got = tep.quantize(torch.from_numpy(x).to(DEVICE), q, scale=one.to(DEVICE))
    want = tep.quantize(torch.from_numpy(x), q, scale=one)
    assert_bytes_equal(from_torch(got.rowwise_data).view(np.uint8), from_torch(want.rowwise_data).view(np.uint8),
                       f"{fmt} cast: CUDA vs CPU")
    assert_bytes_equal(from_torch(got.rowwise_data).view(np.uint8), ref.cast_fp8_ref(x, fmt),
                       f"{fmt} cast: CUDA vs reference")


def _unaligned(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of x whose data pointer is one element past an aligned address."""
    storage = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    view = storage[1:].view(x.shape)
    view.copy_(x)
    return view


@pytest.mark.parametrize("q,dtype", QUANTIZER_DTYPES, ids=case_id)
def test_quantize_unaligned_input_cuda_matches_cpu(q, dtype):
    """Inputs off a 16-byte boundary take the kernels' scalar-load path: same bytes."""
    x = to_torch(make_input("nan_inf", (128, 256), dtype, seed=22))
    x_dev = _unaligned(x.to(DEVICE))
    assert x_dev.data_ptr() % 16 != 0
    got = _quantize(x_dev, q)
    assert_quantized_equal(fields_as_numpy(got), fields_as_numpy(_quantize(x, q)), f"unaligned {case_id(q)} {dtype}")


# ---- dequantize ---------------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("q,shape", cases() + GPU_CASES, ids=case_id)
def test_dequantize_cuda_matches_cpu_and_reference(q, shape, out_dtype):
    x_np = make_input("mixed_scales", shape, "float32", seed=23)
    _assert_dequantize_cuda_matches(_quantize(to_torch(x_np), q), reference_quantize(x_np, q), reference_dequantize,
                                    out_dtype)


def _assert_dequantize_cuda_matches(qt: te.QuantizedTensor, fields: dict, reference_dequantize_fn, out_dtype: str):
    """Both copies of CPU-quantized `qt`, dequantized on CUDA, equal the CPU kernel and the
    reference (`fields`: the reference's quantized fields)."""
    q, shape = qt.quantizer, tuple(qt.shape)
    qt_dev = _on_device(qt, DEVICE)
    for columnwise in (False, True):
        if not (q.columnwise if columnwise else q.rowwise):
            continue
        got = tep.dequantize(qt_dev, TORCH_DTYPES[out_dtype], columnwise=columnwise)
        assert got.device.type == torch.device(DEVICE).type and tuple(got.shape) == shape
        want = tep.dequantize(qt, TORCH_DTYPES[out_dtype], columnwise=columnwise)
        context = f"dequantize {case_id(q)} {shape} columnwise={columnwise}"
        assert_bytes_equal(from_torch(got), from_torch(want), f"CUDA vs CPU {context}")
        assert_bytes_equal(from_torch(got), reference_dequantize_fn(fields, q, shape, out_dtype, columnwise),
                           f"CUDA vs reference {context}")


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("q,shape,dtype", block_cases() + GPU_BLOCK_CASES, ids=case_id)
def test_dequantize_block_formats_cuda_match_cpu_and_reference(q, shape, dtype, out_dtype):
    x_np = make_input("mixed_scales", shape, dtype, seed=33)
    _assert_dequantize_cuda_matches(_quantize(to_torch(x_np), q), block_reference_quantize(x_np, q, rng_for(q)),
                                    block_reference_dequantize, out_dtype)


# ---- delayed-scaling update ---------------------------------------------------------------

def _history(shape, with_nan: bool) -> np.ndarray:
    rng = np.random.default_rng(24)
    hist = (rng.random(shape) * np.exp2(rng.integers(-20, 20, size=shape))).astype(np.float32)
    h2 = hist.reshape(shape[0], -1)  # a view: (L, N), N = 1 for a 1-D history
    h2[0, ::3] = 0.0  # unused slots: unchanged
    if h2.shape[1] > 1:
        h2[-1, 1] = np.inf  # non-finite a*: keep the scale
    if with_nan and h2.shape[0] > 1:
        h2[1, -1] = np.nan  # skipped by the kernels' amax (the reference would propagate it)
    h2[0, -1] = np.float32(1e-45)  # the new scale overflows to FLT_MAX
    return hist


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 3])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(1,), (16,), (1, 1), (4, 7), (1024, 5), (3, 1000)], ids=str)
def test_update_delayed_scaling_cuda_matches_cpu_and_reference(shape, fmt, margin, algo):
    slots = shape[1] if len(shape) == 2 else 1
    scale = np.linspace(0.5, 4.0, slots, dtype=np.float32)
    for with_nan in (False, True):
        hist = _history(shape, with_nan)
        got = tep.update_delayed_scaling(torch.from_numpy(hist).to(DEVICE), torch.from_numpy(scale).to(DEVICE), fmt,
                                         margin=margin, amax_compute_algo=algo)
        want = tep.update_delayed_scaling(torch.from_numpy(hist), torch.from_numpy(scale), fmt, margin=margin,
                                          amax_compute_algo=algo)
        for name, g, w in zip(("amax_history", "scale"), got, want):
            assert g.device.type == torch.device(DEVICE).type
            assert_bytes_equal(from_torch(g), from_torch(w), f"CUDA vs CPU {name} nan={with_nan}")
        if not with_nan:
            exp_hist, exp_scale = ref.delayed_scaling_update_ref(hist.reshape(shape[0], -1), scale, fmt, margin, algo)
            assert_bytes_equal(from_torch(got[0]), exp_hist.reshape(shape), "CUDA vs reference amax_history")
            assert_bytes_equal(from_torch(got[1]), exp_scale, "CUDA vs reference scale")


# ---- streams, CUDA graphs, devices --------------------------------------------------------

CAPTURE_QUANTIZERS = [
    te.Float8CurrentScalingQuantizer("e4m3"),
    te.Float8CurrentScalingQuantizer("e5m2", rowwise=False, force_pow_2_scales=True, amax_epsilon=1e-3),
    te.Float8DelayedScalingQuantizer("e4m3"),
    te.MXFP8Quantizer("e4m3"),
    te.MXFP8Quantizer("e5m2", with_2d_quantization=True),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    te.Float8BlockQuantizer("e4m3", block_scaling_dim=2),
    te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
    te.NVFP4Quantizer(with_2d_quantization=True),
]


def _roundtrip(x, q, scale, rng):
    """quantize, then dequantize every copy the quantizer makes."""
    qt = tep.quantize(x, q, scale=scale, rng=rng)
    rows = tep.dequantize(qt, torch.float32) if q.rowwise else None
    cols = tep.dequantize(qt, torch.bfloat16, columnwise=True) if q.columnwise else None
    return qt, rows, cols


def _assert_roundtrip_equal(got, want, context: str) -> None:
    assert_quantized_equal(fields_as_numpy(got[0]), fields_as_numpy(want[0]), context)
    for g, w in zip(got[1:], want[1:]):
        assert (g is None) == (w is None)
        if w is not None:
            assert_bytes_equal(from_torch(g), from_torch(w), f"{context}: dequantized")


@pytest.mark.parametrize("q", CAPTURE_QUANTIZERS, ids=case_id)
def test_quantize_cuda_graph_replay_matches_eager(q):
    """Capturable: no host synchronisation; the amax reset and reduction replay on the device."""
    shape = (256, 512)
    static_x = to_torch(make_input("normal_1", shape, "bfloat16", seed=25)).to(DEVICE)
    scale, rng = _scale_tensor(q, DEVICE), _rng_tensor(q, DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graph expects
        _roundtrip(static_x, q, scale, rng)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _roundtrip(static_x, q, scale, rng)
    for family in ("mixed_scales", "nan_inf", "normal_1e3"):
        x = to_torch(make_input(family, shape, "bfloat16", seed=26))
        static_x.copy_(x.to(DEVICE))
        graph.replay()
        torch.cuda.synchronize()
        want = _roundtrip(x, q, _scale_tensor(q, "cpu"), _rng_tensor(q, "cpu"))
        _assert_roundtrip_equal(captured, want, f"graph replay {family}")


def test_quantize_runs_on_the_current_stream():
    q = te.Float8CurrentScalingQuantizer("e4m3")
    x = to_torch(make_input("normal_1", (512, 1024), "float32", seed=27))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x_dev = x.to(DEVICE) * 2.0  # produced on `stream`: a kernel on another stream could race it
        got = tep.quantize(x_dev, q)
    stream.synchronize()
    assert_quantized_equal(fields_as_numpy(got), fields_as_numpy(tep.quantize(x * 2.0, q)), "side stream")


def test_quantize_on_a_non_current_device_matches_cpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    q = te.MXFP8Quantizer("e4m3")
    x = to_torch(make_input("mixed_scales", (64, 128), "bfloat16", seed=28))
    with torch.cuda.device(0):
        got = tep.quantize(x.to("cuda:1"), q)
    assert got.rowwise_data.device == torch.device("cuda:1")
    assert_quantized_equal(fields_as_numpy(got), fields_as_numpy(tep.quantize(x, q)), "cuda:1")


# ---- torch.compile on CUDA ----------------------------------------------------------------

@pytest.mark.parametrize("q", CAPTURE_QUANTIZERS, ids=case_id)
def test_quantize_compiled_cuda_matches_eager(q):
    torch._dynamo.reset()  # each quantizer value is its own graph: stay under the recompile limit
    compiled = torch.compile(_roundtrip, fullgraph=True, backend="inductor")
    x = to_torch(make_input("nan_inf", (128, 256), "bfloat16", seed=29)).to(DEVICE)
    scale, rng = _scale_tensor(q, DEVICE), _rng_tensor(q, DEVICE)
    _assert_roundtrip_equal(compiled(x, q, scale, rng), _roundtrip(x, q, scale, rng), f"compiled {case_id(q)}")


@pytest.mark.parametrize("q", [te.Float8CurrentScalingQuantizer("e4m3"), te.MXFP8Quantizer("e4m3"),
                               te.Float8BlockQuantizer("e4m3"), te.NVFP4Quantizer(with_rht=True)], ids=case_id)
def test_quantize_reduce_overhead_cuda_graphs_match_eager(q):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_roundtrip, fullgraph=True, mode="reduce-overhead")
    for seed in range(30, 34):  # warm-up, recording, then replays on new data
        x = to_torch(make_input("mixed_scales", (128, 256), "bfloat16", seed=seed)).to(DEVICE)
        got = compiled(x, q, None, None)
        got = (dataclasses.replace(got[0], **{f: getattr(got[0], f).clone() for f in ARRAY_FIELDS
                                              if getattr(got[0], f) is not None}),
               *(None if t is None else t.clone() for t in got[1:]))
        _assert_roundtrip_equal(got, _roundtrip(x, q, None, None), f"reduce-overhead call {seed - 30}")
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


def test_delayed_scaling_step_compiles_on_cuda():
    q = te.Float8DelayedScalingQuantizer("e4m3")

    def step(x, scale, history):
        qt = tep.quantize(x, q, scale=scale)
        history = tep.record_amax(history, qt.amax)
        new_history, new_scale = tep.update_delayed_scaling(history, scale, "e4m3", margin=1)
        return qt.rowwise_data, qt.columnwise_data, new_history, new_scale

    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    x = to_torch(make_input("normal_1e3", (64, 192), "float16", seed=34)).to(DEVICE)
    scale, history = torch.ones(1, device=DEVICE), torch.zeros(8, device=DEVICE)
    for _ in range(3):
        eager_out = step(x, scale, history)
        for got, want in zip(compiled(x, scale, history), eager_out):
            assert_bytes_equal(from_torch(got), from_torch(want), "compiled delayed-scaling step")
        _, _, history, scale = eager_out
        x = x * 2


# ---- JAX on the GPU, and torch-CUDA / JAX-CUDA parity --------------------------------------

def _jax_gpu():
    jax = pytest.importorskip("jax")
    try:
        return jax, jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax has no GPU backend (install a CUDA jaxlib plugin)")


@pytest.mark.parametrize("q,dtype", QUANTIZER_DTYPES, ids=case_id)
def test_quantize_jit_on_gpu_matches_torch_cuda(q, dtype):
    jax, gpu = _jax_gpu()
    import twinengine.jax as tej

    x_np = make_input("nan_inf", (128, 256), dtype, seed=35)
    scale, rng = scale_for(q), rng_for(q)

    @jax.jit
    def run(x, scale, rng):
        qt = tej.quantize(x, q, scale=scale, rng=rng)
        rows = tej.dequantize(qt, np.float32) if q.rowwise else None
        cols = tej.dequantize(qt, np.float32, columnwise=True) if q.columnwise else None
        return qt, rows, cols

    got = run(jax.device_put(x_np, gpu), None if scale is None else jax.device_put(scale, gpu),
              None if rng is None else jax.device_put(rng, gpu))
    for field in ARRAY_FIELDS:
        if getattr(got[0], field) is not None:
            assert gpu in getattr(got[0], field).devices(), f"{field} is not on the GPU"
    want_qt = _quantize(to_torch(x_np).to(DEVICE), q)
    context = f"jax vs torch {case_id(q)} {dtype}"
    assert_quantized_equal(fields_as_numpy(got[0]), fields_as_numpy(want_qt), context)
    expected = (block_reference_quantize(x_np, q, rng) if q.scaling_mode in ("fp8_block", "nvfp4")
                else reference_quantize(x_np, q))
    assert_quantized_equal(fields_as_numpy(got[0]), expected, f"jax vs reference {case_id(q)}")
    for columnwise, g in ((False, got[1]), (True, got[2])):
        if g is not None:
            want = tep.dequantize(want_qt, torch.float32, columnwise=columnwise)
            assert_bytes_equal(np.asarray(g), from_torch(want), f"{context}: dequantized columnwise={columnwise}")


def test_update_delayed_scaling_jit_on_gpu_matches_torch_cuda():
    jax, gpu = _jax_gpu()
    import twinengine.jax as tej

    hist = _history((8, 6), with_nan=True)
    scale = np.linspace(1.0, 2.0, 6, dtype=np.float32)
    run = jax.jit(lambda h, s: tej.update_delayed_scaling(h, s, "e4m3", margin=2))
    got = run(jax.device_put(hist, gpu), jax.device_put(scale, gpu))
    want = tep.update_delayed_scaling(torch.from_numpy(hist).to(DEVICE), torch.from_numpy(scale).to(DEVICE), "e4m3",
                                      margin=2)
    for name, g, w in zip(("amax_history", "scale"), got, want):
        assert gpu in g.devices()
        assert_bytes_equal(np.asarray(g), from_torch(w), f"jax vs torch {name}")

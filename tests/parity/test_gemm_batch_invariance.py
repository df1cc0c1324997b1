"""CPU GEMM batch invariance (NUMERICS.md §8): element (i, j) depends only on row i of op(a),
row j of op(b) and K, so a GEMM over a slice of rows and columns gives exactly that slice of the
full GEMM's bytes, at any thread count and in both frontends (one kernel)."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine.quantizers import (Float8BlockQuantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer,
                                   NVFP4Quantizer)

# Shapes (M, N, K): tile edges (kMR = 6 rows, kNR = 16 columns, 256-step K passes, 240-row
# chunks) on both sides, K = 1, N = 1, K past one K pass.
HP_SHAPES = [(37, 45, 70), (250, 33, 300), (7, 1, 13), (1, 19, 1), (64, 48, 513), (481, 17, 9)]
# Formats whose scales are per row (and per K block): a row slice quantizes to the rows of the
# full quantization. Per-tensor formats (FP8 current, NVFP4's global amax) get the tensor's
# largest magnitude planted inside the slice, so the slice's amax is the full tensor's.
QUANTIZED = {
    "fp8_current": (Float8CurrentScalingQuantizer("e4m3", columnwise=False), 1),
    "mxfp8": (MXFP8Quantizer("e4m3", columnwise=False), 32),
    "fp8_block": (Float8BlockQuantizer("e4m3", columnwise=False), 128),
    "nvfp4": (NVFP4Quantizer(columnwise=False), 16),
}  # name -> (quantizer, the row count's required multiple)


def _slices(rng, size, align=1):
    begin = int(rng.integers(0, size // align)) * align
    return begin, int(rng.integers(begin // align + 1, size // align + 1)) * align


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
@pytest.mark.parametrize("shape", HP_SHAPES)
@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "columnwise"])
def test_high_precision_slices_are_slices_of_the_full_gemm(dtype, shape, columnwise):
    m, n, k = shape
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
    b = torch.from_numpy(rng.standard_normal((n, k), dtype=np.float32))
    if dtype == "bfloat16":
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    # columnwise: op(a) = aᵀ with a stored (K, M) — the dgrad/wgrad operand layout.
    store = (lambda t: t.T.contiguous()) if columnwise else (lambda t: t)
    full = tep.gemm(store(a), store(b), a_columnwise=columnwise, b_columnwise=columnwise)
    for _ in range(4):
        r0, r1 = _slices(rng, m)
        c0, c1 = _slices(rng, n)
        part = tep.gemm(store(a[r0:r1]), store(b[c0:c1]), a_columnwise=columnwise, b_columnwise=columnwise)
        assert torch.equal(part, full[r0:r1, c0:c1]), (r0, r1, c0, c1)


@pytest.mark.parametrize("name", list(QUANTIZED))
def test_quantized_slices_are_slices_of_the_full_gemm(name):
    quantizer, align = QUANTIZED[name]
    rng = np.random.default_rng(len(name))
    m, n, k = 384, 256, 4 * 128
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((n, k), dtype=np.float32)
    full = None
    for _ in range(3):
        r0, r1 = _slices(rng, m, align)
        c0, c1 = _slices(rng, n, align)
        a[r0, 0], b[c0, 0] = 40.0, 40.0  # the tensors' largest magnitudes, inside both slices
        qa = tep.quantize(torch.from_numpy(a), quantizer)
        qb = tep.quantize(torch.from_numpy(b), quantizer)
        full = tep.gemm(qa, qb)
        part = tep.gemm(tep.quantize(torch.from_numpy(a[r0:r1].copy()), quantizer),
                        tep.quantize(torch.from_numpy(b[c0:c1].copy()), quantizer))
        assert torch.equal(part, full[r0:r1, c0:c1]), (name, r0, r1, c0, c1)
        a[r0, 0], b[c0, 0] = 0.5, 0.5


@pytest.mark.parametrize("name", ["hp", *QUANTIZED])
def test_bytes_do_not_depend_on_threads_and_match_jax(name):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((384, 256), dtype=np.float32)
    b = rng.standard_normal((128, 256), dtype=np.float32)
    if name == "hp":
        ta, tb, ja, jb = torch.from_numpy(a), torch.from_numpy(b), jnp.asarray(a), jnp.asarray(b)
    else:
        quantizer = QUANTIZED[name][0]
        ta, tb = tep.quantize(torch.from_numpy(a), quantizer), tep.quantize(torch.from_numpy(b), quantizer)
        ja, jb = tej.quantize(jnp.asarray(a), quantizer), tej.quantize(jnp.asarray(b), quantizer)
    threads = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(tep.gemm(ta, tb))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    np.testing.assert_array_equal(np.asarray(tej.gemm(ja, jb)), outs[0].numpy())

"""CPU GEMM batch invariance (NUMERICS.md §8): output (i, j) depends only on row i of the first
operand, row j of the second, K and the format — a GEMM over row / column slices gives exactly
that slice of the full GEMM, at any thread count, with any micro-kernel (AVX-512, AVX2, scalar);
high-precision bytes equal the documented FMA chain (NumPy reference, reference.gemm_order)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import twinengine.pytorch as te
from twinengine.quantizers import (Float8BlockQuantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer,
                                   NVFP4Quantizer)
from reference.gemm_order import chain_dot_ref

# Row-wise (1D) formats: with a same-magnitude value in every row (column 0 = ±PEAK), a row
# slice quantizes to exactly the rows of the full tensor (same per-tensor amax / scale too).
PEAK = 6.0
QUANTIZERS = {
    "fp32": None,
    "bf16": None,
    "fp8_current": lambda: Float8CurrentScalingQuantizer("e4m3"),
    "mxfp8": lambda: MXFP8Quantizer("e4m3"),
    "mxfp8_e5m2": lambda: MXFP8Quantizer("e5m2"),
    "fp8_block": lambda: Float8BlockQuantizer("e4m3"),
    "nvfp4": lambda: NVFP4Quantizer(),
}
# Shapes (M, N, K): not multiples of any tile, K = 1, N = 1, M = 1, K spanning several K-blocks.
SHAPES = [(37, 45, 1), (1, 29, 70), (53, 1, 96), (97, 67, 300), (130, 70, 523)]


def data(rng, rows, k):
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x = np.clip(x, -PEAK / 2, PEAK / 2)
    x[:, 0] = np.where(rng.random(rows) < 0.5, -PEAK, PEAK)
    return x


def operand(fmt, x):
    t = torch.from_numpy(x)
    if fmt == "bf16":
        return t.to(torch.bfloat16)
    if QUANTIZERS[fmt] is None:
        return t
    return te.quantize(t, QUANTIZERS[fmt]())


# Granularity the quantizer needs for (rows, K); slices are taken at multiples of the row one.
GRANULE = {"mxfp8": (32, 32), "mxfp8_e5m2": (32, 32), "fp8_block": (128, 128), "nvfp4": (16, 16)}


def up(v, g):
    return (v + g - 1) // g * g


def pick(rng, total, g):
    """A random [start, stop) of whole granules of `total` rows."""
    units = total // g
    s = int(rng.integers(0, units))
    return s * g, int(rng.integers(s + 1, units + 1)) * g


def run_at_threads(fn, threads):
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        return fn()
    finally:
        torch.set_num_threads(saved)


def bytes_of(t):
    return t.contiguous().view(torch.uint8 if t.element_size() == 1 else
                               {2: torch.int16, 4: torch.int32}[t.element_size()]).numpy()


@pytest.mark.parametrize("fmt", QUANTIZERS)
def test_slices_give_the_bytes_of_the_full_gemm(fmt):
    rng = np.random.default_rng(sorted(QUANTIZERS).index(fmt))
    gr, gk = GRANULE.get(fmt, (1, 1))
    for m, n, k in SHAPES:
        m, n, k = up(m, gr), up(n, gr), up(k, gk)
        x, w = data(rng, m, k), data(rng, n, k)
        full = te.gemm(operand(fmt, x), operand(fmt, w), out_dtype=torch.float32)
        full_bf16 = te.gemm(operand(fmt, x), operand(fmt, w), out_dtype=torch.bfloat16)
        for threads in (1, 2, 3):
            for _ in range(3):
                (r0, r1), (c0, c1) = pick(rng, m, gr), pick(rng, n, gr)
                xs, ws = operand(fmt, x[r0:r1].copy()), operand(fmt, w[c0:c1].copy())
                got = run_at_threads(lambda: te.gemm(xs, ws, out_dtype=torch.float32), threads)
                np.testing.assert_array_equal(bytes_of(got), bytes_of(full[r0:r1, c0:c1]),
                                              err_msg=f"{fmt} {(m, n, k)} rows {r0}:{r1} cols {c0}:{c1} "
                                                      f"at {threads} threads")
                got = run_at_threads(lambda: te.gemm(xs, ws, out_dtype=torch.bfloat16), threads)
                np.testing.assert_array_equal(bytes_of(got), bytes_of(full_bf16[r0:r1, c0:c1]))


@pytest.mark.parametrize("fmt", QUANTIZERS)
def test_dgrad_and_wgrad_layouts_are_batch_invariant(fmt):
    # dgrad: b columnwise (w is (K, N) in the GEMM's terms); wgrad: both columnwise. Slicing the
    # GEMM's N (dgrad: w's columns = K_in) or M/N (wgrad: dy's / x's features) gives the slice.
    if fmt in GRANULE:
        pytest.skip("block formats: slices here would need whole blocks along both dimensions")
    rng = np.random.default_rng(7)
    t, n, k = 70, 45, 38
    dy, w, x = data(rng, t, n), data(rng, n, k), data(rng, t, k)
    dgrad = te.gemm(operand(fmt, dy), operand(fmt, w), b_columnwise=True)
    # N of dgrad is w's column count: a column slice of w (its features) gives that slice.
    # (column 0 of w carries the peak, so keep it in the slice for a same-scale quantization)
    for c1 in (1, 17, k):
        ws = operand(fmt, np.ascontiguousarray(w[:, :c1]))
        got = run_at_threads(lambda: te.gemm(operand(fmt, dy), ws, b_columnwise=True), 2)
        np.testing.assert_array_equal(bytes_of(got), bytes_of(dgrad[:, :c1]))
    wgrad = te.gemm(operand(fmt, dy), operand(fmt, x), a_columnwise=True, b_columnwise=True)
    for r1, c1 in ((1, 1), (20, 9), (n, k)):
        dys, xs = operand(fmt, np.ascontiguousarray(dy[:, :r1])), operand(fmt, np.ascontiguousarray(x[:, :c1]))
        got = run_at_threads(lambda: te.gemm(dys, xs, a_columnwise=True, b_columnwise=True), 3)
        np.testing.assert_array_equal(bytes_of(got), bytes_of(wgrad[:r1, :c1]))


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_fp32_bytes_are_the_documented_fma_chain(m, n, k):
    rng = np.random.default_rng(m * 1000 + k)
    x = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 20, (m, k)))).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    got = te.gemm(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), chain_dot_ref(x, w).view(np.uint32))


_ISA_SCRIPT = """
import sys, numpy as np, torch
import twinengine.pytorch as te
from twinengine.quantizers import MXFP8Quantizer, NVFP4Quantizer
rng = np.random.default_rng(3)
out = []
for m, n, k in [(37, 45, 1), (97, 67, 300), (32, 64, 64)]:
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
    out.append(te.gemm(x, w).numpy().view(np.uint32).ravel())
    out.append(te.gemm(x.to(torch.bfloat16), w.to(torch.bfloat16), out_dtype=torch.bfloat16).view(torch.int16).numpy().ravel())
    if k % 32 == 0:
        out.append(te.gemm(te.quantize(x, MXFP8Quantizer()), te.quantize(w, MXFP8Quantizer())).numpy().view(np.uint32).ravel())
        out.append(te.gemm(te.quantize(x, NVFP4Quantizer()), te.quantize(w, NVFP4Quantizer())).numpy().view(np.uint32).ravel())
np.save(sys.argv[1], np.concatenate([o.astype(np.int64) for o in out]))
"""


def test_micro_kernels_give_identical_bytes(tmp_path):
    # TWE_GEMM_ISA picks the micro-kernel once per process: one subprocess per variant (a variant
    # the CPU lacks falls back to a narrower one, which must agree just the same).
    results = {}
    for isa in ("scalar", "avx2", "avx512"):
        path = tmp_path / f"{isa}.npy"
        env = dict(os.environ, TWE_GEMM_ISA=isa)
        subprocess.run([sys.executable, "-c", _ISA_SCRIPT, str(path)], env=env, check=True)
        results[isa] = np.load(path)
    np.testing.assert_array_equal(results["avx2"], results["scalar"])
    np.testing.assert_array_equal(results["avx512"], results["scalar"])

"""CPU GEMM throughput: twinengine.pytorch.gemm (high precision and every quantized format) against
torch.matmul fp32 on the same shapes, in the same process.

Usage: python bench/gemm.py [--repeats N]. Prints GFLOP/s and the ratio to torch.matmul; the
quantize step is excluded (operands are quantized once, up front).
"""

from __future__ import annotations

import argparse
import time

import torch

import twinengine.pytorch as te
from twinengine.quantizers import Float8BlockQuantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, NVFP4Quantizer

SHAPES = [(1024, 1024, 1024), (4096, 1024, 1024)]  # (M, N, K)


def best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch threads: {torch.get_num_threads()}")
    for m, n, k in SHAPES:
        x, w = torch.randn(m, k), torch.randn(n, k)
        flops = 2.0 * m * n * k
        base = best_time(lambda: torch.matmul(x, w.t()), args.repeats)
        print(f"M={m} N={n} K={k}: torch.matmul fp32 {flops / base / 1e9:7.1f} GFLOP/s")
        cases = {"high precision fp32": (x, w)}
        for name, qa, qb in (("fp8 per-tensor", Float8CurrentScalingQuantizer(), Float8CurrentScalingQuantizer()),
                             ("mxfp8", MXFP8Quantizer(), MXFP8Quantizer()),
                             ("fp8 block 1D x 2D", Float8BlockQuantizer(), Float8BlockQuantizer(block_scaling_dim=2)),
                             ("nvfp4", NVFP4Quantizer(), NVFP4Quantizer(with_2d_quantization=True))):
            cases[name] = (te.quantize(x, qa), te.quantize(w, qb))
        for name, (a, b) in cases.items():
            t = best_time(lambda: te.gemm(a, b), args.repeats)
            print(f"  twinengine {name:20s} {flops / t / 1e9:7.1f} GFLOP/s  ratio {base / t:5.2f}x")


if __name__ == "__main__":
    main()

"""GEMM throughput of twinengine.pytorch.gemm against torch.matmul, in the same process.

CPU (default): high precision and every quantized format against torch.matmul fp32, GFLOP/s.

    python bench/gemm.py [--repeats N]

CUDA: per-tensor FP8, MXFP8, FP8 block and NVFP4 GEMMs at M = N = K = --size (8192 by default)
against bf16 torch.matmul, TFLOP/s timed with CUDA events; each line names the plan the
dispatcher chose on this device (native cuBLASLt or the dequantize fallback). Then a
compiled Linear forward + backward step (tep.Linear under autocast with each recipe) against
a compiled bf16 torch.nn.Linear of the same shape. The NUMERICS §8 target on H100 is >= 1.6x
over bf16 for FP8 at 8192^3.

    python bench/gemm.py --device cuda [--size 8192] [--tokens 8192] [--repeats 50]

Quantization is excluded from the GEMM lines (operands are quantized once, up front) and
included in the Linear step (as in training).
"""

from __future__ import annotations

import argparse
import time

import torch

import twinengine as te_core
import twinengine._C as _C
import twinengine.pytorch as te
from twinengine.ops.gemm import GEMM_PATHS, gemm_plan_query
from twinengine.quantizers import Float8BlockQuantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, NVFP4Quantizer

SHAPES = [(1024, 1024, 1024), (4096, 1024, 1024)]  # CPU (M, N, K)

FORMATS = {  # name: (quantizer of A (activations), quantizer of B (weights))
    "fp8 per-tensor": (Float8CurrentScalingQuantizer(), Float8CurrentScalingQuantizer()),
    "mxfp8": (MXFP8Quantizer(), MXFP8Quantizer()),
    "fp8 block 1D x 2D": (Float8BlockQuantizer(), Float8BlockQuantizer(block_scaling_dim=2)),
    "nvfp4": (NVFP4Quantizer(), NVFP4Quantizer(with_2d_quantization=True)),
}


def best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cuda_time(fn, repeats: int) -> float:
    """Mean seconds per call over `repeats` calls after warm-up, CUDA events on the current stream."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / 1e3 / repeats


def cpu_main(args: argparse.Namespace) -> None:
    print(f"torch threads: {torch.get_num_threads()}")
    for m, n, k in SHAPES:
        x, w = torch.randn(m, k), torch.randn(n, k)
        flops = 2.0 * m * n * k
        base = best_time(lambda: torch.matmul(x, w.t()), args.repeats)
        print(f"M={m} N={n} K={k}: torch.matmul fp32 {flops / base / 1e9:7.1f} GFLOP/s")
        cases = {"high precision fp32": (x, w)}
        for name, (qa, qb) in FORMATS.items():
            cases[name] = (te.quantize(x, qa), te.quantize(w, qb))
        for name, (a, b) in cases.items():
            t = best_time(lambda: te.gemm(a, b), args.repeats)
            print(f"  twinengine {name:20s} {flops / t / 1e9:7.1f} GFLOP/s  ratio {base / t:5.2f}x")


def plan_name(a, b) -> str:
    major, minor = torch.cuda.get_device_capability()
    query = gemm_plan_query(a, b, out_dtype="bfloat16", sm=10 * major + minor,
                            cublaslt_version=_C.gemm_cublaslt_version())
    plan = _C.gemm_plan(query)
    return f"{GEMM_PATHS[plan['path']]} ({plan['reason']})"


def gemm_main(args: argparse.Namespace) -> None:
    s = args.size
    flops = 2.0 * s * s * s
    x = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    base = cuda_time(lambda: torch.matmul(x, w.t()), args.repeats)
    print(f"GEMM M=N=K={s}: torch.matmul bf16 {flops / base / 1e12:7.1f} TFLOP/s")
    cases = {"high precision bf16": (x, w)}
    for name, (qa, qb) in FORMATS.items():
        cases[name] = (te.quantize(x, qa), te.quantize(w, qb))
    for name, (a, b) in cases.items():
        t = cuda_time(lambda: te.gemm(a, b, out_dtype=torch.bfloat16), args.repeats)
        print(f"  twinengine {name:20s} {flops / t / 1e12:7.1f} TFLOP/s  ratio {base / t:5.2f}x  "
              f"[{plan_name(a, b)}]")


def linear_main(args: argparse.Namespace) -> None:
    s, tokens = args.size, args.tokens
    flops = 3 * 2.0 * tokens * s * s  # fprop + dgrad + wgrad
    x = torch.randn(tokens, s, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, s, device="cuda", dtype=torch.bfloat16)
    ref = torch.compile(torch.nn.Linear(s, s, device="cuda", dtype=torch.bfloat16), fullgraph=True)
    base = cuda_time(lambda: ref(x).backward(dy), args.repeats)  # compiled forward and backward
    print(f"Linear fwd+bwd tokens={tokens} in=out={s}: compiled torch.nn.Linear bf16 "
          f"{flops / base / 1e12:7.1f} TFLOP/s")
    layer = te.Linear(s, s, params_dtype=torch.bfloat16, device="cuda")
    recipes = {"fp8 current scaling": te_core.recipe.Float8CurrentScaling(),
               "mxfp8": te_core.recipe.MXFP8BlockScaling(),
               "fp8 block": te_core.recipe.Float8BlockScaling(),
               "nvfp4": te_core.recipe.NVFP4BlockScaling()}
    for name, recipe in recipes.items():
        @torch.compile(fullgraph=True)
        def forward(inp, recipe=recipe):
            with te.autocast(recipe=recipe):
                return layer(inp)

        t = cuda_time(lambda: forward(x).backward(dy), args.repeats)
        print(f"  tep.Linear {name:20s} {flops / t / 1e12:7.1f} TFLOP/s  ratio {base / t:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls (CPU default 5, CUDA 50)")
    parser.add_argument("--size", type=int, default=8192, help="CUDA: M = N = K of the GEMMs, Linear in = out")
    parser.add_argument("--tokens", type=int, default=8192, help="CUDA: rows of the Linear step's input")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.device == "cpu":
        args.repeats = args.repeats or 5
        cpu_main(args)
        return
    if not (torch.cuda.is_available() and _C.has_cuda()):
        raise SystemExit("--device cuda needs a CUDA device and a CUDA build of twinengine")
    args.repeats = args.repeats or 50
    print(f"{torch.cuda.get_device_name()}  cuBLASLt {_C.gemm_cublaslt_version()}")
    gemm_main(args)
    linear_main(args)


if __name__ == "__main__":
    main()

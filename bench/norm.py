"""Fused norm+quantize vs the unfused pair vs PyTorch's own norm (compiled) + our quantize, CPU.

For RMSNorm and LayerNorm, each followed by an MXFP8 or FP8 current-scaling quantize, three
contenders produce the same quantized tensor (the first two byte-identically):
  fused    one call: twinengine's norm with quantizer= (y and its quantized copy)
  unfused  twinengine's norm, then twinengine's quantize of y
  torch    torch.compile'd F.rms_norm / F.layer_norm, then twinengine's quantize
They run interleaved in one loop (the order rotates every round), so machine noise hits all
three alike; the report is the median over rounds of each per-round time ratio to `fused`,
with the min–max range. `--clock cpu` times the process's CPU time (all its threads) instead of
wall time: on a loaded shared machine it is far less noisy, and for these kernels (all threads
busy, no waiting) it measures the same work.

    python bench/norm.py [--rows 4096 --cols 4096 --dtype bfloat16 --rounds 15 --clock wall|cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import twinengine as te
import twinengine.pytorch as tep
from twinengine.pytorch._ops import norm as tn

EPS = 1e-5
QUANTIZERS = {"mxfp8": te.MXFP8Quantizer("e4m3"), "fp8 current": te.Float8CurrentScalingQuantizer("e4m3")}


def contenders(norm: str, q: te.Quantizer, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    """name -> zero-argument callable producing the quantized normalized x."""
    k = x.shape[-1]
    if norm == "rmsnorm":
        compiled = torch.compile(lambda x, w: F.rms_norm(x, (k,), w, EPS), fullgraph=True)
        return {
            "fused": lambda: tn.rmsnorm_fwd(x, weight, EPS, False, quantizer=q)[2],
            "unfused": lambda: tep.quantize(tn.rmsnorm_fwd(x, weight, EPS, False)[0], q),
            "torch": lambda: tep.quantize(compiled(x, weight), q),
        }
    compiled = torch.compile(lambda x, w, b: F.layer_norm(x, (k,), w, b, EPS), fullgraph=True)
    return {
        "fused": lambda: tn.layernorm_fwd(x, weight, bias, EPS, False, quantizer=q)[3],
        "unfused": lambda: tep.quantize(tn.layernorm_fwd(x, weight, bias, EPS, False)[0], q),
        "torch": lambda: tep.quantize(compiled(x, weight, bias), q),
    }


def measure(fns: dict, rounds: int, clock) -> dict[str, list[float]]:
    """Per-round seconds of each contender, run interleaved with a rotating order."""
    names = list(fns)
    for name in names:  # warm-up (and compile)
        fns[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = clock()
            fns[name]()
            times[name].append(clock() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    x = torch.randn(args.rows, args.cols).to(dtype)
    weight, bias = torch.randn(args.cols).to(dtype), torch.randn(args.cols).to(dtype)
    print(f"CPU, x {args.rows}x{args.cols} {args.dtype}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch threads, {args.rounds} interleaved rounds, {args.clock} time")
    print(f"{'case':<26}{'fused ms (median)':>19}{'unfused / fused':>26}{'torch+quantize / fused':>30}")
    for norm in ("rmsnorm", "layernorm"):
        for qname, q in QUANTIZERS.items():
            times = measure(contenders(norm, q, x, weight, bias), args.rounds, clock)
            cells = []
            for other in ("unfused", "torch"):
                ratios = [o / f for o, f in zip(times[other], times["fused"])]
                cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
            fused_ms = statistics.median(times["fused"]) * 1e3
            print(f"{norm + ' + ' + qname:<26}{fused_ms:>19.2f}{cells[0]:>26}{cells[1]:>30}")


if __name__ == "__main__":
    main()

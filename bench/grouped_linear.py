"""CPU GroupedLinear step (forward + backward) in three forms on the same expert weights and
routing, for 8 and 64 experts:

  grouped  twinengine.pytorch.GroupedLinear: one grouped kernel per GEMM phase, m_splits a tensor;
  loop     one twinengine.pytorch.Linear per expert on its rows (a Python loop, host splits);
  plain    per-expert torch matmuls in a loop under torch.compile (the splits as Python ints).

Usage: python bench/grouped_linear.py [--repeats N] [--tokens T]. Prints the best time of each
and the ratios loop/grouped and plain/grouped. The bench machine is shared: expect noise.
"""

from __future__ import annotations

import argparse
import time

import torch

import twinengine.pytorch as tep


def best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run(num_experts: int, tokens: int, hidden: int, ffn: int, repeats: int) -> None:
    torch.manual_seed(0)
    layer = tep.GroupedLinear(num_experts, hidden, ffn)
    weights = [getattr(layer, f"weight{g}") for g in range(num_experts)]
    biases = [getattr(layer, f"bias{g}") for g in range(num_experts)]
    linears = []
    for g in range(num_experts):
        lin = tep.Linear(hidden, ffn)
        lin.weight, lin.bias = weights[g], biases[g]
        linears.append(lin)
    counts = torch.distributions.Multinomial(tokens, torch.ones(num_experts)).sample().to(torch.int32)
    splits_t, splits = counts, [int(c) for c in counts]
    x = torch.randn(tokens, hidden, requires_grad=True)
    dy = torch.randn(tokens, ffn)

    def grouped():
        layer(x, splits_t).backward(dy)

    def loop():
        ys = [lin(part) for lin, part in zip(linears, torch.split(x, splits))]
        torch.cat(ys).backward(dy)

    @torch.compile(fullgraph=True)
    def plain_forward(x):
        parts = torch.split(x, splits)
        return torch.cat([torch.addmm(b, p, w.t()) for p, w, b in zip(parts, weights, biases)])

    def plain():
        plain_forward(x).backward(dy)

    times = {name: best_time(fn, repeats) for name, fn in (("grouped", grouped), ("loop", loop), ("plain", plain))}
    flops = 3 * 2.0 * tokens * hidden * ffn
    print(f"E={num_experts:3d} T={tokens} hidden={hidden} ffn={ffn}: "
          + "  ".join(f"{n} {t * 1e3:7.2f} ms ({flops / t / 1e9:5.1f} GFLOP/s)" for n, t in times.items())
          + f"  | loop/grouped {times['loop'] / times['grouped']:5.2f}x  plain/grouped "
            f"{times['plain'] / times['grouped']:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=1024)
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()} (shared machine: timings are noisy)")
    for experts in (8, 64):
        run(experts, args.tokens, args.hidden, args.ffn, args.repeats)


if __name__ == "__main__":
    main()

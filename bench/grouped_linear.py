"""CPU GroupedLinear step (forward + backward) in three forms on the same expert weights and
routing, for 8 and 64 experts:

  grouped  twinengine.pytorch.GroupedLinear: one grouped kernel per GEMM phase, m_splits a tensor;
  loop     one twinengine.pytorch.Linear per expert on its rows (a Python loop, host splits);
  plain    per-expert torch matmuls in a loop under torch.compile (the splits as Python ints).

Usage: python bench/grouped_linear.py [--repeats N] [--tokens T] [--recipe NAME] [--threads N].
Prints the best time of each and the median [min–max] over interleaved rounds of loop/grouped
and plain/grouped (bench/_timing.py). ``--recipe`` (e.g. Float8CurrentScaling, DelayedScaling,
MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling) runs grouped and loop inside that
autocast; plain stays high precision. The bench machine is shared: expect noise.
"""

from __future__ import annotations

import argparse

import contextlib
import os
import sys

import torch

import twinengine as te
import twinengine.pytorch as tep

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleave, ratio  # noqa: E402


def run(num_experts: int, tokens: int, hidden: int, ffn: int, repeats: int, recipe_name: str | None = None) -> None:
    torch.manual_seed(0)
    recipe = getattr(te.recipe, recipe_name)() if recipe_name else None
    layer = tep.GroupedLinear(num_experts, hidden, ffn)
    weights = [getattr(layer, f"weight{g}") for g in range(num_experts)]
    biases = [getattr(layer, f"bias{g}") for g in range(num_experts)]
    linears = []
    for g in range(num_experts):
        lin = tep.Linear(hidden, ffn)
        lin.weight, lin.bias = weights[g], biases[g]
        linears.append(lin)
    counts = torch.distributions.Multinomial(tokens, torch.ones(num_experts)).sample().to(torch.int32)
    align = {"MXFP8BlockScaling": 32, "Float8BlockScaling": 128, "NVFP4BlockScaling": 16}.get(recipe_name or "", 1)
    if align > 1:  # quantized blocks need aligned splits: round each down, the rest to expert 0
        counts = counts // align * align
        counts[0] += tokens - int(counts.sum())
        counts[0] -= counts[0] % align
        tokens = int(counts.sum())
    splits_t, splits = counts, [int(c) for c in counts]
    x = torch.randn(tokens, hidden, requires_grad=True)
    dy = torch.randn(tokens, ffn)

    def region():
        return tep.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext()

    def grouped():
        with region():
            y = layer(x, splits_t)
        y.backward(dy)

    def loop():
        with region():
            ys = [lin(part) for lin, part in zip(linears, torch.split(x, splits)) if part.shape[0]]
        torch.cat(ys).backward(dy)

    @torch.compile(fullgraph=True)
    def plain_forward(x):
        parts = torch.split(x, splits)
        return torch.cat([torch.addmm(b, p, w.t()) for p, w, b in zip(parts, weights, biases)])

    def plain():
        plain_forward(x).backward(dy)

    rounds = interleave({"grouped": grouped, "loop": loop, "plain": plain}, rounds=repeats)
    times = {name: min(ts) for name, ts in rounds.items()}
    flops = 3 * 2.0 * tokens * hidden * ffn
    print(f"E={num_experts:3d} T={tokens} hidden={hidden} ffn={ffn} recipe={recipe_name}: "
          + "  ".join(f"{n} {t * 1e3:7.2f} ms ({flops / t / 1e9:5.1f} GFLOP/s)" for n, t in times.items())
          + f"  | loop/grouped {ratio(rounds['loop'], rounds['grouped'])}  plain/grouped "
            f"{ratio(rounds['plain'], rounds['grouped'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--recipe", default=None)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()} (shared machine: timings are noisy)")
    for experts in (8, 64):
        run(experts, args.tokens, args.hidden, args.ffn, args.repeats, args.recipe)


if __name__ == "__main__":
    main()

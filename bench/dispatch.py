"""Eager dispatch overhead: a tiny quantize vs the framework's own tiny add, interleaved.

At 32×32 the kernels do almost nothing, so the time is the Python + binding + framework
dispatch path. Each round times --calls back-to-back calls of each contender (order rotating
every round, bench/_timing.py) and the report is the median of per-round ratios with min–max:
  tep.quantize ÷ torch.add          (targets: ≤ 10×)
  tej.quantize eager ÷ jnp.add eager (≤ 5×), once with every call blocking until ready (on a
                                     busy machine the thread hand-off dominates both), once
                                     pipelined (only each round's last call blocks)

    python bench/dispatch.py [--size 32 --calls 200 --rounds 15]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import Contender, interleave, median, ratio  # noqa: E402

# Noise from other processes only ever adds time, so next to the median of per-round ratios the
# ratio of the two best rounds ("best") is printed: on a shared machine it is the steadier one.

import twinengine as te  # noqa: E402
import twinengine.pytorch as tep  # noqa: E402

QUANTIZERS = {
    "fp8 current": te.Float8CurrentScalingQuantizer("e4m3"),
    "mxfp8": te.MXFP8Quantizer("e4m3"),
    "fp8 block": te.Float8BlockQuantizer("e4m3", block_scaling_dim=1),
    "nvfp4": te.NVFP4Quantizer(),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-jax", action="store_true")
    args = parser.parse_args()
    n = args.size
    x = torch.randn(n, n)
    y = torch.randn(n, n)
    print(f"eager {n}x{n} float32, {args.calls} calls per timing, {args.rounds} interleaved rounds, "
          f"torch {torch.__version__}; ratio: median [min–max] of per-round ratios")
    print(f"{'op':<34}{'µs/call':>9}  ratio to the framework's add: median [min–max] | best÷best")
    contenders = {"torch.add": Contender(lambda: torch.add(x, y), args.calls)}
    for name, q in QUANTIZERS.items():
        if n % 128 and name == "fp8 block":
            continue
        contenders[name] = Contender(lambda q=q: tep.quantize(x, q), args.calls)
    times = interleave(contenders, args.rounds, warmup=2)
    print(f"{'torch.add':<34}{median(times['torch.add']) * 1e6:>9.2f}")
    for name in contenders:
        if name != "torch.add":
            print(f"{'tep.quantize ' + name:<34}{median(times[name]) * 1e6:>9.2f}  "
                  f"{ratio(times[name], times['torch.add']):.1f} | {min(times[name]) / min(times['torch.add']):.1f}")
    if args.no_jax:
        return
    import jax
    import jax.numpy as jnp

    import twinengine.jax as tej

    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    for mode, sync_each in (("each call blocks", True), ("pipelined: the last call of a round blocks", False)):
        def calls(fn, sync_each=sync_each):
            def run():
                for _ in range(args.calls - 1):
                    out = fn()
                    if sync_each:
                        jax.block_until_ready(out)
                jax.block_until_ready(fn())
            return Contender(run)

        contenders = {"jnp.add": calls(lambda: jnp.add(xj, yj))}
        for name, q in QUANTIZERS.items():
            if n % 128 and name == "fp8 block":
                continue
            contenders[name] = calls(lambda q=q: tej.quantize(xj, q))
        times = interleave(contenders, args.rounds, warmup=2)
        times = {k: [t / args.calls for t in v] for k, v in times.items()}
        print(f"{'jnp.add (eager)':<34}{median(times['jnp.add']) * 1e6:>9.2f}  [{mode}]")
        for name in contenders:
            if name != "jnp.add":
                print(f"{'tej.quantize ' + name + ' (eager)':<34}{median(times[name]) * 1e6:>9.2f}  "
                      f"{ratio(times[name], times['jnp.add']):.1f} | {min(times[name]) / min(times['jnp.add']):.1f}")


if __name__ == "__main__":
    main()

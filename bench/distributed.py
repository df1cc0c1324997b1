"""Sequence-parallel input all-gather: quantized (data + scales) vs high precision, bytes and time.

Why TE all-gathers FP8: a sequence-parallel column-parallel Linear needs the whole sequence;
gathering the quantized shards (per-tensor formats quantized with the group's global amax,
NUMERICS §12; block formats with blocks inside shards) moves ~1 byte per element instead of 2
(bf16) and gives the bytes of quantizing the gathered tensor — what twinengine's
sequence-parallel BasicLinear / LayerNormLinear / LayerNormMLP do
(``twinengine.pytorch.distributed.all_gather_quantized``). Per recipe, on each of the `--world`
gloo processes (127.0.0.1), for the rowwise copy (the forward GEMM operand) and for both copies
(what the backward also needs):
  hp:  all-gather the bf16 shard, then quantize the whole tensor;
  q:   quantize the shard (current scaling: with the all-reduced amax), all-gather data + scales.
Per-tensor FP8's columnwise copy is the transpose of the rowwise data, so only 1 byte/element
travels for both copies; MXFP8 and FP8-block copies differ and both travel.
They run interleaved in one loop (order rotating every round, bench/_timing.py); the report is
the median per-round time ratio with its min–max range, wall clock (the collectives' time is
not process CPU time). gloo over loopback on a shared, loaded CPU machine: the time ratio is
indicative only; NCCL on GPUs was not measured here.

    python bench/distributed.py [--seq 4096 --hidden 4096 --world 2 --rounds 15]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleave, median, ratio  # noqa: E402

RECIPES = ("Float8CurrentScaling", "MXFP8BlockScaling", "Float8BlockScaling")
FIELDS = ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv")


def _bytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _worker(rank: int, world: int, port: int, args) -> None:
    import twinengine.pytorch as tep
    from twinengine import recipe
    from twinengine.distributed import TRANSPOSED, quantized_gather_plan
    from twinengine.pytorch.distributed import all_gather, all_gather_quantized, quantize_reduced

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    name = torch.distributed.group.WORLD.group_name
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.seq // world, args.hidden, generator=gen).to(torch.bfloat16)
    hp_bytes = _bytes(x) * (world - 1)
    lines = []
    for recipe_name in RECIPES:
        for copies in ("rowwise", "both"):
            q = getattr(recipe, recipe_name)().quantizer("input")
            q = dataclasses.replace(q, columnwise=copies == "both")

            def hp(q=q):
                return tep.quantize(all_gather(x, name, world), q)

            def quantized(q=q):
                return all_gather_quantized(quantize_reduced(x, q, name), name, world)

            got, want = quantized(), hp()
            same = all(torch.equal(*(t.view(torch.uint8) if t.element_size() == 1 else t for t in pair))
                       for pair in ((getattr(got, f), getattr(want, f)) for f in FIELDS) if pair[1] is not None)
            local = quantize_reduced(x, q, name)
            moved = sum(_bytes(getattr(local, f)) // getattr(local, f).shape[axis] * used
                        for f, axis, used in quantized_gather_plan(q, *x.shape)
                        if axis is not None and axis != TRANSPOSED) * (world - 1)
            times = interleave({"hp": hp, "q": quantized}, rounds=args.rounds)
            lines.append(f"{recipe_name:22s} {copies:8s} bytes q/hp {moved / hp_bytes:.3f} ({moved} / {hp_bytes}); "
                         f"time hp {median(times['hp']) * 1e3:7.2f} ms, q {median(times['q']) * 1e3:7.2f} ms, "
                         f"q/hp {ratio(times['q'], times['hp'])}; bytes equal quantize(gathered): {same}")
    if rank == 0:
        print(f"seq {args.seq} x hidden {args.hidden} bf16, {world} gloo processes, {args.rounds} interleaved rounds, "
              "wall clock; bytes received per rank (scale padding excluded; + 4 B amax all-reduce for current "
              "scaling)")
        print("\n".join(lines))
    torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(args.world, port, args), nprocs=args.world)


if __name__ == "__main__":
    main()

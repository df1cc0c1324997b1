"""Sequence-parallel input all-gather: FP8 (data + one scale) vs high precision, bytes and time.

Why TE all-gathers FP8: a sequence-parallel column-parallel Linear needs the whole sequence;
gathering the quantized shards (each quantized with the group's global amax, NUMERICS §12)
moves 1 byte per element instead of 2 (bf16) and gives the bytes of quantizing the gathered
tensor. Contenders, per call on each of the `--world` gloo processes (127.0.0.1):
  hp:   all-gather the bf16 shard, then quantize the whole tensor (Float8CurrentScaling);
  fp8:  all-reduce the amax (4 bytes), quantize the shard with it, all-gather the FP8 data.
They run interleaved in one loop (order rotating every round, bench/_timing.py); the report is
the median per-round time ratio with its min–max range, wall clock (the collectives' time is
not process CPU time). gloo over loopback on a shared, loaded CPU machine: the time ratio is
indicative only; NCCL on GPUs was not measured here. The twinengine Linear itself gathers in
high precision today (README "Distributed (PyTorch)").

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


def _worker(rank: int, world: int, port: int, args) -> None:
    import twinengine.pytorch as tep
    from twinengine import recipe
    from twinengine.pytorch.distributed import all_gather, global_amax, quantize_with_amax

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    name = torch.distributed.group.WORLD.group_name
    q = recipe.Float8CurrentScaling().quantizer("input")
    q = dataclasses.replace(q, columnwise=False)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.seq // world, args.hidden, generator=gen).to(torch.bfloat16)

    def hp():
        return tep.quantize(all_gather(x, name, world), q)

    def fp8():
        local = quantize_with_amax(x, q, global_amax(x, name))
        return all_gather(local.rowwise_data.view(torch.uint8), name, world), local.rowwise_scale_inv

    data, scale_inv = fp8()
    whole = hp()
    same = torch.equal(data, whole.rowwise_data.view(torch.uint8)) and torch.equal(scale_inv, whole.rowwise_scale_inv)
    times = interleave({"hp": hp, "fp8": fp8}, rounds=args.rounds)
    if rank == 0:
        hp_bytes = x.numel() * x.element_size() * (world - 1)
        fp8_bytes = x.numel() * (world - 1) + 4
        print(f"seq {args.seq} x hidden {args.hidden}, {world} gloo processes, {args.rounds} interleaved rounds, "
              f"wall clock")
        print(f"bytes received per rank: hp (bf16) {hp_bytes}, fp8 {fp8_bytes} (+4 B amax all-reduce): "
              f"ratio fp8/hp {fp8_bytes / hp_bytes:.3f}")
        print(f"median time per call: hp {median(times['hp']) * 1e3:.2f} ms, fp8 {median(times['fp8']) * 1e3:.2f} ms; "
              f"fp8/hp {ratio(times['fp8'], times['hp'])}")
        print(f"fp8-gathered bytes equal quantize(gathered bf16): {same}")
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

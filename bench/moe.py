"""MoE permute / unpermute vs the same moves in plain PyTorch, eager and torch.compile'd.

The baseline sorts the routed (token, expert) pairs with torch (argsort / nonzero), moves rows
with index_select and merges them back with index_add_ in fp32, the usual eager MoE recipe; the
compiled baseline is that code under torch.compile (inductor). Every case times the three
interleaved in one loop (bench/_timing.py: the order rotates every round) and reports the median
of per-round ratios ours÷compiled and ours÷eager with the min–max range (target on CPU:
moe_permute ÷ compiled <= 0.8).

    python bench/moe.py [--tokens 4096 --hidden 1024 --experts 64 --topk 4 --dtype bfloat16]
    python bench/moe.py --clock cpu --threads 1     # CPU seconds: steady on a shared machine
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import CLOCKS, interleave, median, ratio  # noqa: E402

import twinengine.pytorch as tep  # noqa: E402


def torch_permute_index(x, ids):
    order = torch.argsort(ids.reshape(-1), stable=True)
    return x.index_select(0, order // ids.shape[1]), order


def torch_unpermute_index(y, order, probs):
    topk = probs.shape[1]
    weighted = y.float() * probs.reshape(-1)[order].float()[:, None]
    out = torch.zeros(probs.shape[0], y.shape[1], dtype=torch.float32, device=y.device)
    return out.index_add_(0, order // topk, weighted).to(y.dtype)


def torch_permute_mask(x, mask):
    expert, token = mask.t().nonzero(as_tuple=True)
    return x.index_select(0, token), (expert, token)


def torch_unpermute_mask(y, pairs, probs):
    expert, token = pairs
    weighted = y.float() * probs[token, expert].float()[:, None]
    out = torch.zeros(probs.shape[0], y.shape[1], dtype=torch.float32, device=y.device)
    return out.index_add_(0, token, weighted).to(y.dtype)


def run(device: str, args) -> None:
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    x = torch.randn(args.tokens, args.hidden, device=device).to(dtype)
    ids = torch.rand(args.tokens, args.experts, device=device).topk(args.topk, dim=1).indices.to(torch.int32)
    mask = torch.zeros(args.tokens, args.experts, dtype=torch.bool, device=device).scatter_(1, ids.long(), True)
    probs_index = torch.rand(args.tokens, args.topk, device=device)
    probs_mask = torch.zeros(args.tokens, args.experts, device=device).scatter_(1, ids.long(), probs_index)
    n_out = args.tokens * args.topk

    out_i, map_i = tep.moe_permute(x, ids, map_type="index")
    out_m, map_m = tep.moe_permute(x, mask, num_out_tokens=n_out)
    ref_i, order = torch_permute_index(x, ids)
    ref_m, pairs = torch_permute_mask(x, mask)
    compiled = {fn: torch.compile(fn) for fn in (torch_permute_index, torch_unpermute_index, torch_permute_mask,
                                                  torch_unpermute_mask)}
    cases = {
        "permute (index map)": (lambda: tep.moe_permute(x, ids, map_type="index"), torch_permute_index, (x, ids)),
        "permute (mask map)": (lambda: tep.moe_permute(x, mask, num_out_tokens=n_out), torch_permute_mask, (x, mask)),
        "unpermute (index map)": (lambda: tep.moe_unpermute(out_i, map_i, merging_probs=probs_index, map_type="index"),
                                  torch_unpermute_index, (ref_i, order, probs_index)),
        "unpermute (mask map)": (lambda: tep.moe_unpermute(out_m, map_m, merging_probs=probs_mask),
                                 torch_unpermute_mask, (ref_m, pairs, probs_mask)),
    }
    threads = f", {torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs" \
        if device == "cpu" else ""
    print(f"{device}: {args.tokens} tokens x {args.hidden} {args.dtype}, {args.experts} experts, top-{args.topk}"
          f"{threads}, {args.rounds} interleaved rounds, {args.clock} time; ratios: median [min–max] per round")
    print(f"{'op':<24}{'ours ms':>9}  {'ours÷compiled':<24}{'ours÷eager':<24}")
    sync = torch.cuda.synchronize if device == "cuda" else None
    for name, (ours, baseline, inputs) in cases.items():
        fn = compiled[baseline]
        times = interleave({"ours": ours, "eager": lambda b=baseline: b(*inputs),
                            "compiled": lambda f=fn: f(*inputs)}, args.rounds, warmup=2, sync=sync,
                           clock=CLOCKS[args.clock])
        cells = [f"{ratio(times['ours'], times[b]):.2f}" for b in ("compiled", "eager")]
        print(f"{name:<24}{median(times['ours']) * 1e3:>9.2f}  " + "".join(f"{c:<24}" for c in cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--clock", default="wall", choices=list(CLOCKS))
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    run("cpu", args)
    if torch.cuda.is_available():
        run("cuda", args)


if __name__ == "__main__":
    main()

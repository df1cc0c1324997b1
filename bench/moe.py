"""MoE permute / unpermute throughput vs a plain-PyTorch implementation, same process.

The baseline sorts the routed (token, expert) pairs with torch (argsort / nonzero), moves rows
with index_select and merges them back with index_add_ in fp32, the usual eager MoE recipe.
Prints milliseconds and speedup = baseline time / twinengine time, on CPU and, when present,
on CUDA.

    python bench/moe.py [--tokens 4096 --hidden 1024 --experts 64 --topk 4 --dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import twinengine.pytorch as tep


def best_time(fn, repeat: int, device: str) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


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
    cases = {
        "permute (index map)": (lambda: tep.moe_permute(x, ids, map_type="index"),
                                lambda: torch_permute_index(x, ids)),
        "permute (mask map)": (lambda: tep.moe_permute(x, mask, num_out_tokens=n_out),
                               lambda: torch_permute_mask(x, mask)),
        "unpermute (index map)": (lambda: tep.moe_unpermute(out_i, map_i, merging_probs=probs_index, map_type="index"),
                                  lambda: torch_unpermute_index(ref_i, order, probs_index)),
        "unpermute (mask map)": (lambda: tep.moe_unpermute(out_m, map_m, merging_probs=probs_mask),
                                 lambda: torch_unpermute_mask(ref_m, pairs, probs_mask)),
    }
    threads = f", {torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs" \
        if device == "cpu" else ""
    print(f"{device}: {args.tokens} tokens x {args.hidden} {args.dtype}, {args.experts} experts, top-{args.topk}"
          f"{threads}")
    print(f"{'op':<24}{'twinengine ms':>15}{'torch ms':>11}{'speedup':>9}")
    for name, (ours, baseline) in cases.items():
        t_ours, t_base = best_time(ours, args.repeat, device), best_time(baseline, args.repeat, device)
        print(f"{name:<24}{t_ours * 1e3:>15.2f}{t_base * 1e3:>11.2f}{t_base / t_ours:>9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    run("cpu", args)
    if torch.cuda.is_available():
        run("cuda", args)


if __name__ == "__main__":
    main()

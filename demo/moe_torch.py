"""MoE block example (PyTorch): router top-k -> permute(+pad) -> GroupedLinear -> ReLU ->
GroupedLinear -> unpermute, on one device and expert-parallel over a process group with
tokens exchanged by all-to-all (torch.distributed functional collectives, compile-traceable).

Both paths run every expert on the same rows in the same order, so the expert-parallel block
gives each rank's tokens the bytes the single-device block gives them, forward and backward:
the data all-to-alls are differentiable (their backward is the reverse all-to-all), each
token's input gradient and each expert's parameter gradients equal the single-device block's
(tests/pytorch/test_moe_block.py). The router's weight gradient is not compared: each rank
holds its tokens' share, and summing the shares over ranks is another reduction order than the
single-device GEMM over all tokens.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import twinengine.pytorch as tep
from twinengine.pytorch import ops


def make_experts(num_experts: int, hidden: int, ffn: int) -> ops.Sequential:
    """fc1 (GroupedLinear) -> ReLU -> fc2 (GroupedLinear): called as experts(x, m_splits, m_splits)."""
    return ops.Sequential(ops.GroupedLinear(num_experts, hidden, ffn), ops.ReLU(),
                          ops.GroupedLinear(num_experts, ffn, hidden))


def full_splits(splits: torch.Tensor, rows: int) -> torch.Tensor:
    """The padded blocks' sizes with the static buffer's rows past their sum (zero padding,
    dropped by moe_unpermute / moe_unpad_splits) added to the last expert's block, so they sum
    to the rows as GroupedLinear requires (no host sync: a tensor expression)."""
    return torch.cat([splits[:-1], splits[-1:] + (rows - splits.sum())])


def local_experts(experts: ops.Sequential, rank: int, ep_size: int) -> ops.Sequential:
    """The experts rank `rank` owns (a contiguous slice), with their parameters copied."""
    fc1, _, fc2 = experts.basic_ops
    local = fc1.num_gemms // ep_size
    part = make_experts(local, fc1.in_features, fc1.out_features)
    with torch.no_grad():
        for src, dst in ((fc1, part.basic_ops[0]), (fc2, part.basic_ops[2])):
            for g in range(local):
                for kind in ("weight", "bias"):
                    getattr(dst, f"{kind}{g}").copy_(getattr(src, f"{kind}{rank * local + g}"))
    return part


def route(x: torch.Tensor, router_weight: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask (T, E) bool of each token's top-k experts, merging probs (T, E): softmax, 0 off the mask)."""
    probs = torch.softmax(tep.linear(x, router_weight), dim=-1)
    top = torch.topk(probs, topk, dim=-1).indices
    mask = torch.zeros_like(probs, dtype=torch.bool).scatter(1, top, True)
    return mask, torch.where(mask, probs, torch.zeros_like(probs))


def moe_block(x, router_weight, experts, topk: int, align_size: int):
    """Single-device block: fused permute-and-pad, the experts on padded blocks, unpermute."""
    mask, probs = route(x, router_weight, topk)
    out, _, row_id_map, pad_offsets, splits = tep.moe_permute_and_pad_with_probs(
        x, probs, mask, mask.sum(0), align_size, num_out_tokens=x.shape[0] * topk)
    splits = full_splits(splits, out.shape[0])
    y = experts(out, splits, splits)
    return tep.moe_unpermute(y, row_id_map, probs, pad_offsets=pad_offsets)


def moe_block_expert_parallel(x, router_weight, experts, topk: int, align_size: int, group, ep_size: int):
    """The block with the experts split over `ep_size` ranks of `group` (rank r owns experts
    [r·E/ep, (r+1)·E/ep)). Static shapes throughout: each rank sends every other rank a block of
    N = T·topK rows (the most it can route there), valid rows first."""
    num_tokens, num_experts = x.shape[0], router_weight.shape[0]
    local, n = num_experts // ep_size, x.shape[0] * topk
    mask, probs = route(x, router_weight, topk)
    counts = mask.sum(0).to(torch.int32)
    permuted, row_id_map = tep.moe_permute(x, mask, num_out_tokens=n)
    # Per destination rank: its experts' rows are contiguous in the expert-major permutation.
    dest_counts = counts.view(ep_size, local).sum(1)
    dest_start = torch.cumsum(dest_counts, 0) - dest_counts
    offsets = torch.arange(n, device=x.device)
    index = (dest_start[:, None] + offsets[None]).clamp(max=n - 1).reshape(-1)
    valid = (offsets[None] < dest_counts[:, None]).reshape(-1, 1)
    send = torch.where(valid, permuted[index], torch.zeros((), dtype=x.dtype))
    recv_counts = funcol.all_to_all_single(counts, None, None, group).view(ep_size, local)
    recv = funcol.all_to_all_single_autograd(send, None, None, group)  # the backward sends the gradients back
    # Source-major [s: e0, e1, .., pad] -> expert-major [e0: s0, s1, ..; e1: ..; pads].
    chunk_sizes = torch.cat([recv_counts, (n - recv_counts.sum(1))[:, None]], 1).reshape(-1)
    order = [s * (local + 1) + e for e in range(local) for s in range(ep_size)]
    order += [s * (local + 1) + local for s in range(ep_size)]
    order_t = torch.tensor(order, dtype=torch.int32, device=x.device)
    compact = tep.moe_sort_chunks_by_index(recv, chunk_sizes, order_t)
    m_splits = recv_counts.sum(0)
    padded, padded_splits = tep.moe_pad_splits(compact, m_splits, align_size)
    padded_splits = full_splits(padded_splits, padded.shape[0])
    y = experts(padded, padded_splits, padded_splits)
    y = tep.moe_unpad_splits(y, m_splits, align_size, ep_size * n)
    inverse = torch.tensor([order.index(c) for c in range(len(order))], dtype=torch.int32, device=x.device)
    back = tep.moe_sort_chunks_by_index(y, chunk_sizes[order_t], inverse)
    returned = funcol.all_to_all_single_autograd(back, None, None, group)
    dest = torch.bucketize(offsets, torch.cumsum(dest_counts, 0), right=True).clamp(max=ep_size - 1)
    permuted_out = returned[dest * n + offsets - dest_start[dest]]
    del num_tokens
    return tep.moe_unpermute(permuted_out, row_id_map, probs)


def example(seed: int, num_experts: int, hidden: int, ffn: int, num_tokens: int):
    """(experts, router_weight, x, dy) of a small example, from torch's RNG seeded with `seed`
    (dy: the gradient of the block's output used to compare backward passes)."""
    torch.manual_seed(seed)
    experts = make_experts(num_experts, hidden, ffn)
    router, x = torch.randn(num_experts, hidden), torch.randn(num_tokens, hidden)
    return experts, router, x, torch.randn(num_tokens, hidden)


def expert_grads(experts: ops.Sequential) -> np.ndarray:
    """The experts' parameter gradients, expert by expert (fc1 weight, bias; fc2 weight, bias),
    flattened into one array."""
    fc1, _, fc2 = experts.basic_ops
    parts = []
    for g in range(fc1.num_gemms):
        for op in (fc1, fc2):
            parts += [getattr(op, f"weight{g}").grad.reshape(-1), getattr(op, f"bias{g}").grad.reshape(-1)]
    return torch.cat(parts).numpy()


def run_with_grads(fn, x: torch.Tensor, dy: torch.Tensor, experts: ops.Sequential, *args):
    """(y, dx, expert parameter gradients) of fn(x, router, experts, ...) with upstream gradient dy."""
    experts.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    y = fn(x, args[0], experts, *args[1:])
    y.backward(dy)
    return y.detach().numpy(), x.grad.numpy(), expert_grads(experts)


def expert_parallel_worker(rank: int, world: int, port: int, out_dir: str, config: dict) -> None:
    """One rank of the expert-parallel run (for ``torch.multiprocessing.spawn``): gloo on
    127.0.0.1, the rank's slice of the example tokens through the block eager and compiled,
    forward and backward (the all-to-alls carry the gradients back), saved to
    ``out_dir/rank{rank}.npz`` (outputs, input gradients, the rank's experts' gradients)."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        experts, router, x_all, dy_all = example(config["seed"], config["experts"], config["hidden"], config["ffn"],
                                                 world * config["tokens"])
        local = local_experts(experts, rank, world)
        t = config["tokens"]
        x, dy = x_all[rank * t:(rank + 1) * t], dy_all[rank * t:(rank + 1) * t]
        args = (router, config["topk"], config["align"], dist.group.WORLD, world)
        results = {}
        compiled_fn = torch.compile(moe_block_expert_parallel, fullgraph=True)
        for name, fn in (("eager", moe_block_expert_parallel), ("compiled", compiled_fn)):
            y, dx, grads = run_with_grads(fn, x, dy, local, *args)
            results.update({name: y, f"{name}_dx": dx, f"{name}_grads": grads})
        np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)
    finally:
        dist.destroy_process_group()

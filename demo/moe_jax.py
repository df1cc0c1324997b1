"""MoE block example (JAX): router top-k -> permute(+pad) -> grouped_dense -> ReLU ->
grouped_dense -> unpermute, on one device and expert-parallel under ``shard_map`` with tokens
exchanged by ``jax.lax.all_to_all`` (static shapes, jitted).

Both paths run every expert on the same rows in the same order, so the expert-parallel block
gives each device's tokens the bytes the single-device block gives them, forward and backward
(all_to_all transposes to the reverse all_to_all: input gradients and every expert's
parameter gradients are the single-device block's). Run as a script
(``python -m demo.moe_jax OUT.npz``) with XLA_FLAGS=--xla_force_host_platform_device_count=8
to compare them on 8 CPU devices (tests/jax/test_moe_block.py does, in a subprocess).
"""

from __future__ import annotations

import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import twinengine.jax as tej


def init_params(key, num_experts: int, hidden: int, ffn: int) -> dict:
    """Router kernel (hidden, E) and the experts' stacked kernels / biases."""
    k = jax.random.split(key, 5)
    return {"router": jax.random.normal(k[0], (hidden, num_experts)),
            "kernel1": jax.random.normal(k[1], (num_experts, hidden, ffn)) * hidden ** -0.5,
            "bias1": jax.random.normal(k[2], (num_experts, ffn)) * 0.1,
            "kernel2": jax.random.normal(k[3], (num_experts, ffn, hidden)) * ffn ** -0.5,
            "bias2": jax.random.normal(k[4], (num_experts, hidden)) * 0.1}


def route(x, router, topk: int):
    """(mask (T, E) of each token's top-k experts, merging probs (T, E): softmax, 0 off the mask)."""
    probs = jax.nn.softmax(tej.dense(x, router), axis=-1)
    _, top = jax.lax.top_k(probs, topk)
    mask = jnp.zeros(probs.shape, jnp.bool_).at[jnp.arange(x.shape[0])[:, None], top].set(True)
    return mask, jnp.where(mask, probs, 0.0)


def experts(params: dict, x, splits):
    """The experts on the static padded buffer x: its rows past Σ splits (zero padding, dropped
    by token_combine / moe_unpad_splits) join the last expert's block, so the splits sum to the
    rows as grouped_dense requires (no host sync: the sizes stay traced)."""
    splits = splits.at[-1].add(x.shape[0] - splits.sum())
    h = jax.nn.relu(tej.grouped_dense(x, params["kernel1"], splits, params["bias1"]))
    return tej.grouped_dense(h, params["kernel2"], splits, params["bias2"])


def moe_block(params: dict, x, topk: int, align_size: int):
    """Single-device block: fused permute-and-pad (token_dispatch), experts, token_combine."""
    mask, probs = route(x, params["router"], topk)
    out, _, row_id_map, pad_offsets, splits = tej.token_dispatch(x, mask, x.shape[0] * topk, probs=probs,
                                                                 align_size=align_size)
    return tej.token_combine(experts(params, out, splits), row_id_map, probs, pad_offsets)


def moe_block_expert_parallel(params: dict, x, topk: int, align_size: int, axis_name: str, ep_size: int):
    """The block inside ``shard_map`` over `axis_name` (ep_size devices): x and the expert
    parameters are this device's shards (device r owns experts [r·E/ep, (r+1)·E/ep)); the router
    is replicated. Each device sends every other a block of N = T·topK rows, valid rows first."""
    num_experts = params["router"].shape[1]
    local, n = num_experts // ep_size, x.shape[0] * topk
    mask, probs = route(x, params["router"], topk)
    counts = mask.astype(jnp.int32).sum(0).astype(jnp.int32)
    permuted, row_id_map = tej.moe_permute(x, mask, num_out_tokens=n)
    dest_counts = counts.reshape(ep_size, local).sum(1)
    dest_start = jnp.cumsum(dest_counts) - dest_counts
    offsets = jnp.arange(n)
    index = jnp.minimum(dest_start[:, None] + offsets[None], n - 1).reshape(-1)
    valid = (offsets[None] < dest_counts[:, None]).reshape(-1, 1)
    send = jnp.where(valid, permuted[index], jnp.zeros((), x.dtype))
    a2a = partial(jax.lax.all_to_all, axis_name=axis_name, split_axis=0, concat_axis=0, tiled=True)
    recv_counts = a2a(counts).reshape(ep_size, local)
    recv = a2a(send)
    chunk_sizes = jnp.concatenate([recv_counts, (n - recv_counts.sum(1))[:, None]], 1).reshape(-1)
    order = [s * (local + 1) + e for e in range(local) for s in range(ep_size)]
    order += [s * (local + 1) + local for s in range(ep_size)]
    compact = tej.moe_sort_chunks_by_index(recv, chunk_sizes, jnp.asarray(order, jnp.int32))
    m_splits = recv_counts.sum(0)
    padded, padded_splits = tej.moe_pad_splits(compact, m_splits, align_size)
    y = tej.moe_unpad_splits(experts(params, padded, padded_splits), m_splits, align_size, ep_size * n)
    inverse = jnp.asarray([order.index(c) for c in range(len(order))], jnp.int32)
    back = tej.moe_sort_chunks_by_index(y, chunk_sizes[jnp.asarray(order)], inverse)
    returned = a2a(back)
    dest = jnp.minimum(jnp.searchsorted(jnp.cumsum(dest_counts), offsets, side="right"), ep_size - 1)
    return tej.moe_unpermute(returned[dest * n + offsets - dest_start[dest]], row_id_map, probs)


EXPERT_PARAMS = ("kernel1", "bias1", "kernel2", "bias2")


def compare(out_path: str, experts_per_device: int = 2, tokens_per_device: int = 6, hidden: int = 16,
            ffn: int = 32, topk: int = 2, align_size: int = 16) -> None:
    """Runs both blocks on all devices' tokens, forward and backward (upstream gradient dy), and
    saves outputs, input gradients and expert parameter gradients of both to out_path. (The
    router's gradient is left out: under shard_map each device's share is summed over devices,
    another reduction order than the single-device GEMM over all tokens.)"""
    devices = jax.devices()
    ep = len(devices)
    num_experts = ep * experts_per_device
    params = init_params(jax.random.PRNGKey(0), num_experts, hidden, ffn)
    x = jax.random.normal(jax.random.PRNGKey(1), (ep * tokens_per_device, hidden))
    dy = jax.random.normal(jax.random.PRNGKey(2), (ep * tokens_per_device, hidden))
    mesh = jax.sharding.Mesh(np.array(devices), ("ep",))
    P = jax.sharding.PartitionSpec
    specs = {"router": P(), "kernel1": P("ep"), "bias1": P("ep"), "kernel2": P("ep"), "bias2": P("ep")}
    sharded = jax.shard_map(partial(moe_block_expert_parallel, topk=topk, align_size=align_size, axis_name="ep",
                                    ep_size=ep), mesh=mesh, in_specs=(specs, P("ep")), out_specs=P("ep"),
                            # the FFI kernels' custom VJPs return arrays without the varying-
                            # manual-axes type of their inputs, which the vma check rejects
                            check_vma=False)
    results = {"devices": ep}
    for name, block in (("single", partial(moe_block, topk=topk, align_size=align_size)), ("expert_parallel", sharded)):
        def forward_backward(params, x, dy, block=block):
            y, vjp = jax.vjp(block, params, x)
            grads, dx = vjp(dy)
            return y, dx, {k: grads[k] for k in EXPERT_PARAMS}

        y, dx, grads = jax.jit(forward_backward)(params, x, dy)
        results[name] = np.asarray(y)
        results[f"{name}_dx"] = np.asarray(dx)
        for k in EXPERT_PARAMS:
            results[f"{name}_{k}"] = np.asarray(grads[k])
    np.savez(out_path, **results)


if __name__ == "__main__":
    compare(sys.argv[1])

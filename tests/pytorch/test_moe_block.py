"""The MoE block example (demo/moe_torch.py): single device and expert-parallel over 2 gloo
processes on 127.0.0.1 (all-to-all through functional collectives) give each rank's tokens the
same bytes, eager and under torch.compile(fullgraph=True), forward and backward (outputs,
input gradients, expert parameter gradients); the single-device block trains."""

from __future__ import annotations

import pathlib
import socket
import sys

import numpy as np
import torch
import torch.multiprocessing as mp

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from demo import moe_torch  # noqa: E402

CONFIG = {"seed": 0, "experts": 4, "hidden": 16, "ffn": 32, "tokens": 10, "topk": 2, "align": 16}
WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _example():
    c = CONFIG
    return moe_torch.example(c["seed"], c["experts"], c["hidden"], c["ffn"], WORLD * c["tokens"])


def _bytes_equal(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_expert_parallel_block_matches_single_device_bytes(tmp_path):
    """Outputs, input gradients and each rank's experts' parameter gradients (eager and
    compiled) equal the single-device block's for that rank's tokens / experts."""
    mp.spawn(moe_torch.expert_parallel_worker, args=(WORLD, _free_port(), str(tmp_path), CONFIG), nprocs=WORLD)
    experts, router, x_all, dy_all = _example()
    rest = (router, CONFIG["topk"], CONFIG["align"])
    single = {}
    for name, fn in (("eager", moe_torch.moe_block), ("compiled", torch.compile(moe_torch.moe_block, fullgraph=True))):
        single[name] = moe_torch.run_with_grads(fn, x_all, dy_all, experts, *rest)
    t = CONFIG["tokens"]
    per_expert = single["eager"][2].size // CONFIG["experts"]
    local = CONFIG["experts"] // WORLD
    for rank in range(WORLD):
        got = np.load(tmp_path / f"rank{rank}.npz")
        rows = slice(rank * t, (rank + 1) * t)
        for name in ("eager", "compiled"):
            y, dx, grads = single[name]
            assert _bytes_equal(got[name], y[rows]), f"rank {rank} {name} output"
            assert _bytes_equal(got[f"{name}_dx"], dx[rows]), f"rank {rank} {name} input gradient"
            mine = grads[rank * local * per_expert:(rank + 1) * local * per_expert]
            assert _bytes_equal(got[f"{name}_grads"], mine), f"rank {rank} {name} expert gradients"
    # (Compiled and eager are compared each with its own kind: inductor fuses the router's plain
    # torch softmax, so their router-path gradients may round differently.)


def test_single_device_block_gradients():
    experts, router, x_all, _ = _example()
    x = x_all.clone().requires_grad_()
    moe_torch.moe_block(x, router, experts, CONFIG["topk"], CONFIG["align"]).square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in experts.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name

"""The MoE block example (demo/moe_torch.py): single device and expert-parallel over 2 gloo
processes on 127.0.0.1 (all-to-all through functional collectives) give each rank's tokens the
same bytes, eager and under torch.compile(fullgraph=True); the single-device block trains
(gradients reach the input and every expert parameter)."""

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


def test_expert_parallel_block_matches_single_device_bytes(tmp_path):
    mp.spawn(moe_torch.expert_parallel_worker, args=(WORLD, _free_port(), str(tmp_path), CONFIG), nprocs=WORLD)
    experts, router, x_all = _example()
    args = (x_all, router, experts, CONFIG["topk"], CONFIG["align"])
    eager = moe_torch.moe_block(*args).detach().numpy()
    compiled = torch.compile(moe_torch.moe_block, fullgraph=True)(*args).detach().numpy()
    t = CONFIG["tokens"]
    for rank in range(WORLD):
        got = np.load(tmp_path / f"rank{rank}.npz")
        rows = slice(rank * t, (rank + 1) * t)
        assert np.array_equal(got["eager"].view(np.uint32), eager[rows].view(np.uint32)), f"rank {rank} eager"
        assert np.array_equal(got["compiled"].view(np.uint32), compiled[rows].view(np.uint32)), f"rank {rank} compiled"


def test_single_device_block_gradients():
    experts, router, x_all = _example()
    x = x_all.clone().requires_grad_()
    moe_torch.moe_block(x, router, experts, CONFIG["topk"], CONFIG["align"]).square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in experts.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name

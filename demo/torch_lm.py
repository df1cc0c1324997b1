"""The language model in PyTorch: tep.Linear, residual tep.LayerNormMLP(RMSNorm, SwiGLU) blocks and
a Sequential of basic ops (RMSNorm -> Linear) as the head, under autocast; forward + loss compiled
with torch.compile(fullgraph=True); Adam written out (as in jax_lm)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import twinengine.pytorch as te
from twinengine.pytorch import ops
from twinengine.recipe import Recipe

from .init import SEEDS, block_seed


def _load(param: torch.nn.Parameter, value: np.ndarray) -> None:
    with torch.no_grad():
        param.copy_(torch.from_numpy(value))


class TorchLM(torch.nn.Module):
    """embedding -> concat context -> Linear -> [h + LayerNormMLP(h)] x blocks -> RMSNorm -> Linear."""

    def __init__(self, params: dict[str, np.ndarray], blocks: int, recipe: Recipe | None,
                 amax_history_len: int) -> None:
        super().__init__()
        self.recipe = recipe
        self.embedding = torch.nn.Parameter(torch.from_numpy(params["embedding"].copy()))
        hidden, fan_in = params["proj.weight"].shape
        self.proj = te.Linear(fan_in, hidden, amax_history_len=amax_history_len, rng_seed=SEEDS["proj"])
        _load(self.proj.weight, params["proj.weight"])
        _load(self.proj.bias, params["proj.bias"])
        self.blocks = torch.nn.ModuleList()
        for b in range(blocks):
            ffn = params[f"block{b}.fc2_weight"].shape[1]
            block = te.LayerNormMLP(hidden, ffn, normalization="RMSNorm", activation="swiglu",
                                    amax_history_len=amax_history_len, rng_seed=block_seed(b))
            for name, p in block.named_parameters():
                _load(p, params[f"block{b}.{name}"])
            self.blocks.append(block)
        vocab = params["head.weight"].shape[0]
        self.head = ops.Sequential(ops.RMSNorm(hidden), ops.Linear(hidden, vocab, amax_history_len=amax_history_len,
                                                                   rng_seed=SEEDS["head"]))
        _load(self.head.basic_ops[0].weight, params["head.norm_weight"])
        _load(self.head.basic_ops[1].weight, params["head.weight"])
        _load(self.head.basic_ops[2].bias, params["head.bias"])

    def forward(self, contexts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=self.recipe is not None, recipe=self.recipe):
            h = self.proj(self.embedding[contexts].reshape(contexts.shape[0], -1))
            for block in self.blocks:
                h = h + block(h)
            logits = self.head(h)
        return F.cross_entropy(logits, targets)


class TorchTrainer:
    """One compiled forward per step, eager backward, Adam."""

    def __init__(self, params, blocks: int, recipe, amax_history_len: int, lr: float,
                 backend: str = "inductor") -> None:
        self.model = TorchLM(params, blocks, recipe, amax_history_len)
        self.loss_fn = torch.compile(self.model, fullgraph=True, backend=backend)
        self.lr = lr
        self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.model.parameters()]
        self.t = 0

    def step(self, contexts: np.ndarray, targets: np.ndarray) -> float:
        self.model.zero_grad(set_to_none=True)
        loss = self.loss_fn(torch.from_numpy(contexts), torch.from_numpy(targets))
        loss.backward()
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        # Bias corrections as float32 scalars computed in Python, exactly as jax_lm passes them.
        c1, c2 = (torch.tensor(1 - b**self.t, dtype=torch.float32) for b in (b1, b2))
        with torch.no_grad():
            for p, (m, v) in zip(self.model.parameters(), self.moments):
                m.copy_(m * b1 + p.grad * (1 - b1))
                v.copy_(v * b2 + p.grad * p.grad * (1 - b2))
                p.copy_(p - self.lr * (m / c1) / ((v / c2).sqrt() + eps))
        return float(loss.detach())

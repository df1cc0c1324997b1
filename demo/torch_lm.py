"""The MLP language model in PyTorch: twinengine.pytorch.Linear layers under autocast, the
forward + loss compiled with torch.compile(fullgraph=True), Adam written out (as in jax_lm)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import twinengine.pytorch as te
from twinengine.recipe import Recipe


class TorchLM(torch.nn.Module):
    """embedding -> concat context -> Linear -> ReLU -> Linear -> ReLU -> Linear (logits)."""

    def __init__(self, params: dict[str, np.ndarray], recipe: Recipe | None, amax_history_len: int) -> None:
        super().__init__()
        self.recipe = recipe
        self.embedding = torch.nn.Parameter(torch.from_numpy(params["embedding"].copy()))
        layers = {}
        for name in ("fc1", "fc2", "head"):
            out_features, in_features = params[f"{name}.weight"].shape
            layer = te.Linear(in_features, out_features, amax_history_len=amax_history_len)
            with torch.no_grad():
                layer.weight.copy_(torch.from_numpy(params[f"{name}.weight"]))
                layer.bias.copy_(torch.from_numpy(params[f"{name}.bias"]))
            layers[name] = layer
        self.layers = torch.nn.ModuleDict(layers)

    def forward(self, contexts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=self.recipe is not None, recipe=self.recipe):
            h = self.embedding[contexts].reshape(contexts.shape[0], -1)
            h = F.relu(self.layers["fc1"](h))
            h = F.relu(self.layers["fc2"](h))
            logits = self.layers["head"](h)
        return F.cross_entropy(logits, targets)


class TorchTrainer:
    """One compiled forward per step, eager backward, Adam."""

    def __init__(self, params, recipe, amax_history_len: int, lr: float, backend: str = "inductor") -> None:
        self.model = TorchLM(params, recipe, amax_history_len)
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

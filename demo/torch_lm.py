"""The language model in PyTorch: token embedding, ``tep.TransformerLayer`` blocks (causal
self-attention with rotary embeddings, RMSNorm, SwiGLU LayerNormMLP) and a ``Sequential`` of basic
ops (RMSNorm -> Linear) as the head, under ``autocast``; forward + loss compiled with
torch.compile(fullgraph=True); Adam written out (as in jax_lm)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import twinengine.pytorch as te
from twinengine.jax import params_to_torch
from twinengine.pytorch import ops
from twinengine.recipe import Recipe

from .init import HEAD_SEED, ModelConfig, layer_seed


class TorchLM(torch.nn.Module):
    """embedding -> TransformerLayer x layers -> Sequential(RMSNorm, Linear), from the NumPy tree."""

    def __init__(self, params: dict, cfg: ModelConfig, recipe: Recipe | None, amax_history_len: int) -> None:
        super().__init__()
        self.recipe = recipe
        self.embedding = torch.nn.Parameter(torch.empty(cfg.vocab, cfg.hidden))
        self.layers = torch.nn.ModuleList(
            te.TransformerLayer(cfg.hidden, cfg.ffn, cfg.heads, hidden_dropout=0.0, attention_dropout=0.0,
                                self_attn_mask_type="causal", normalization="RMSNorm", activation="swiglu",
                                attn_input_format="bshd", bias=True, amax_history_len=amax_history_len,
                                seed=layer_seed(i))
            for i in range(cfg.layers))
        self.register_buffer("freqs", te.RotaryPositionEmbedding(cfg.head_dim)(cfg.context), persistent=False)
        self.head = ops.Sequential(ops.RMSNorm(cfg.hidden),
                                   ops.Linear(cfg.hidden, cfg.vocab, amax_history_len=amax_history_len,
                                              rng_seed=HEAD_SEED))
        # The shared tree -> torch names (twinengine.jax.params_to_torch); the head's basic ops are
        # loaded by position (Sequential names them basic_ops.<i>).
        body = {k: v for k, v in params.items() if k != "head"}
        missing, unexpected = self.load_state_dict(params_to_torch(body), strict=False)
        parameter_names = {name for name, _ in self.named_parameters() if not name.startswith("head.")}
        not_loaded = parameter_names & set(missing)
        if unexpected or not_loaded:
            raise ValueError(f"parameter tree does not match the model: unexpected {unexpected}, missing {not_loaded}")
        with torch.no_grad():
            norm, linear, bias = self.head.basic_ops
            norm.weight.copy_(torch.from_numpy(params["head"]["norm_weight"]))
            linear.weight.copy_(torch.from_numpy(params["head"]["weight"]))
            bias.bias.copy_(torch.from_numpy(params["head"]["bias"]))

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=self.recipe is not None, recipe=self.recipe):
            h = self.embedding[inputs]  # (batch, context, hidden), "bshd"
            for layer in self.layers:
                h = layer(h, rotary_pos_emb=self.freqs)
            logits = self.head(h.reshape(-1, h.shape[-1]))
        return F.cross_entropy(logits, targets.reshape(-1))


class TorchTrainer:
    """One compiled forward per step, eager backward, Adam."""

    def __init__(self, params: dict, cfg: ModelConfig, recipe: Recipe | None, amax_history_len: int, lr: float,
                 backend: str = "inductor") -> None:
        self.model = TorchLM(params, cfg, recipe, amax_history_len)
        self.loss_fn = torch.compile(self.model, fullgraph=True, backend=backend)
        self.lr = lr
        self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.model.parameters()]
        self.t = 0

    def step(self, inputs: np.ndarray, targets: np.ndarray) -> float:
        self.model.zero_grad(set_to_none=True)
        loss = self.loss_fn(torch.from_numpy(inputs), torch.from_numpy(targets))
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

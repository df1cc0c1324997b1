"""The model's shape and its initial parameters, drawn once with NumPy and loaded into both
frameworks. The parameter tree is the Flax one (``twinengine.jax.params_from_torch`` layout:
torch names split at the dots, weights (out, in)); the PyTorch model loads it through
``twinengine.jax.params_to_torch``, so the two start from the same bytes."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only LM: token embedding (vocab, hidden) -> `layers` pre-norm TransformerLayers
    (causal self-attention with rotary embeddings over `heads` heads, RMSNorm, SwiGLU MLP of
    width `ffn`) -> RMSNorm -> Linear to the vocabulary."""

    vocab: int
    context: int
    hidden: int
    ffn: int
    heads: int
    layers: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def describe(self) -> str:
        return (f"embedding {self.vocab}x{self.hidden} -> {self.layers} x TransformerLayer(hidden {self.hidden}, "
                f"{self.heads} heads of {self.head_dim}, causal, rotary, RMSNorm, SwiGLU {self.ffn}) -> RMSNorm -> "
                f"Linear {self.vocab}, context {self.context}")

    def check(self) -> None:
        if self.hidden % self.heads or self.head_dim % 2:
            raise ValueError(f"--hidden ({self.hidden}) must be a multiple of --heads ({self.heads}) with an even "
                             f"quotient (the rotary embedding rotates channel pairs)")


def _uniform(rng, fan_in: int, shape, scale: float = 1.0) -> np.ndarray:
    bound = scale / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def init_params(cfg: ModelConfig, seed: int) -> dict:
    """Nested NumPy float32 parameters:
    ``embedding`` (vocab, hidden);
    ``layers[str(i)]`` = a TransformerLayer's ``{"self_attention": {"layernorm_qkv":
    {layer_norm_weight, weight (3·hidden, hidden) rows [Q; K; V], bias}, "proj": {weight, bias}},
    "layernorm_mlp": {layer_norm_weight, fc1_weight (2·ffn, hidden), fc1_bias, fc2_weight (hidden,
    ffn), fc2_bias}}``;
    ``head`` = {norm_weight, weight (vocab, hidden), bias}.
    Linears are U(±1/√fan_in) with zero biases; the two projections that write into the residual
    stream (attention proj, fc2) are scaled by 1/√(2·layers) (GPT-2's rule), norms start at 1."""
    rng = np.random.default_rng(seed)
    h, f = cfg.hidden, cfg.ffn
    out_scale = 1.0 / np.sqrt(2 * cfg.layers)
    params: dict = {"embedding": rng.standard_normal((cfg.vocab, h)).astype(np.float32), "layers": {}}
    for i in range(cfg.layers):
        params["layers"][str(i)] = {
            "self_attention": {
                "layernorm_qkv": {"layer_norm_weight": np.ones(h, np.float32), "weight": _uniform(rng, h, (3 * h, h)),
                                  "bias": np.zeros(3 * h, np.float32)},
                "proj": {"weight": _uniform(rng, h, (h, h), out_scale), "bias": np.zeros(h, np.float32)},
            },
            "layernorm_mlp": {"layer_norm_weight": np.ones(h, np.float32),
                              "fc1_weight": _uniform(rng, h, (2 * f, h)), "fc1_bias": np.zeros(2 * f, np.float32),
                              "fc2_weight": _uniform(rng, f, (h, f), out_scale), "fc2_bias": np.zeros(h, np.float32)},
        }
    params["head"] = {"norm_weight": np.ones(h, np.float32), "weight": _uniform(rng, h, (cfg.vocab, h)),
                      "bias": np.zeros(cfg.vocab, np.float32)}
    return params


def layer_seed(i: int) -> int:
    """PyTorch TransformerLayer i's rng seed (its NVFP4 stochastic-rounding streams use seed ... seed + 3)."""
    return 10 + 4 * i


HEAD_SEED = 100
"""The head Linear's stochastic-rounding seed; every forward advances a Linear's rng offset by one,
so step t (from 1) uses offset t - 1 (the JAX head passes [HEAD_SEED, t - 1] explicitly)."""

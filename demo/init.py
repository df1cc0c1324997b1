"""Initial parameters, drawn once with NumPy and loaded into both frameworks (torch layout:
weight (out, in); the blocks' parameters carry the TE names of LayerNormMLP / ops.Linear)."""

from __future__ import annotations

import numpy as np


def _linear(rng, fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32), np.zeros(fan_out, np.float32)


def init_params(vocab: int, embed: int, context: int, hidden: int, ffn: int, blocks: int,
                seed: int) -> dict[str, np.ndarray]:
    """embedding (vocab, embed); proj.{weight,bias} (hidden, context·embed); per block b:
    block{b}.{layer_norm_weight, fc1_weight (2·ffn, hidden), fc1_bias, fc2_weight (hidden, ffn),
    fc2_bias}; head.{norm_weight, weight (vocab, hidden), bias}."""
    rng = np.random.default_rng(seed)
    params = {"embedding": rng.standard_normal((vocab, embed)).astype(np.float32) * 0.5}
    params["proj.weight"], params["proj.bias"] = _linear(rng, context * embed, hidden)
    for b in range(blocks):
        params[f"block{b}.layer_norm_weight"] = np.ones(hidden, np.float32)
        params[f"block{b}.fc1_weight"], params[f"block{b}.fc1_bias"] = _linear(rng, hidden, 2 * ffn)
        w2, b2 = _linear(rng, ffn, hidden)
        params[f"block{b}.fc2_weight"], params[f"block{b}.fc2_bias"] = w2 * 0.5, b2
    params["head.norm_weight"] = np.ones(hidden, np.float32)
    params["head.weight"], params["head.bias"] = _linear(rng, hidden, vocab)
    return params


SEEDS = {"proj": 0, "head": 100}
"""Stochastic-rounding rng seeds of the Linears; block b's FC1 / FC2 use 10 + 2b and 11 + 2b. Every
forward advances each Linear's offset by one, so step t (from 1) uses offset t - 1 in both frameworks."""


def block_seed(b: int) -> int:
    return 10 + 2 * b

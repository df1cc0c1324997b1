"""Initial parameters, drawn once with NumPy and loaded into both frameworks."""

from __future__ import annotations

import numpy as np


def init_params(vocab: int, embed: int, context: int, hidden: int, seed: int) -> dict[str, np.ndarray]:
    """Embedding (vocab, embed) and three Linear layers in torch layout: weight (out, in), bias (out,)."""
    rng = np.random.default_rng(seed)
    params = {"embedding": rng.standard_normal((vocab, embed)).astype(np.float32) * 0.5}
    sizes = [("fc1", context * embed, hidden), ("fc2", hidden, hidden), ("head", hidden, vocab)]
    for name, fan_in, fan_out in sizes:
        bound = 1.0 / np.sqrt(fan_in)
        params[f"{name}.weight"] = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        params[f"{name}.bias"] = np.zeros(fan_out, np.float32)
    return params

"""The demo's data: a character-level corpus embedded in the Python standard library (the Zen
of Python, no downloads) and the training batches, drawn from one NumPy RNG so both frameworks
see the same batches."""

from __future__ import annotations

import codecs
import contextlib
import io

import numpy as np


def corpus() -> str:
    """The Zen of Python, decoded from the standard library's ``this`` module."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # noqa: F401  (prints the text on first import)
    return codecs.decode(this.s, "rot13")


class CharData:
    """Characters -> ids (vocabulary padded to `vocab_multiple` so block formats can tile the
    output layer) and (context, next-character) batches."""

    def __init__(self, text: str, context: int, vocab_multiple: int = 128) -> None:
        chars = sorted(set(text))
        self.vocab = -(-len(chars) // vocab_multiple) * vocab_multiple
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.ids = np.array([self.stoi[c] for c in text], dtype=np.int64)
        self.context = context

    def batches(self, batch: int, steps: int, seed: int):
        """`steps` batches of (contexts (batch, context) int64, targets (batch,) int64)."""
        rng = np.random.default_rng(seed)
        starts = np.arange(len(self.ids) - self.context)
        for _ in range(steps):
            pos = rng.choice(starts, size=batch)
            ctx = np.stack([self.ids[p:p + self.context] for p in pos])
            yield ctx, self.ids[pos + self.context]

"""The demo's data: a character-level corpus read from the Python standard library's own source
files (megabytes of real text on every machine, no downloads) and the training batches, drawn
from one NumPy RNG so both frameworks see the same batches."""

from __future__ import annotations

import pathlib
import sysconfig

import numpy as np


def corpus(max_chars: int = 2_000_000) -> str:
    """Source text of the standard library's top-level modules (sorted by name, so the same on
    every machine with the same Python), up to `max_chars` characters; characters outside
    printable ASCII (plus newline) become '?' so the vocabulary fits 128 ids."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    text = "".join(parts)[:max_chars]
    return "".join(c if c == "\n" or " " <= c <= "~" else "?" for c in text)


class CharData:
    """Characters -> ids (vocabulary padded to `vocab_multiple` so block formats can tile the
    output layer) and batches of (input, next-character target) sequences."""

    def __init__(self, text: str, context: int, vocab_multiple: int = 128) -> None:
        chars = sorted(set(text))
        self.chars = len(chars)
        self.vocab = -(-len(chars) // vocab_multiple) * vocab_multiple
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.ids = np.array([self.stoi[c] for c in text], dtype=np.int64)
        self.context = context

    def unigram_entropy(self) -> float:
        """Entropy (nats) of the character frequencies: the loss of the best model that ignores
        the context, so a loss below it is learned from the context."""
        p = np.bincount(self.ids) / len(self.ids)
        p = p[p > 0]
        return float(-(p * np.log(p)).sum())

    def batches(self, batch: int, steps: int, seed: int):
        """`steps` batches of (inputs (batch, context) int64, targets (batch, context) int64):
        windows of context + 1 characters at uniformly random positions, the targets being the
        inputs shifted by one (each position predicts the next character)."""
        rng = np.random.default_rng(seed)
        offsets = np.arange(self.context + 1)
        for _ in range(steps):
            pos = rng.integers(0, len(self.ids) - self.context, size=batch)
            window = self.ids[pos[:, None] + offsets]
            yield window[:, :-1], window[:, 1:]

"""Interleaved timing shared by the bench/ scripts: ratios that machine noise cannot fake.

Every contender runs once per round, in an order that rotates from round to round, so a
burst of load from another process hits all of them alike; the report for a contender is the
median over rounds of its per-round time ratio to the reference contender, with the min–max
range (a wide range says the machine was noisy, not that the code changed).

``clock``: ``time.perf_counter`` (wall, the default) or ``time.process_time`` (CPU seconds of
the whole process, all threads): on a machine shared with other jobs, wall time charges every
contender for the time slices the scheduler gave to others, which hits a long call more often
than a short one (a copy of a few MB fits in one slice); CPU time counts only the work done.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Contender:
    """A timed call `fn` (per-call seconds = one call, or `calls` back-to-back calls / calls);
    `before` runs untimed ahead of each timed run (e.g. torch.set_num_threads)."""

    fn: Callable[[], object]
    calls: int = 1
    before: Callable[[], object] | None = None


@dataclass(frozen=True)
class Ratio:
    median: float
    low: float
    high: float

    def __format__(self, spec: str) -> str:
        spec = spec or ".2f"
        return f"{format(self.median, spec)} [{format(self.low, spec)}–{format(self.high, spec)}]"


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _timed(c: Contender, sync: Callable[[], object] | None, clock: Callable[[], float]) -> float:
    if c.before is not None:
        c.before()
    if sync is not None:
        sync()
    start = clock()
    for _ in range(c.calls):
        c.fn()
    if sync is not None:
        sync()
    return (clock() - start) / c.calls


def interleave(contenders: dict[str, Contender | Callable[[], object]], rounds: int, warmup: int = 1,
               sync: Callable[[], object] | None = None,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Per-round seconds per call of every contender, run in a rotating order each round."""
    cs = {k: v if isinstance(v, Contender) else Contender(v) for k, v in contenders.items()}
    names = list(cs)
    for _ in range(warmup):
        for name in names:
            _timed(cs[name], sync, clock)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(_timed(cs[name], sync, clock))
    return times


def ratio(num: list[float], den: list[float]) -> Ratio:
    """Median and range over rounds of num[i] / den[i]."""
    per_round = [a / b for a, b in zip(num, den)]
    return Ratio(statistics.median(per_round), min(per_round), max(per_round))


def median(times: list[float]) -> float:
    return statistics.median(times)

"""SSP's clock table, shared by the engines that carry out ``ops.Clock``.

``finished[k]``: the clocks worker k has finished (its tick is published
only once that clock's pushes are applied); ``live[k]``: k still counts
toward the bound (a worker that ended or died does not). The floor is the
clocks every live worker has finished; worker k may start clock c once
``floor >= c - bound``. A read taken after
the floor is read holds every update of the clocks below it; a gradient's
staleness in clocks is its worker's clock minus that read floor.

``clock_extra`` is what an engine adds to its result for SSP runs:
``clock_staleness_counts`` (gradients by staleness in clocks),
``clock_wait_s`` (seconds each worker waited for the bound, by rank) and
``clocks`` (the clocks each worker finished).
"""
from __future__ import annotations

from collections import Counter

import numpy as np


class ClockTable:
    def __init__(self, workers: int):
        self.finished = np.zeros(workers, dtype=np.int64)
        self.live = np.ones(workers, dtype=bool)

    def floor(self) -> int:
        """Clocks every live worker has finished (a huge number if none is live)."""
        return int(self.finished[self.live].min()) if self.live.any() else 1 << 62

    def allows(self, clock: int, bound: int) -> bool:
        """Whether a worker about to start clock ``clock`` (0-based: the
        clocks it has finished) may start it."""
        return self.floor() >= clock - bound

    def tick(self, rank: int) -> None:
        self.finished[rank] += 1

    def retire(self, rank: int) -> None:
        self.live[rank] = False


def clock_extra(staleness: Counter, waits: dict, clocks: dict, workers: int) -> dict:
    """The result's SSP fields from the workers' reports (by rank; a worker
    that died without reporting shows 0)."""
    ranks = range(workers)
    return {"clock_staleness_counts": {int(k): int(v) for k, v in sorted(staleness.items())},
            "clock_wait_s": [float(waits.get(r, 0.0)) for r in ranks],
            "clocks": [int(clocks.get(r, 0)) for r in ranks]}

"""SSP's clock table, shared by the engines that carry out ``ops.Clock``.

``finished[k]``: the clocks worker k has finished (its tick is published
only once that clock's pushes are applied); ``live[k]``: k still counts
toward the bound (a worker that ended or died does not). The floor is the
clocks every live worker has finished; worker k may start clock c once
``floor >= c - bound``. A read taken after
the floor is read holds every update of the clocks below it; a gradient's
staleness in clocks is its worker's clock minus that read floor.

``Pace`` is async's looser bound: no worker leads the slowest live one by
more than ``PACE_SHARE`` of its run, so none trains the run's end alone.

``clock_extra`` is what an engine adds to its result for SSP runs:
``clock_staleness_counts`` (gradients by staleness in clocks),
``clock_wait_s`` (seconds each worker waited for the bound, by rank) and
``clocks`` (the clocks each worker finished).
"""
from __future__ import annotations

import time
from collections import Counter

import numpy as np

from ..strategies.ops import Clock, Fetch, Gradient


NOBODY = 1 << 62  # the floor when no worker is live: no bound holds anyone back


def clock_floor(finished, live) -> int:
    """Clocks every live worker has finished: ``finished[k]`` worker k's,
    ``live[k]`` whether it still counts (NOBODY if none does)."""
    return int(finished[live].min()) if live.any() else NOBODY


class ClockTable:
    def __init__(self, workers: int):
        self.finished = np.zeros(workers, dtype=np.int64)
        self.live = np.ones(workers, dtype=bool)

    def floor(self) -> int:
        """Clocks every live worker has finished (a huge number if none is live)."""
        return clock_floor(self.finished, self.live)

    def allows(self, clock: int, bound: int) -> bool:
        """Whether a worker about to start clock ``clock`` (0-based: the
        clocks it has finished) may start it."""
        return self.floor() >= clock - bound

    def tick(self, rank: int) -> None:
        self.finished[rank] += 1

    def retire(self, rank: int) -> None:
        self.live[rank] = False

    def too_long(self, rank: int, clock: int, bound: int, timeout: float) -> str:
        """Why worker ``rank``'s wait to start clock ``clock`` ran past
        ``timeout``: the live workers that held it back."""
        slow = [r for r in range(len(self.live)) if self.live[r]
                and self.finished[r] < clock - bound]
        return (f"worker {rank} waited {timeout:g} s for workers {slow[:8]} to finish clock "
                f"{clock - bound - 1} (staleness bound {bound}); raise --timeout if clocks are "
                "genuinely that slow")


def clock_extra(staleness: Counter, waits: dict, clocks: dict, workers: int) -> dict:
    """The result's SSP fields from the workers' reports (by rank; a worker
    that died without reporting shows 0)."""
    ranks = range(workers)
    return {"clock_staleness_counts": {int(k): int(v) for k, v in sorted(staleness.items())},
            "clock_wait_s": [float(waits.get(r, 0.0)) for r in ranks],
            "clocks": [int(clocks.get(r, 0)) for r in ranks]}


class WorkerClock:
    """One worker's side of SSP around its engine's ``Fetch`` and
    ``Gradient`` handlers: a Fetch reads the floor before it copies (the
    copy then holds those clocks), and every Gradient counts its staleness
    in clocks against that floor; a ``Clock`` counts the clock finished
    (``tick``). An engine gives ``floor`` (how it reads the table) and
    ``publish`` (how it publishes a tick and waits for the bound), which
    adds its waits to ``wait_s`` (``timed``, where they take real time)."""

    def __init__(self, fetch, gradient):
        self.clock = 0         # clocks this worker has finished
        self.read_floor = 0    # the floor at its last read
        self.wait_s = 0.0
        self.staleness = Counter()
        self._fetch, self._gradient = fetch, gradient

    def install(self, handlers: dict) -> "WorkerClock":
        handlers.update({Clock: self.tick, Fetch: self.fetch, Gradient: self.gradient})
        return self

    def floor(self) -> int:
        raise NotImplementedError

    def tick(self, op: Clock) -> int:
        """A Clock: one more clock finished, then published (``publish``);
        returns the floor the engine's wait ends on (or ``WAIT``)."""
        self.clock += 1
        return self.publish(op.bound)

    def publish(self, bound: int) -> int:
        """The engine's: ``clock`` made known to the table; returns once the
        staleness ``bound`` allows the next clock, with the floor."""
        raise NotImplementedError

    def timed(self, wait):
        """``wait()``'s result, the seconds it took added to ``wait_s``."""
        start = time.monotonic()
        out = wait()
        self.wait_s += time.monotonic() - start
        return out

    def fetch(self, op):
        self.read_floor = self.floor()  # before the copy: the copy holds these clocks
        return self._fetch(op)

    def gradient(self, op):
        self.staleness[self.clock - self.read_floor] += 1
        return self._gradient(op)

    def report(self) -> dict:
        return {"staleness": dict(self.staleness), "wait_s": self.wait_s, "clocks": self.clock}


PACE_SHARE = 0.02  # how far (a share of its own run) a worker may lead the slowest live one
PACE_PATIENCE_S = 10.0  # the longest a worker waits for one that holds it back (at most timeout / 2)


class Pace:
    """Async workers kept within ``PACE_SHARE`` of their runs of each other.

    Each worker has its own share of the run (its shard's epochs); the run
    ends when the last share is done. A worker that runs ahead ends first,
    and the others then train on alone, their shards' rows the model's last
    updates (a cold executor that starts late, or one slowed by a busy
    host, leaves the model biased toward the other's shard). With every
    worker's progress as a share of its own budget, worker k may start its
    next exchange period while it leads the slowest live worker by less than
    ``lead[k]``: ``PACE_SHARE`` of its steps, at least one period. The wait
    costs no wall time when the shares are fixed: the run lasts as long as
    its slowest worker either way. Only a worker that has started counts
    (``join``); one that ends, fails or times out is retired and holds no
    one back. A worker that holds another back for ``PACE_PATIENCE_S`` is
    dropped from the pace (``dropped``): an executor lost mid-segment is
    noticed only when Spark runs its task again, and the retry may need the
    very slot the waiting worker's task holds. SSP's clocks bound the lead
    tighter."""

    def __init__(self, totals: list, period: int, share: float = PACE_SHARE):
        self.totals = [max(1, int(t)) for t in totals]
        self.done = [0] * len(self.totals)
        self.live = [False] * len(self.totals)
        self.dropped: set = set()
        self.lead = [max(float(period), share * t) for t in self.totals]

    def advance(self, rank: int, steps: int) -> None:
        self.done[rank] += steps

    def join(self, rank: int) -> None:
        self.live[rank] = rank not in self.dropped

    def drop_behind(self, rank: int) -> None:
        """The workers holding ``rank`` back no longer set the pace."""
        for j in self.behind(rank):
            self.dropped.add(j)
            self.live[j] = False

    def retire(self, rank: int) -> None:
        self.live[rank] = False

    def behind(self, rank: int) -> list:
        """The live workers that hold ``rank`` back now."""
        ahead = self.done[rank] / self.totals[rank]
        return [j for j, live in enumerate(self.live) if live and j != rank and
                (ahead - self.done[j] / self.totals[j]) * self.totals[rank] >= self.lead[rank]]

    def allows(self, rank: int) -> bool:
        return not self.behind(rank)

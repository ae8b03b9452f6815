"""SSP's clock (``ops.Clock``) on the local engine, in shared memory.

``store.clocks[k]``: the clocks worker k has finished, written by k alone,
after its pushes of that clock are applied (a local push is applied, under
the shard locks, before it returns). Workers whose status is past RUNNING
(done, failed, aborted; the monitor marks a dead process failed) do not
count toward the bound. A tick the bound forbids waits lock-free on the
counters (``waiting.wait_until``, the run's timeout); the ``Fetch`` after it
takes each shard's lock, which orders its copy after the ticks it saw.
A ``Fetch`` takes the clock floor before copying; every ``Gradient``
records its staleness in clocks against that floor.
"""
from __future__ import annotations

from ...server.clocks import WorkerClock, clock_floor
from ...monitor.waiting import wait_until
from .store import RUNNING


class LocalClocks(WorkerClock):
    def __init__(self, runtime):
        super().__init__(runtime.fetch, runtime.gradient)
        self.runtime = runtime
        self.store = runtime.store
        self.rank = runtime.rank

    def floor(self) -> int:
        """Clocks every live worker has finished."""
        return clock_floor(self.store.clocks, self.store.status <= RUNNING)

    def publish(self, bound: int) -> int:
        self.store.clocks[self.rank] = self.clock  # after this clock's pushes
        need = self.clock - bound
        if self.floor() < need:
            rt = self.runtime
            self.timed(lambda: wait_until(
                lambda: self.floor() >= need, rt.timeout, lambda: self.store.control[1],
                f"every worker to finish clock {need - 1} (staleness bound {bound})",
                spin=rt._spin, hot_turns=rt._hot_turns))
        return self.floor()

"""SSP's clock (``ops.Clock``) on the sim engine, in virtual time.

A worker's tick is published when the last shard has applied its pushes of
that clock (a tick owed while a push is in flight waits for it). A worker
whose next clock the bound forbids waits in ``waiting``; every published
tick, and every worker that ends, releases the waiters the bound now allows,
each resuming one message later (the clock server's reply). A clock the
bound allows at once costs no virtual time and no event, so with a bound
the run never reaches, the run is async's event for event.
Each worker's side is the shared ``WorkerClock`` (``server/clocks.py``): a
``Fetch`` takes the clock floor when it is sent (its shards serve it later,
so it holds at least those clocks); every ``Gradient`` records its
staleness in clocks against the read its parameters came from.
"""
from __future__ import annotations

import numpy as np

from ...strategies.ops import Fetch, Gradient
from ...server.clocks import ClockTable, WorkerClock
from ...server.worker import WAIT
from ...monitor.tally import clock_fields
from .delays import REQUEST_BYTES


class SimClocks:
    def __init__(self, engine):
        self.engine = engine
        W = engine.W
        self.table = ClockTable(W)
        self.in_flight = np.zeros(W, dtype=np.int64)   # its pushes not yet fully applied
        self.owed = np.zeros(W, dtype=np.int64)        # ticks waiting for those pushes
        self.waiting: dict[int, tuple] = {}            # rank -> (worker, bound, since)

    def join(self, w) -> "_Clock":
        """Worker ``w``'s clock, installed in its handlers."""
        return _Clock(self, w).install(w.handlers)

    def tick(self, w, bound: int) -> int:
        r, clock = w.rank, w.ssp
        if self.in_flight[r]:
            self.owed[r] += 1
        else:
            self.table.tick(r)
            self._release()
        if self.table.allows(clock.clock, bound):
            return self.table.floor()
        self.waiting[r] = (w, bound, self.engine.now)
        return WAIT

    # -- the engine's hooks ----------------------------------------------------
    def pushing(self, rank: int) -> None:
        self.in_flight[rank] += 1

    def pushed(self, rank: int) -> None:
        self.in_flight[rank] -= 1
        if self.in_flight[rank] == 0 and self.owed[rank]:
            self.table.finished[rank] += self.owed[rank]
            self.owed[rank] = 0
            self._release()

    def retire(self, w) -> None:
        self.table.retire(w.rank)
        self._release()

    def _release(self) -> None:
        if not self.waiting:
            return
        e = self.engine
        floor = self.table.floor()
        for r in sorted(self.waiting):
            w, bound, since = self.waiting[r]
            if self.table.allows(w.ssp.clock, bound):
                del self.waiting[r]
                w.ssp.wait_s += e.now - since
                e._at(e.now + e._message(REQUEST_BYTES), e._resume, w, floor)

    def extra(self) -> dict:
        return clock_fields({w.rank: w.ssp.report() for w in self.engine.workers}, self.engine.W)


class _Clock(WorkerClock):
    """A virtual worker's side: the floor is the engine's table; a tick
    publishes (or owes) and may wait in virtual time (``SimClocks.tick``)."""

    def __init__(self, clocks: SimClocks, w):
        super().__init__(w.handlers[Fetch], w.handlers[Gradient])
        self.clocks, self.w = clocks, w

    def floor(self) -> int:
        return self.clocks.table.floor()

    def publish(self, bound: int) -> int:
        return self.clocks.tick(self.w, bound)

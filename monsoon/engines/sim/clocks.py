"""SSP's clock (``ops.Clock``) on the sim engine, in virtual time.

A worker's tick is published when the last shard has applied its pushes of
that clock (a tick owed while a push is in flight waits for it). A worker
whose next clock the bound forbids waits in ``waiting``; every published
tick, and every worker that ends, releases the waiters the bound now allows,
each resuming one message later (the clock server's reply). A clock the
bound allows at once costs no virtual time and no event, so with a bound
the run never reaches, the run is async's event for event.
A ``Fetch`` takes the clock floor when it is sent (its shards serve it
later, so it holds at least those clocks); every ``Gradient`` records its
staleness in clocks against the read its parameters came from.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from ...strategies.ops import Clock, Fetch, Gradient
from ...server.clocks import ClockTable, clock_extra
from ...server.worker import WAIT

REQUEST_BYTES = 64


class SimClocks:
    def __init__(self, engine):
        self.engine = engine
        W = engine.W
        self.table = ClockTable(W)
        self.clock = np.zeros(W, dtype=np.int64)       # ticks each worker asked for
        self.read_floor = np.zeros(W, dtype=np.int64)  # the floor at its last read
        self.in_flight = np.zeros(W, dtype=np.int64)   # its pushes not yet fully applied
        self.owed = np.zeros(W, dtype=np.int64)        # ticks waiting for those pushes
        self.wait_s = np.zeros(W)
        self.waiting: dict[int, tuple] = {}            # rank -> (worker, bound, since)
        self.staleness = Counter()
        self._fetch = engine.handlers[Fetch]
        self._gradient = engine.handlers[Gradient]

    def install(self, handlers: dict) -> "SimClocks":
        handlers.update({Clock: self.tick, Fetch: self.fetch, Gradient: self.gradient})
        return self

    # -- ops ---------------------------------------------------------------------
    def fetch(self, w, op):
        self.read_floor[w.rank] = self.table.floor()
        return self._fetch(w, op)

    def gradient(self, w, op):
        self.staleness[int(self.clock[w.rank] - self.read_floor[w.rank])] += 1
        return self._gradient(w, op)

    def tick(self, w, op: Clock):
        r = w.rank
        self.clock[r] += 1
        if self.in_flight[r]:
            self.owed[r] += 1
        else:
            self.table.tick(r)
            self._release()
        if self.table.allows(int(self.clock[r]), op.bound):
            return self.table.floor()
        self.waiting[r] = (w, op.bound, self.engine.now)
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
            if self.table.allows(int(self.clock[r]), bound):
                del self.waiting[r]
                self.wait_s[r] += e.now - since
                e._at(e.now + e._message(REQUEST_BYTES), e._resume, w, floor)

    def extra(self) -> dict:
        return clock_extra(self.staleness, dict(enumerate(self.wait_s.tolist())),
                           dict(enumerate(self.clock.tolist())), len(self.clock))

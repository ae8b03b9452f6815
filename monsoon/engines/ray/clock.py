"""SSP's clock server for the Ray engine (a threaded Ray actor).

It holds the clock table (``server/clocks.py``). A worker settles its
pushes of a clock (every shard has applied them) before it calls ``tick``,
so a published tick means that clock's updates are in; ``tick`` returns
once the bound allows the worker's next clock (with the floor), or raises
after the run's timeout. ``floor`` is what a worker asks before a fetch.
``retire``: a worker that ended (it says so) or died (the driver says so)
no longer counts, and waiters it held back are released.
"""
from __future__ import annotations

import threading

from ...server.clocks import ClockTable


class ClockServer:
    def __init__(self, workers: int, timeout: float):
        self.table = ClockTable(workers)
        self.timeout = timeout
        self.cond = threading.Condition()

    def floor(self) -> int:
        with self.cond:
            return self.table.floor()

    def tick(self, rank: int, bound: int) -> int:
        with self.cond:
            self.table.tick(rank)
            self.cond.notify_all()
            clock = int(self.table.finished[rank])
            ok = self.cond.wait_for(lambda: self.table.allows(clock, bound), self.timeout)
            if not ok:
                raise TimeoutError(self.table.too_long(rank, clock, bound, self.timeout))
            return self.table.floor()

    def retire(self, rank: int) -> None:
        with self.cond:
            self.table.retire(rank)
            self.cond.notify_all()

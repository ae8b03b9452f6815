"""Stale Synchronous Parallel: Downpour with a bounded clock (Ho et al., NIPS 2013).

Petuum's SSP (Bösen; Angel's BSP/SSP/ASP switch). Every worker keeps a clock
that ticks once per push period (``n_push`` steps). Worker loop:

    every n_fetch steps, or when the copy held no longer meets the bound:
        w_local = fetch()
    g = gradient(w_local, next mini-batch); accrued += g
    every n_push steps:  push(accrued);  clock()   # the tick; may wait

The clock rule: a worker may start clock c only once every live worker has
finished clock c - S - 1, and a read after that holds every update of those
clocks (an engine publishes a worker's tick only after that clock's pushes
are applied, and takes a read's clock floor before copying). So S = 0 is
bulk-synchronous (a barrier per clock), S = infinity is Downpour (``async``),
and between them stragglers are tolerated up to S clocks.

Invariants (each has a test, ``tests/test_ssp.py``): every gradient's
staleness in clocks (its clock minus the clocks every live worker had
finished at its read) is at most S, and 0 for S = 0; with S at least the
steps of the run, the ops (and on the sim engine the run, bit for bit) are
async's. A worker that ends or dies stops counting toward the bound: a dead
straggler cannot freeze the run (it is named in ``failed_workers``). Every
wait for the bound has the run's timeout. The server, shards, n_fetch,
n_push and every rule (adarevision, dcasgd, --staleness-lr) are async's.
Where a bound pays: docs/ssp.md, from bench/ssp_sweep.py.
"""
from ..errors import ConfigError
from ..options import Option, at_least
from .downpour import Downpour
from .ops import Clock, Fetch, Gradient, LocalStep, Push


class SSP(Downpour):
    name = "ssp"
    uses = (Fetch, Gradient, Push, LocalStep, Clock)
    options = Downpour.options + (
        Option("staleness_bound", int, 3, "SSP: clocks (push periods) a worker may run ahead "
               "of the slowest live worker (0: bulk-synchronous)", check=at_least(0)),)

    @classmethod
    def from_options(cls, run, rule, n_fetch=1, n_push=1, staleness_bound=3):
        return cls(staleness_bound, n_fetch, n_push,
                   local_lr=run.lr if n_fetch > 1 else 0.0), rule

    def __init__(self, staleness_bound: int = 3, n_fetch: int = 1, n_push: int = 1,
                 local_lr: float = 0.0):
        super().__init__(n_fetch, n_push, local_lr)
        if isinstance(staleness_bound, bool) or int(staleness_bound) != staleness_bound \
                or staleness_bound < 0:
            raise ConfigError(f"the staleness bound must be a whole number >= 0 (got "
                              f"{staleness_bound!r}); e.g. --staleness-bound 2")
        self.bound = int(staleness_bound)

    # The worker loop is Downpour's (``downpour.Downpour.program``); SSP adds
    # the tick after each push, and the reads the bound asks for.
    def _exchange_state(self):
        # clocks this worker has finished; clocks every live worker had
        # finished as the last tick returned; that floor at the last read
        return {"clock": 0, "floor": 0, "held": 0}

    def _fetched(self, ex) -> None:
        ex["held"] = ex["floor"]

    def _pushed(self, ex):
        ex["floor"] = yield Clock(self.bound)
        ex["clock"] += 1
        # the next clock's reads must hold every clock <= clock - bound - 1
        return ex["clock"] - ex["held"] > self.bound

    def describe(self):
        return {**super().describe(), "strategy": self.name, "staleness_bound": self.bound}

"""A run's tally: its workers' end reports, summed into its ``EngineResult``
(defined here: what every engine returns to ``monsoon.train``).

A local, Ray or torch worker ends by reporting what it did
(``Worker.report``): staleness counts, examples, dropped and late gradients,
its local steps applied and dropped (``local``, ``local_dropped``),
its own parameters and buffers where it keeps them, its traffic
(``Sender.stats``) and SSP's clock report. The local monitor, the Ray driver
and torch's rank 0 gather the reports through their own transports and add
them (``RunTally.add``); the tally sums them, lists the lost workers
(``failed``) and fills summary.json's traffic and clock fields, one way.

A resumed run counts the whole run, not its last attempt: a checkpoint
holds the ``totals`` its writer knows then (staleness counts, reported late
gradients, each rank's traffic and clock report, in its meta:
``run_totals``), the resumed run's tally starts from them (``carry``) and
each report adds to them, rank by rank (``merged``). One written once the
workers have reported (an interrupted run's final one; Ray's, torch's and
a local snapshot's at an end) holds them all. A periodic one (a crashed or killed run's newest)
holds those its attempt carried and those its writer counts itself:
serial's, the local sync workers' (traffic written at each checkpoint
step, staleness one count a step), Spark's async server's, torch's
staleness and traffic; Ray's workers keep theirs until they report: those
restart at its step. The local engine's snapshot ones hold ``from_update``
(``restarted``): counts restart there, the carried ones dropped, so a
resumed run's figures cover one span of updates (per update over those),
said in summary.json (``counted_from_update``); one without counts (an
older monsoon's) counts from its step.

What only the engine knows (the server's updates, counts in shared
memory) it gives to ``result``. Spark's async server and local SGD rounds
add each applied segment's result as its worker's report (its examples and
local steps); the async server's own counts (each worker's sender and SSP
clock report, the server's staleness) added to those it carried
(``RunTally.resumed``) are every checkpoint's totals and its result's.
Spark's driver programs and the simulator apply every update themselves
and count as they go: they use ``failed_list``, ``run_folder_extra`` and
(the simulator's SSP) ``clock_fields``; the driver programs' staleness
(one count a step) follows from a checkpoint's steps, and the simulator
replays its run to the checkpoint, counting all again.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..compressors.messages import summarize
from ..server.clocks import clock_extra


@dataclass
class EngineResult:
    """What an engine returns to ``monsoon.train``."""
    params: np.ndarray
    startup_s: float
    wall_time_s: float
    examples: int
    updates: int
    dropped_updates: int   # in the unit of ``updates``: the server's updates not applied
    staleness: Counter
    failed_workers: list = field(default_factory=list)
    late_gradients: int = 0
    worker_params: dict = field(default_factory=dict)  # private copies (local SGD, EASGD)
    worker_states: dict = field(default_factory=dict)  # each worker's buffers (BatchNorm)
    extra: dict = field(default_factory=dict)          # engine-specific summary fields
    stopped: str | None = None   # why the monitor stopped the run early, if it did
    interrupted: int | None = None   # the signal (SIGTERM, SIGINT) that stopped it
    follower: bool = False   # a rank other than 0 of the torch engine: rank 0 records the run
    # the workers' local steps on their own copies (local SGD, EASGD), applied
    # and dropped (a non-finite gradient), summed over the workers; None where
    # the run takes none
    local_updates: int | None = None
    dropped_local_updates: int | None = None
    # the rows of the batches drawn that no update used (spark: a partition's
    # share too small for a BatchNorm's pass), apart from ``examples``; None
    # where the run cannot leave any out
    examples_left_out: int | None = None


def summed_staleness(reports) -> Counter:
    """The staleness counts (staleness -> updates) of several reports,
    summed, keyed by int (a report's keys may be strings)."""
    staleness = Counter()
    for report in reports:
        staleness.update({int(k): v for k, v in report.get("staleness", {}).items()})
    return staleness


def bytes_sent(traffic: dict) -> int:
    """The bytes sent in ``traffic`` (rank -> ``Sender.stats``): summary.json's
    ``bytes_sent`` where it is the run's whole traffic."""
    return int(sum(t.get("sent", 0) for t in traffic.values()))


def workers_dropped(figures: dict) -> int:
    """The pushes the workers dropped themselves, from their latest figures
    or reports (by rank): those ``RunTally.add`` counts in ``dropped``, also
    while the workers run (their progress)."""
    return sum(f.get("dropped", 0) for f in figures.values())


def clock_fields(reports: dict, workers: int) -> dict:
    """SSP's result fields (``clocks.clock_extra``) from the workers' clock
    reports (``WorkerClock.report``), by rank."""
    return clock_extra(summed_staleness(reports.values()),
                       {r: c["wait_s"] for r, c in reports.items()},
                       {r: c["clocks"] for r, c in reports.items()}, workers)


def merged(kept: dict | None, report: dict) -> dict:
    """One rank's traffic (``Sender.stats``) or SSP clock report
    (``clocks``, ``wait_s``, ``staleness``) after ``report`` is added to
    what it held (``kept``, None: nothing): counts, bytes and waits sum,
    the residual's norm is the newest (the resumed sender carries its
    residual on). Also a worker's figures (``RemoteWorker.progress``):
    its traffic and clock report merged so, None where it has none."""
    if not kept:
        return dict(report)
    out = dict(kept)
    for key, value in report.items():
        if key == "residual_norm":
            out[key] = value
        elif key == "staleness":
            out[key] = dict(summed_staleness([kept, report]))
        elif value is None or isinstance(value, dict):
            out[key] = merged(kept.get(key), value) if value else kept.get(key)
        else:
            out[key] = kept.get(key, 0) + value
    return out


def run_totals(carried: dict | None, reports: dict) -> dict:
    """``RunTally.totals`` of a run that started from ``carried`` (its
    checkpoint's totals; None or empty: zero) and has the ``reports``
    (rank -> report, as ``RunTally.add`` reads them) so far: what a
    checkpoint written now carries to a resumed run."""
    return RunTally.resumed(len(reports), None, carried, reports).totals()


def restarted(updates: int) -> dict:
    """The ``totals`` of a checkpoint written after ``updates`` updates while
    the counts since its attempt began are in the workers: a run resumed
    from it counts from there on, and says so (``counted_from_update``)."""
    return {"from_update": int(updates)} if updates else {}


def counted_from(totals: dict | None, updates: int) -> int:
    """The update from which a run resumed from a checkpoint written after
    ``updates`` updates, with ``totals``, counts staleness and traffic: the
    totals' ``from_update``; the checkpoint's own where it holds no counts
    (none, or an older monsoon's periodic one); else 0 (the whole run)."""
    if totals and (totals.get("from_update") or totals.get("staleness")
                   or totals.get("traffic")):
        return int(totals.get("from_update", 0))
    return int(updates)


def local_totals(strategy, applied: int, dropped: int, own_steps: bool = False):
    """A run's local steps, ``(applied, dropped)``, where its workers take
    any: they have an inner rule (``strategy.local_rule``), or ``own_steps``
    (Spark's delta pushes: each worker's steps of the run's rule); else None
    (the result then has no local fields)."""
    return (applied, dropped) if strategy.local_rule is not None or own_steps else None


def failed_list(failed: dict) -> list:
    """``failed_workers`` from ``{rank: reason}``: the error is the reason's
    first line (the whole of a one-line reason), the traceback all of it."""
    return [{"worker": r, "error": failed[r].splitlines()[0], "traceback": failed[r]}
            for r in sorted(failed)]


def run_folder_extra(checkpoint=None, resumed_from=None) -> dict:
    """The run's newest checkpoint and the one it resumed from, where there is one."""
    return {**({"checkpoint": str(checkpoint)} if checkpoint else {}),
            **({"resumed_from": str(resumed_from)} if resumed_from else {})}


class RunTally:
    """The reports of a run of ``workers`` workers. ``ssp``: the run has
    SSP's clock, so its result has the clock fields even where no worker
    reported (else only where one did). Not thread-safe: where several
    threads add (Spark's driver threads), they add under their lock."""

    def __init__(self, workers: int, compression, ssp: bool = False):
        self.workers, self.compression, self.ssp = workers, compression, ssp
        self.staleness = Counter()
        self.examples = self.dropped = self.late = 0
        self.local = self.local_dropped = 0  # local steps, applied and dropped
        self.params, self.states, self.traffic, self.clocks = {}, {}, {}, {}
        self.failed: dict[int, str] = {}  # rank -> why it was lost
        self.from_update = 0  # the counts hold the updates from this one on (0: all)

    @classmethod
    def resumed(cls, workers: int, compression, carried: dict | None,
                reports: dict | None = None, ssp: bool = False) -> "RunTally":
        """The tally of a run that started from ``carried`` (its checkpoint's
        ``totals``; None or empty: zero), the ``reports`` (rank -> report)
        added."""
        tally = cls(workers, compression, ssp)
        tally.carry(carried)
        for rank, report in (reports or {}).items():
            tally.add(rank, report)
        return tally

    def add(self, rank: int, report: dict) -> None:
        """Worker ``rank``'s report: any of ``staleness``, ``examples``,
        ``dropped``, ``late``, ``local``, ``local_dropped``, ``params``
        (None: no copy of its own), ``state``, ``traffic`` and ``clocks``
        (empty or None: none)."""
        self.staleness.update(summed_staleness([report]))
        self.examples += report.get("examples", 0)
        self.dropped += report.get("dropped", 0)
        self.late += report.get("late", 0)
        self.local += report.get("local", 0)
        self.local_dropped += report.get("local_dropped", 0)
        if report.get("params") is not None:
            self.params[rank] = report["params"]
        if report.get("state"):
            self.states[rank] = report["state"]
        for key, kept in (("traffic", self.traffic), ("clocks", self.clocks)):
            if report.get(key):
                kept[rank] = merged(kept.get(rank), report[key])

    def carry(self, totals: dict | None) -> None:
        """Start from a checkpoint's ``totals`` (what ``totals`` returned in
        the run that wrote it; None or empty: from zero)."""
        if not totals:
            return
        self.from_update = int(totals.get("from_update", 0))
        self.staleness.update(summed_staleness([totals]))
        self.late += totals.get("late", 0)
        for key, kept in (("traffic", self.traffic), ("clocks", self.clocks)):
            for rank, figures in totals.get(key, {}).items():
                kept[int(rank)] = merged(kept.get(int(rank)), figures)

    def totals(self) -> dict:
        """The counts so far that a checkpoint carries to a resumed run, as
        JSON (``carry`` reads them back)."""
        def plain(figures: dict) -> dict:
            return {k: ({str(s): int(n) for s, n in v.items()} if isinstance(v, dict)
                        else v.item() if hasattr(v, "item") else v)
                    for k, v in figures.items()}

        return {"staleness": plain(self.staleness), **({"late": self.late} if self.late else {}),
                **({"from_update": self.from_update} if self.from_update else {}),
                "traffic": {str(r): plain(t) for r, t in sorted(self.traffic.items())},
                "clocks": {str(r): plain(c) for r, c in sorted(self.clocks.items())}}

    def extra(self, updates: int) -> dict:
        """summary.json's traffic fields (``messages.summarize``, by rank:
        per update over the updates counted) and, for SSP, its clock fields
        (``clocks.clock_extra``); ``counted_from_update`` where the counts
        restarted at a checkpoint (``from_update``)."""
        extra = summarize([self.traffic[r] for r in sorted(self.traffic)], self.compression,
                          updates - self.from_update)
        if self.from_update:
            extra["counted_from_update"] = self.from_update
        if self.ssp or self.clocks:
            extra.update(clock_fields(self.clocks, self.workers))
        return extra

    def result(self, params, startup: float, wall: float, examples: int, updates: int,
               dropped: int, extra: dict, staleness: Counter | None = None,
               late: int | None = None, local: tuple[int, int] | None = None,
               **fields) -> EngineResult:
        """The run's result: the engine's figures, and the reports' staleness
        (unless ``staleness``), late gradients (unless ``late``), local steps
        (``local``: (applied, dropped), where the run takes any; None: none),
        lost workers and private copies; ``fields``: ``stopped``,
        ``interrupted``."""
        return EngineResult(params, startup, wall, examples, updates, dropped,
                            self.staleness if staleness is None else staleness,
                            failed_list(self.failed),
                            late_gradients=self.late if late is None else late,
                            worker_params=self.params, worker_states=self.states, extra=extra,
                            local_updates=None if local is None else int(local[0]),
                            dropped_local_updates=None if local is None else int(local[1]),
                            **fields)

    def local_totals(self, strategy, own_steps: bool = False) -> tuple[int, int] | None:
        """The reports' local steps, (applied, dropped), where ``strategy``
        takes any (its workers have an inner rule, or ``own_steps``: see
        ``local_totals``); else None."""
        return local_totals(strategy, self.local, self.local_dropped, own_steps)

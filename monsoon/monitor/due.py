"""What a run's monitor must do next: one object asked by every loop that
watches a run (the local engine's inline loop and worker monitor, Ray's
driver, Spark's driver and server, a torch rank, the pipeline runners).

It answers five questions, each cheap enough to ask between ops:

- a curve row: ``row`` (the recorder's pace: evaluations over the budget),
  and ``seconds_to_row`` for how long a monitor may sleep without missing one;
  ``asked_row`` where the workers copy the parameters for a row when asked
  (``asking`` while a copy is awaited);
- a live update: ``live`` hands the recorder the run's figures when its
  live writer is due (and, ``final``, once the run's loop has ended);
  ``look`` asks both (a row, then a live update) for the loops that take
  no other action between them;
- a checkpoint: every ``every`` positions (steps, updates or epochs, as the
  caller counts them), ``plan_checkpoint`` sets the next one after a
  position, ``checkpoint`` says whether it is reached;
- the no-progress timeout: ``progress`` raises ``WaitTimeout`` when the
  example count has not moved for twice ``timeout`` seconds (a backstop:
  a stuck barrier reports itself after ``timeout``);
- a signal stop (SIGTERM/SIGINT, ``lifecycle.StopSignals``): ``signal`` is
  true once, the first time a stop is seen; ``interrupted`` keeps the signal
  (``stops``: ``look`` returns it as the reason to stop, for the loops that
  stop at their next boundary).

The caller decides what to do about each (write which checkpoint, stop the
workers how); this object only keeps the schedule, so that the paths agree
on when. ``StepTally`` asks it for the loops that run whole steps one
after another (the sim's and Ray's pipeline drivers): after each step a
row where one is due, then a stop at that step boundary.
"""
from __future__ import annotations

import time

from ..errors import WaitTimeout
from ..record.checkpoints import next_checkpoint
from .lifecycle import stop_reason, stop_requested


def local_counts(local) -> tuple[int, int] | None:
    """The workers' local steps as ints, (applied, dropped); None: none taken."""
    return None if local is None else (int(local[0]), int(local[1]))


class Due:
    """The schedule of one run: ``recorder`` (``record.Recorder``) paces
    rows and live updates, ``every`` positions between checkpoints (0:
    none), ``timeout`` the run's wait limit (None: no progress backstop);
    ``stops``: a stop signal is a reason to stop that ``look`` returns."""

    def __init__(self, recorder, every: int = 0, timeout: float | None = None,
                 stops: bool = False):
        self.recorder, self.every, self.timeout = recorder, every, timeout
        self.stops = stops
        self.next_checkpoint: int | None = None
        self.interrupted: int | None = None   # the stop signal, once seen
        self.asking = False  # a copy of the parameters asked of the workers (``asked_row``)
        self.last_examples, self.last_progress = -1, time.monotonic()

    # -- curve rows and live updates -----------------------------------------
    def row(self, at: float, examples) -> bool:
        """Whether the next curve row is due at run time ``at``."""
        return self.recorder.due(at, examples)

    def asked_row(self, at: float, examples, served, ask) -> bool:
        """For the loops whose workers copy the parameters for a row at
        their next step's end (the local engine's replicated synchronous
        step, its pipeline's stages): True once the copy asked for is
        ``served()`` (record it now); else, when a row is due, ``ask()`` for one."""
        if self.asking:
            self.asking = not served()
            return not self.asking
        if self.row(at, examples):
            self.asking = True
            ask()
        return False

    def seconds_to_row(self, at: float, clock_only: bool = False) -> float:
        """How long until the next row is due, at the pace so far;
        ``clock_only``: by the clock alone, where the rows that the example
        count makes due come without the monitor (a snapshot ring)."""
        return self.recorder.seconds_to_due(at, 0 if clock_only else self.last_examples)

    def live(self, at: float, totals, figures, final: bool = False) -> bool:
        """Hand the recorder a live update if one is due (True if so):
        ``totals()`` gives (examples, updates, dropped, ...), ``figures()``
        the workers' figures and staleness (and the bytes they have sent,
        where the engine counts them as they go); both are read only then.
        ``final``: the run's last row, due or not (its loop has ended: the
        run's final counts, and the losses since the last row)."""
        if not self.recorder.live_due(at, final):
            return False
        ex, up, dropped = totals()[:3]
        workers, stale, *sent = figures()
        self.recorder.live(at, ex, up, workers, stale, int(dropped), *sent)
        return True

    def look(self, at: float, examples, snapshot, totals=None, figures=None) -> str | None:
        """Record a curve row if one is due, else (or after it) hand a live
        update if one is due (``totals`` and ``figures`` as for ``live``;
        none given: no live series). ``snapshot()`` gives (params, updates,
        dropped), read together, only when a row is due, and where the
        workers take local steps, their (applied, dropped) counts after them
        (``Recorder.record``'s ``local``; None: none), and where updates
        land while the monitor looks (a server's threads), the examples of
        those updates, read with them (the row's; else ``examples``), and
        then the rows the steps left out by then (``Recorder.record``'s
        ``left_out``: spark's; else none). Returns
        the row's reason to stop (a divergence, the target; with ``stops``,
        a stop signal), or None. A row due at a stop signal is recorded
        first: the divergence it shows is the reason, never the signal (an
        interrupted run's checkpoint would hold the non-finite model)."""
        if self.row(at, examples):
            params, updates, dropped, *rest = snapshot()
            local = local_counts(rest[0] if rest else None)
            if len(rest) > 1:
                examples = rest[1]
            extra = {"local": local} if local is not None else {}
            if len(rest) > 2 and rest[2]:
                extra["left_out"] = int(rest[2])
            reason = self.recorder.record(at, int(updates), int(examples), params, int(dropped),
                                          **extra)
            if reason is not None:
                return reason
        if self.stops and (self.signal() or self.interrupted is not None):
            return self.stop_reason
        if figures is not None:
            self.live(at, totals, figures)
        return None

    # -- checkpoints ---------------------------------------------------------
    def plan_checkpoint(self, position: int) -> None:
        """The next checkpoint is at the first multiple of ``every`` after
        ``position``."""
        self.next_checkpoint = next_checkpoint(position, self.every)

    def checkpoint(self, position: int, margin: int = 0) -> bool:
        """Whether ``position`` (plus ``margin``) has reached the next checkpoint."""
        return self.next_checkpoint is not None and position + margin >= self.next_checkpoint

    # -- progress and stop signals -------------------------------------------
    def progress(self, examples, message: str | None = None) -> None:
        """Note the example count; raise ``WaitTimeout`` if it has not moved
        for twice ``timeout`` seconds (never once a stop signal is seen)."""
        if examples != self.last_examples or self.interrupted is not None:
            self.last_examples, self.last_progress = examples, time.monotonic()
        elif time.monotonic() - self.last_progress > 2 * self.timeout:
            raise WaitTimeout(message or (
                f"no worker made progress for {2 * self.timeout:g} s; "
                "raise --timeout if steps are genuinely that slow"))

    def signal(self) -> bool:
        """True the first time a stop signal is seen (kept in ``interrupted``)."""
        sig = stop_requested()
        if sig and self.interrupted is None:
            self.interrupted = sig
            return True
        return False

    @property
    def stop_reason(self) -> str:
        """Why the run stopped, for the result: the signal's name."""
        return stop_reason(self.interrupted)


class StepTally:
    """The steps finished by a driver that runs whole steps one after
    another (a pipeline's: each one batch that every stage ran): the
    examples, the steps and those dropped, as the curve's rows count them
    (a pipeline's result counts its own from the stages' figures,
    ``pipeline.runner.finish``). ``done`` counts a step, records a row where
    one is due, and then says whether the run stops at this step boundary:
    on the row's reason (a divergence, the target) or a stop signal
    (SIGTERM/SIGINT, kept in ``interrupted``)."""

    def __init__(self, recorder, w0):
        recorder.start(w0)
        self.due = Due(recorder)
        self.examples = self.steps = self.dropped = 0
        self.stopped: str | None = None

    def count(self, size: int, dropped: bool = False) -> None:
        """One more step of ``size`` examples (``dropped``: not applied)."""
        self.steps, self.examples = self.steps + 1, self.examples + size
        self.dropped += bool(dropped)

    def done(self, now: float, size: int, dropped: bool, params) -> bool:
        """A step finished at run time ``now`` (``count``), its row recorded
        if one is due (``params()``: the parameters, read only then);
        whether the run stops here (``stopped`` says why)."""
        self.count(size, dropped)
        self.stopped = self.due.look(now, self.examples, lambda: (
            params(), self.steps - self.dropped, self.dropped))
        if self.stopped is None and self.due.signal():
            self.stopped = self.due.stop_reason
        return self.stopped is not None

    @property
    def interrupted(self) -> int | None:
        """The stop signal, once one was seen."""
        return self.due.interrupted

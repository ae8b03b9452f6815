"""The monitor of a parallel local run (``engine.py``'s module docstring).

``WorkerMonitor`` watches workers that ``LocalEngine`` has started: it
waits until every one is ready, releases them together, and until they
finish collects their reports, names the lost (``failed``), writes
checkpoints (from the workers' step-boundary buffer, or a snapshot of the
shared parameters), records the curve (from worker 0's snapshot ring, which
a replicated synchronous step fills every so many steps and when asked, or
from the shared parameters) and hands the live writer the workers' figures. When each of these is due,
and the no-progress timeout and a stop signal, it asks one ``Due``
(``monitor/due.py``), the object the inline path asks too. A curve row
keeps the workers' model buffers (``problems/buffers.py``) as they are
when the monitor takes it (a ring row: when worker 0 wrote it); a
checkpoint, as ``checkpointing.py`` says. A pushing program's row counts
the pushes shard 0 has applied, their examples and the pushes dropped,
read with the parameters under shard 0's lock (``store.row_copy``): a
worker counts a push's examples before it lands and its update after, so
its own counts could put one push more in a row's examples than in the
updates its parameters hold. Hogwild!'s updates take no lock: its rows
read the workers' counts (an update under way may be in a row's examples
and its parameters, partly, before it is in the row's updates).
"""
from __future__ import annotations

import time

import numpy as np

from ... import arrays
from ...monitor.due import Due
from ...monitor.lifecycle import StopSignals
from ...monitor.pool import fail_if_lost
from ...problems.buffers import combine as combine_buffers, unflat
from ...record import checkpoints, progress
from ...record.progress import DROPPED, EXAMPLES, UPDATES
from ...strategies.ops import Push
from ...monitor.tally import (EngineResult, RunTally, bytes_sent, counted_from, local_totals,
                              restarted)
from .checkpointing import read_buffers, read_senders, read_traffic
from .store import (CKPT_STEP, FAILED, READY, SNAP_ASKED, SNAP_EVERY, SNAP_READ, SNAP_SERVED,
                    SNAP_WRITTEN, START, STEP, STOP)

MAIN_HINT = ("; the problem refers to code in your script, which every worker process "
             "re-runs: put the call to monsoon under `if __name__ == \"__main__\":`, "
             "or use --backend threads")
ROW_LOCK_S = 1.0  # how long a row waits for shard 0's lock before it reads the counts as they are


class WorkerMonitor:
    """One parallel run's monitor, in the calling process, of the started
    workers in ``pool`` (``monitor.pool.WorkerPool``)."""

    def __init__(self, engine, store, pool, problem, strategy, workers,
                 batch_size, recorder, ck, resume):
        self.engine, self.store, self.pool = engine, store, pool
        self.problem, self.strategy, self.workers = problem, strategy, workers
        self.batch_size, self.recorder, self.ck, self.resume = batch_size, recorder, ck, resume
        self.exact = ck.exact
        # the workers' reports, at the end; a resumed run counts on from its checkpoint's
        self.tally = RunTally.resumed(workers, engine.compression, resume.totals)
        self.tally.params.update(resume.private)  # until the workers report their own copies
        self.tally.from_update = counted_from(resume.totals, int(store.totals()[1]))
        self.newest = None  # (updates, dropped) of the newest snapshot checkpoint written
        self.finished, self.failed = pool.finished, pool.failed
        self.startup = None  # seconds until every worker was ready, once they were
        self.wake = StopSignals.active.waitable() if StopSignals.active is not None else None
        self.n = problem.n_examples
        every = ck.every
        if engine.kernel and every:  # positions count epochs: at most one checkpoint per epoch
            every = max(every, self.n)
        self.every = every
        # the monitor snapshots the parameters itself only where the workers
        # do not fill a checkpoint buffer at step boundaries
        self.due = Due(recorder, 0 if self.exact else every, engine.timeout)
        self.stopped = None
        self.stop_deadline = None
        self.paced = None  # (examples, updates, perf_counter) where the examples last moved
        self.ring = False
        # the buffers' names and shapes, where the workers keep them in slots
        self.template = problem.state() if store.buffers is not None else None

    def run(self, t_begin: float, start_timeout: float) -> EngineResult:
        """Watch the workers to the end; whatever goes wrong, they are
        aborted and joined before the error leaves."""
        store, pool = self.store, self.pool
        try:
            self.await_ready(start_timeout)
            self.startup = time.perf_counter() - t_begin
            self.release()
            while len(self.finished) < self.workers:
                self.look()
            wall = time.perf_counter() - self.t0
            totals = store.totals()
            for rank, (_, report) in pool.reports.items():
                self.tally.add(rank, report)
            for rank in sorted(set(self.failed) - set(pool.reports)):  # lost: their counts so far
                self.tally.add(rank, store.lost_report(rank))
            self.tally.failed.update(self.failed)
            self.due.live(self.resume.time_s + wall, lambda: totals,  # the run's last row
                          lambda: self.live_figures(reported=True), final=True)
            params = self.finish(wall, int(totals[1]))
        except BaseException:
            store.abort()
            raise
        finally:
            pool.join(self.join_wait())
        return self.result(params, wall, totals)

    def join_wait(self) -> float:
        """How long the workers get to end before they are killed. One
        that is not stuck ends within a step of the run's end or abort: it
        gets three steps' time (at least 2 s), its steps timed up to the
        run's last progress (this run's updates per worker). Never more than
        ``--timeout`` or 30 s (at least 5 s), which is also the wait before
        any step was timed: a hung worker holds a failed run's message for
        seconds, not for the timeout a second time."""
        cap = max(5.0, min(self.engine.timeout, 30.0))
        if self.paced is None:
            return cap
        _, updates, at = self.paced
        steps = updates - self.updates_at_start
        if steps <= 0:
            return cap
        return min(cap, max(2.0, 3.0 * (at - self.t0) * self.workers / steps))

    # -- the workers' messages and deaths -------------------------------------
    def drain(self, block_s: float = 0.0) -> None:
        """Take the workers' messages (waiting up to ``block_s`` for one, or
        a stop signal). A worker process that died without a last message
        failed: it no longer counts toward an SSP bound, and the survivors
        must not wait on its locks."""
        hint = MAIN_HINT if self.startup is None and self.pool.needs_main else ""
        for rank in self.pool.drain(block_s, self.wake, hint):
            self.store.status[rank] = FAILED
            self.store.release_locks_of(rank)

    def check_failed(self) -> None:
        """Fail the run if it has lost more workers than its strategy allows
        (not once a stop signal is seen: the workers are stopping)."""
        if self.due.interrupted is None:
            fail_if_lost(self.failed, self.strategy, self.workers)

    # -- start-up ------------------------------------------------------------
    def await_ready(self, start_timeout: float) -> None:
        """Wait until every worker has imported, unpickled and is ready (or
        finished: ``WorkerPool.await_ready``), then unlink the shared memory
        every process has mapped. A stop signal meanwhile aborts the workers
        (nothing is done yet), and the wait goes on until each has mapped
        the memory and seen the abort: one that had not would find it gone."""
        store, workers = self.store, self.workers

        def stop():  # stop the workers, then write the folder
            self.stopped = self.due.stop_reason
            store.abort()

        self.pool.await_ready(
            lambda: all(store.status[r] == READY or r in self.finished for r in range(workers)),
            start_timeout, self.due, stop, self.check_failed,
            self.engine._start_advice(workers, start_timeout), drain=self.drain)
        if self.pool.ctx is not None:
            store.memory.unlink()  # every worker has mapped it: the kernel frees it last
            self.problem.unlink_shared()  # the problem's data block, likewise

    def release(self) -> None:
        """Start the curve, and the workers together."""
        store, recorder = self.store, self.recorder
        recorder.start(store.params, self.row_buffers())
        self.ring = store.replicated and store.snap_params is not None
        if self.ring and recorder.total_examples:
            # worker 0 snapshots every so many steps on its own (synchronous.py)
            rows_every = recorder.total_examples / recorder.evals / self.batch_size
            store.control[SNAP_EVERY] = max(1, round(rows_every))
        self.t0 = time.perf_counter()
        self.updates_at_start = int(store.totals()[1])  # a resumed run's count goes on
        self.at_start = store.totals().copy()  # store.landed counts this run's pushes
        store.control[START] = 1
        if self.due.every:
            self.due.plan_checkpoint(int(store.totals()[1]))

    # -- the run -------------------------------------------------------------
    def look(self) -> None:
        """One wake of the monitor: sleep until something is due (or a
        message, a death or a signal comes), then do what is due."""
        store = self.store
        self.drain(self.sleep_s())
        self.on_signal()
        self.check_failed()
        ex, up = store.totals()[:2]
        self.due.progress(ex)
        if self.paced is None or ex != self.paced[0]:
            self.paced = (ex, int(up), time.perf_counter())
        self.checkpoint_if_due(time.perf_counter() - self.t0, up)
        # the row's time and counts are read after the checkpoint, which can
        # take long (it evaluates the curve's rows and writes): the workers
        # went on meanwhile, and a row's copy of the parameters must match them
        at = self.resume.time_s + time.perf_counter() - self.t0
        totals = ex, up, dropped, _ = store.totals()
        reason = self.record_if_due(at, ex, up, dropped)
        # the workers' figures, from shared memory
        self.due.live(at, lambda: totals, self.live_figures)
        if reason is not None:
            self.stopped = reason
            store.abort()

    def live_figures(self, reported: bool = False) -> tuple:
        """The workers' figures for a live row, and the bytes sent: the
        resumed run's and, until the workers have reported theirs
        (``reported``), those each wrote beside its losses."""
        figures, stale = self.store.live_figures(self.workers)
        return figures, stale, bytes_sent(self.tally.traffic) + (
            0 if reported else self.store.sent())

    def sleep_s(self) -> float:
        """How long the monitor may sleep. Poll fast while the run is young
        (short runs still get a curve), then settle, so the monitor steals
        little CPU; with no curve to draw, sleep until a worker reports or
        dies. Sleep until the next row is due (a worker's message or death
        wakes the monitor sooner): every wake-up preempts a worker, and its
        peers then wait for it at the barrier. With a snapshot ring, wake in
        time to read it before it fills, and for the rows the clock makes
        due: those of the example count, worker 0 copies on its own."""
        store, elapsed = self.store, time.perf_counter() - self.t0
        due_in = self.due.seconds_to_row(self.resume.time_s + elapsed,
                                         clock_only=self.ring and bool(store.control[SNAP_EVERY]))
        if self.ring:
            written = int(store.control[SNAP_WRITTEN])
            due_in = min(due_in, len(store.snap_params) / 2 * elapsed / written
                         if written else 0.05)
        if self.every:  # and for the next checkpoint, at the pace so far
            done = int(store.totals()[1])
            if done > self.updates_at_start:
                due_in = min(due_in, (self.every - done % self.every) * elapsed
                             / (done - self.updates_at_start))
        young = self.due.last_examples <= 0 and not self.ring  # no pace known yet
        return 0.002 if young or self.due.asking or self.buffer_filled() else min(max(due_in, 0.001), self.engine.idle_s)

    def on_signal(self) -> None:
        """A stop signal stops the workers: synchronous ones at the next step
        boundary (``synchronous.py``; aborted if that takes over ``timeout``),
        the others at once."""
        store = self.store
        if self.due.signal():
            self.stopped = self.due.stop_reason
            if self.exact:
                store.control[STOP] = 1
                self.stop_deadline = time.monotonic() + self.engine.timeout
            else:
                store.abort()
        if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
            store.abort()
            self.stop_deadline = None

    def checkpoint_if_due(self, now: float, up) -> None:
        """Write the workers' buffered step-boundary checkpoint once they
        have filled it (each one: they wait for the buffer, so the cost
        floor, ``ck.allowed``, would stall them), or else a snapshot every
        ``every`` updates, as the cost floor allows."""
        ck = self.ck
        if self.buffer_filled():
            self.take_buffer(now)
        elif self.due.checkpoint(up) and self.due.interrupted is None and ck.allowed():
            self.snapshot("periodic", now)
            self.due.plan_checkpoint(int(up))

    def record_if_due(self, at: float, ex, up, dropped):
        """Record a due curve row, one of two ways; the reason to stop, if
        the row diverged."""
        store, recorder = self.store, self.recorder
        if self.due.interrupted is not None:
            return None
        if self.ring:
            return self.ask_ring(at, ex)
        if self.due.row(at, ex):
            params = store.params
            read = store.row_copy(ROW_LOCK_S) if Push in self.strategy.uses else None
            if read is not None:  # the pushes the parameters hold (the module docstring)
                params, landed = read
                ex, up, dropped = (self.at_start[c] + landed[c]
                                   for c in (EXAMPLES, UPDATES, DROPPED))
            return recorder.record(at, int(up), int(ex), params, int(dropped),
                                   self.local_totals(), self.row_buffers())
        return None

    def ask_ring(self, at: float, ex):
        """Record the ring's new rows (the reason to stop, if one diverged);
        a row the clock makes due (the example count's come every
        ``SNAP_EVERY`` steps on their own), worker 0 is asked to copy
        into the ring at its next step's end: read at a later wake."""
        control, reason = self.store.control, self.read_ring()

        def ask():
            control[SNAP_ASKED] += 1

        self.due.asked_row(at, 0 if control[SNAP_EVERY] else ex,
                           lambda: control[SNAP_SERVED] == control[SNAP_ASKED], ask)
        return reason

    def row_buffers(self, ring: int | None = None) -> dict | None:
        """The workers' buffers for a curve row, combined by the strategy's
        rule (``problems/buffers.py``): their slots as they are now, or as
        worker 0 copied them into ring row ``ring``; the lost workers'
        left out. None where the model has none."""
        if self.template is None:
            return None
        slots = self.store.buffers if ring is None else self.store.snap_buffers[ring]
        return combine_buffers({k: unflat(slots[k], self.template) for k in range(self.workers)
                                if k not in self.failed}, self.strategy.buffers)

    def final_buffers(self) -> dict | None:
        """The buffers the workers reported as they ended, combined by the
        strategy's rule, as the run's result combines them (``api.py``)."""
        return combine_buffers(self.tally.states, self.strategy.buffers)

    def local_totals(self) -> tuple[int, int] | None:
        """The workers' local steps so far, (applied, dropped), where the
        strategy takes any (an inner rule on private copies); else None."""
        return local_totals(self.strategy, *self.store.local_totals())

    def read_ring(self, final_updates: int | None = None):
        """Record the snapshots worker 0 wrote since the last read (those
        before ``final_updates``: the final row is recorded anyway); the
        reason to stop, if one of them diverged."""
        store = self.store
        control, reason = store.control, None
        written, read = int(control[SNAP_WRITTEN]), int(control[SNAP_READ])
        for k in range(read, written):
            i = k % len(store.snap_params)
            clock, up, ex, dropped = store.snap_meta[i]
            if final_updates is not None and up >= final_updates:
                break
            reason = reason or self.recorder.record(self.resume.time_s + float(clock) - self.t0,
                                                    int(up), int(ex), store.snap_params[i],
                                                    int(dropped), buffers=self.row_buffers(i))
        control[SNAP_READ] = written  # the slots are free again
        return reason

    # -- checkpoints ---------------------------------------------------------
    def snapshot(self, reason: str, now: float, private=None, totals=None,
                 buffers=False) -> None:
        """A checkpoint of the shared parameters as they are now (not at a
        step boundary: ``exact=False``), with the model's ``buffers`` (by
        default the workers' slots as they are now) and ``totals`` (by
        default none: the workers hold this attempt's counts, so a run
        resumed from it counts from its updates on: ``tally.restarted``)."""
        # parameters first: a worker counts a batch's examples before its
        # update, so every update in the copy is counted and never redone
        # (a compiled pass counts its epoch after it: one in progress is
        # partly in the copy, and done again)
        store, ck = self.store, self.ck
        params = np.array(arrays.to_host(store.params))
        counters = store.counters.copy()
        if buffers is False:
            buffers = self.row_buffers()
        kernel = self.engine.kernel
        positions = progress.snapshot_positions(self.strategy, counters[:, EXAMPLES], self.n,
                                                self.batch_size, kernel)
        counted = progress.counters_counts(counters)
        self.newest = (counted["updates"], counted["dropped"])
        if totals is None:
            totals = restarted(counted["updates"])
        ck.write(params=params, state=store.state, counters=counters,
                 positions=positions, time_s=self.resume.time_s + now,
                 rows=self.recorder.settled_rows(),
                 reason=reason, exact=False, private=private,
                 extra=checkpoints.held_buffers(buffers),
                 local=progress.snapshot_local(self.strategy, self.local_totals(), positions,
                                               self.n, self.batch_size, kernel),
                 totals=totals)

    def buffer_filled(self) -> bool:
        """Whether the workers have left a checkpoint in the buffer."""
        return self.store.ckpt is not None and bool(self.store.control[CKPT_STEP])

    def take_buffer(self, now: float) -> None:
        """Copy the buffered checkpoint and the senders' state at its step,
        free the buffer (the workers may fill it again from the next
        checkpoint step on), then write the copy."""
        store = self.store
        step = int(store.control[CKPT_STEP])
        params = np.array(arrays.to_host(store.ckpt["params"]), copy=True)
        state = type(store.state)(*(np.array(arrays.to_host(a), copy=True)
                                    for a in store.ckpt["state"]))
        senders = read_senders(store, step, self.engine.checkpoint_every)
        buffers = read_buffers(store, step, self.template, self.strategy.buffers)
        traffic = read_traffic(store, step, self.engine.checkpoint_every)
        store.control[CKPT_STEP] = 0
        self.exact_checkpoint(step, params, state, "periodic", now, senders, None, buffers,
                              traffic)

    def exact_checkpoint(self, step: int, params, state, reason: str, now: float,
                         senders=False, totals=None, buffers=None, traffic=None) -> None:
        """Written only where the workers' compressor state at ``step`` is at
        hand (``senders``, or ``checkpointing.read_senders``), and the
        model's ``buffers`` there (``buffer.<name>`` arrays, {}: none); else
        (a worker lost, whose state went with it) the newest one stands.
        ``totals`` (None: ``boundary_totals`` of the workers' ``traffic``
        at ``step``)."""
        store, ck, workers = self.store, self.ck, self.workers
        if senders is False:
            senders = read_senders(store, step, self.engine.checkpoint_every)
        if senders is None or buffers is None:
            return
        _, _, dropped, late = store.totals()
        counters = progress.exact_counters(step, workers, int(dropped), int(late), self.n,
                                           self.batch_size, self.strategy.backup_workers)
        if totals is None:
            totals = self.boundary_totals(progress.counters_counts(counters)["updates"], traffic)
        ck.write(params=params, state=state, counters=counters,
                 positions=[step] * workers, time_s=self.resume.time_s + now,
                 rows=self.recorder.settled_rows(), reason=reason, exact=True,
                 extra={**senders, **buffers}, totals=totals)

    def boundary_totals(self, updates: int, traffic: dict | None) -> dict:
        """The totals of a step-boundary checkpoint after ``updates``
        updates: those carried, the workers' byte counts there (``traffic``,
        ``checkpointing.read_traffic``) and sync's staleness (one count at 0
        per applied step); where the counts are not all at hand, a run
        resumed from it counts from there on (``tally.restarted``)."""
        if traffic is None:
            return restarted(updates)
        reports = {rank: {"traffic": figures} for rank, figures in traffic.items()}
        done = updates - self.updates_at_start
        reports[0]["staleness"] = {0: done} if done else {}
        tally = RunTally.resumed(self.workers, self.engine.compression, self.resume.totals,
                                 reports)
        tally.from_update = self.tally.from_update
        return tally.totals()

    # -- the end -------------------------------------------------------------
    def finish(self, wall: float, up: int) -> np.ndarray:
        """The final parameters; the ring's last rows are recorded, a
        periodic checkpoint still in the buffer and an interrupted run's
        final checkpoint are written, and a snapshot the run ended on again
        with the workers' counts."""
        store = self.store
        if self.ring and self.stopped is None:  # what worker 0 wrote after the last wake
            self.stopped = self.read_ring(up)
        params = np.array(arrays.to_host(store.params), copy=True)
        if self.buffer_filled():  # the last periodic one, filled after the last look
            self.take_buffer(wall)
        if self.due.interrupted is None:
            if not self.exact and self.newest == (up, int(store.totals()[2])):
                # the run ended on its newest snapshot, written without the
                # workers' counts: again, with them (a resumed run keeps them)
                self.snapshot("final", wall, private=self.tally.params or None,
                              totals=self.tally.totals(), buffers=self.final_buffers())
        else:  # the workers have reported: the totals are whole
            if not self.exact:
                self.snapshot("interrupted", wall, private=self.tally.params or None,
                              totals=self.tally.totals(), buffers=self.final_buffers())
            elif self.at_one_boundary():  # each worker handed its sender over there
                step = int(store.published[0]) if store.replicated else int(store.sync[STEP])
                self.exact_checkpoint(step, store.params, store.state, "interrupted", wall,
                                      read_senders(store, step, self.every, stopped=True),
                                      self.tally.totals(),
                                      checkpoints.held_buffers(self.final_buffers()))
        return params

    def at_one_boundary(self) -> bool:
        """Whether every worker that did not fail ended at the same step
        boundary: it stopped there as asked (``synchronous.Stopped``), or
        ran its program to the end."""
        ended = {r for r, (kind, _) in self.pool.reports.items() if kind in ("stopped", "done")}
        return bool(ended) and ended == set(range(self.workers)) - set(self.failed)

    def result(self, params, wall: float, totals) -> EngineResult:
        """The run's result, with the workers' failures, traffic and clocks."""
        ex, up, dropped, late = totals
        extra = self.tally.extra(int(up))
        if self.strategy.synchronous:
            extra["sync_step"] = "replicated" if self.store.replicated else "sharded"
        return self.tally.result(params, self.startup, wall, int(ex), int(up), int(dropped),
                                 extra, late=int(late), local=self.local_totals(),
                                 stopped=self.stopped, interrupted=self.due.interrupted)

"""async (Downpour), SSP and EASGD on Spark: the parameter server on the driver.

DeepDist's design (seed 004): the server (parameters, rule state, version,
read records, staleness counts) lives in the driver process. Each worker k
has ONE long Spark job on partition k alone (``stream.py``: its task talks
to the driver over a socket, as DeepDist's tasks did over HTTP), and a
driver thread that, in a loop:

1. reads the server under its lock: a copy of the parameters and the
   version (the read ticket); a delay-aware rule's ``on_read`` runs here;
2. sends them to the task, which runs the worker's program from the steps
   it has done to its next exchange (``n_push`` steps, Downpour; ``tau``,
   EASGD) and sends back the segment's result;
3. applies ONLY that received result under the lock: a push (its
   staleness = version now - ticket), or EASGD's elastic exchange
   d = alpha (x_k - centre), centre += d, x_k -= d (x_k and its rule state
   stay on the driver; ``--compress``: the task sends D = C(d + e)).

A push of n > 1 steps carries the delta of the task's own rule steps, and
the driver adds it (DeepDist's gradient/descent pair: ``pushes_deltas``);
a push of one step, or for a delay-aware rule, carries the gradient, to
which the server applies its rule (Downpour as the paper ran it).

A retried task is sent the pending segment again, from the same
parameters and start step: an update lands exactly once. A segment reads
the parameters once (``placement.check_segments``); the tasks compute the
loss checks between segments (``sums``).

SSP (``Clock``): a segment is one clock. After applying k's push the driver
ticks k's clock (``server/clocks.py``); before k's next segment it waits, under
the run's timeout, until every live worker has finished clock c - S - 1,
then reads the clock floor with the parameters: a segment's gradients are
at most S clocks stale. A worker that ends, fails or times out is retired.
Async and EASGD keep a looser pace (``Pace``): none trains the end alone.

A worker whose job fails after Spark's retries, or whose segment runs past
``timeout`` (its job cancelled), is named in ``failed_workers``. The
monitor (the calling thread) records the loss curve, writes the
checkpoints, fails the run if no worker returns for twice ``timeout``, and
at the end (a stop signal: after a last, exact checkpoint) ends the tasks.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import replace

import numpy as np

from ...errors import WaitTimeout
from ...monitor.pool import fail_if_lost
from ...strategies.ops import Clock, Elastic
from ...server.clocks import PACE_PATIENCE_S, ClockTable, Pace
from ...compressors.messages import Sender, receive
from ...server.averaging import TailAverage
from ...strategies.batches import budget_steps
from ...server.core import LocalUpdate, ServerCore, new_readers, pushes_deltas
from ...record.progress import counts
from ...monitor.tally import RunTally, bytes_sent
from ...record.live import add_figures
from ...monitor.due import Due
from .sizing import JobTiming
from .jobs import every_slot_at_once, short_error
from .stream import POLL_S, JobLink, Stopped, TaskLink


class _Refused(Exception):
    """A worker's task cannot answer a loss request (it has left)."""


class DriverServer:
    def __init__(self, ctx, rule, strategy, w0, ckpts):
        self.ctx = ctx
        self.ckpts = ckpts
        self.strategy = strategy
        self.w = np.array(w0, copy=True)
        # the server's update (``server/core.py``): its version, dropped count and staleness
        self.core = ServerCore(self.w, rule, readers=new_readers(rule, ctx.workers, self.w.size,
                                                                 self.w.dtype))
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)  # SSP's waits, on the same lock
        # the applied segments' examples and local steps (``RunTally.add``): the workers'
        # local steps are EASGD's inner rule's, or the rule steps of pushed deltas
        self.tally = RunTally(ctx.workers, ctx.compression)
        self.live = {}  # each worker's losses, examples, updates: for the live series
        self.failed: dict[int, str] = {}
        self.finished: set[int] = set()
        self.own = {k: np.array(w0, copy=True) for k in range(ctx.workers)}  # EASGD's x_k
        # the version each x_k last took the centre at: its staleness counts from there
        self.met = [0] * ctx.workers
        self.deltas = pushes_deltas(rule, strategy)
        self.local_rules = {k: LocalUpdate(rule, k) if self.deltas else None
                            for k in range(ctx.workers)}
        self.compression = ctx.compression
        self.senders = {k: Sender(self.compression, k) for k in range(ctx.workers)}
        self.running_since: dict[int, float | None] = {k: None for k in range(ctx.workers)}
        self.stop = threading.Event()
        self.elastic = Elastic in strategy.uses
        self.positions = [0] * ctx.workers  # steps of applied segments, per worker
        self.before = 0.0  # run time before the checkpoint resumed from
        self.timing = JobTiming("exchange")
        self.clocks = ClockTable(ctx.workers) if Clock in strategy.uses else None
        self.bounds = [0] * ctx.workers  # each worker's bound, from its last Clock op
        # the counts of the run this one resumed (``_run_tally``): staleness, traffic, clocks
        self.carried = {}
        self.clock_staleness = {k: Counter() for k in range(ctx.workers)}  # by worker
        self.wait_s = [0.0] * ctx.workers
        # each worker's steps: its share of the run
        jobs = [ctx.job(k) for k in range(ctx.workers)]
        self.pace = None if self.clocks is not None else Pace(
            [budget_steps(j.n_examples, j.batch_size, j.budget) for j in jobs],
            strategy.period_steps() or 1)
        # the model the run returns: the last iterate, or a tail average (a push's
        # wander around the minimum cancelled); EASGD's centre is already an average
        self.average = (TailAverage(self.w, ctx.average_epochs * ctx.n_examples)
                        if ctx.average_epochs and not self.elastic else None)
        self.captured = []  # checkpoints due, copied by the workers' threads (``_capture``)
        self.t0 = time.perf_counter()
        self.links: dict = {}  # each running worker's TaskLink (or JobLink)
        self.streamed = False  # long tasks hold the slots: they answer the loss requests
        self.start_line = threading.Barrier(ctx.workers)
        self.requests = {k: [] for k in range(ctx.workers)}  # the monitor's loss requests
        start = None if self.elastic else ckpts.start(
            self.w, rule, ctx.workers, {"positions": ((ctx.workers,), "int64")})
        if start is not None and start.saved is not None:
            start.restore(self.w, self.core.state)
            self.positions = start.positions
            if self.pace is not None:
                self.pace.done = list(self.positions)
            self.core.version = start.saved.meta["server_version"]  # = "applied": every update
            self.core.dropped, self.tally.examples = start.dropped, start.examples
            self.tally.local, self.tally.local_dropped = start.local
            self.before = start.time_s
            self.carried = start.totals
        self.due = None  # the run's schedule (``run``); ``_capture`` asks it under the lock

    # -- a worker: a driver thread and its task's long job ----------------------
    def worker(self, k: int) -> None:
        link = self.links[k]
        try:
            link.connect(self._alive(k))
            if self.pace is not None:
                with self.cond:
                    self.pace.join(k)
            try:  # the workers start together: a task's later launch is no head start
                self.start_line.wait(self.ctx.timeout)
            except threading.BrokenBarrierError:
                pass  # a worker that never connected: the others go on
            while not self.stop.is_set():
                self._wait_for_bound(k, link)
                self._serve(k, link)
                res, floor, sums = self._segment(k, link)
                self._apply(k, res, floor, sums)
                if res["ended"]:
                    self.finished.add(k)
                    return
        except Stopped:
            return  # the run has ended, or this worker is out: nothing more is applied
        except Exception as exc:  # noqa: BLE001 - this worker is out; the others go on
            if not self.stop.is_set() and k not in self.failed:
                self.failed[k] = short_error(exc)
        finally:
            self.start_line.abort()  # no one waits for a worker that is out
            self.links.pop(k, None)
            self._refuse_requests(k)
            self._retire(k)
            link.close(POLL_S)

    def _alive(self, k: int):
        return lambda: not self.stop.is_set() and k not in self.failed

    def _segment(self, k: int, link):
        """Worker k's next segment, run by its task from the parameters read
        now: (its result, the SSP clock floor read, the rule's sums sent)."""
        local_rule = self.local_rules[k]
        with self.lock:
            floor = self.clocks.floor() if self.clocks is not None else 0
            ticket = self.core.read(k)
            params = self.w.copy()
            # the rule's shared sums (AdaGrad's), for this worker's steps
            sums = local_rule.start_from_sums(self.core.state) if self.deltas else {}
        own = self.own[k] if self.elastic else None
        job = replace(self.ctx.job(k), start_step=self.positions[k])
        self.running_since[k] = began = time.monotonic()
        try:
            res = link.call(("segment", job, params, ticket, local_rule, own, self.senders[k]),
                            self._alive(k))
        finally:
            self.running_since[k] = None
        self.timing.add(time.monotonic() - began, res["task_s"])
        if self.stop.is_set() or k in self.failed:
            raise Stopped  # a late result is not applied
        return res, floor, sums

    # -- the loss, evaluated by the tasks (they hold the slots a job would need) --
    def sums(self, W, per_block):
        """``per_block(block, W)`` of every partition, computed by the
        workers' tasks between their segments; None when a worker's task
        has left (a Spark job then evaluates it)."""
        ctx = self.ctx
        asked = {}
        with self.cond:
            if not self.streamed or len(self.links) < ctx.workers or self.stop.is_set():
                return None
            for k in range(ctx.workers):
                asked[k] = Future()
                self.requests[k].append((W, per_block, asked[k]))
            self.cond.notify_all()  # an SSP wait serves it too
        try:
            return [asked[k].result(timeout=ctx.timeout) for k in range(ctx.workers)]
        except (FutureTimeout, _Refused):
            return None
        finally:
            for f in asked.values():
                f.cancel()

    def _serve(self, k: int, link) -> None:
        while True:
            with self.lock:
                if not self.requests[k]:
                    return
                W, per_block, future = self.requests[k].pop(0)
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(link.call(("sums", W, per_block), self._alive(k)))
                except BaseException:
                    future.set_exception(_Refused())
                    raise

    def _refuse_requests(self, k: int) -> None:
        with self.lock:
            pending, self.requests[k] = self.requests[k], []
        for _, _, future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(_Refused())

    # -- SSP's clock and async's pace ---------------------------------------------
    def _wait_for_bound(self, k: int, link) -> None:
        """Wait until worker k may start its next segment, answering the
        monitor's loss requests meanwhile: SSP's clock bound, at most the
        run's timeout; or async's pace, at most ``PACE_PATIENCE_S`` (half
        the timeout), after which the workers holding it back are dropped
        from the pace."""
        began = time.monotonic()
        if self.clocks is not None:
            clock, bound = int(self.clocks.finished[k]), self.bounds[k]
            ready = lambda: self.clocks.allows(clock, bound)  # noqa: E731
            deadline = began + self.ctx.timeout
        else:
            ready = lambda: self.pace.allows(k)  # noqa: E731
            deadline = began + min(PACE_PATIENCE_S, self.ctx.timeout / 2)
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(
                        lambda: self.stop.is_set() or k in self.failed or self.requests[k]
                        or ready(), max(0.0, deadline - time.monotonic()))
                    if self.stop.is_set() or k in self.failed or ready():
                        return
                    if not self.requests[k] and time.monotonic() >= deadline:
                        if self.clocks is not None:
                            raise WaitTimeout(self.clocks.too_long(k, clock, bound,
                                                                   self.ctx.timeout))
                        self.pace.drop_behind(k)  # too slow, or its executor lost
                        return
                self._serve(k, link)
        finally:
            self.wait_s[k] += time.monotonic() - began

    def _retire(self, k: int) -> None:
        """Worker k (ended, failed or out of time) no longer holds the others back."""
        with self.cond:
            (self.clocks or self.pace).retire(k)
            self.cond.notify_all()

    def _apply(self, k: int, res: dict, floor: int = 0, sums: dict | None = None) -> None:
        with self.cond:
            if sums and res["op"] == "push" and not res["skipped"]:
                # what the applied steps added to the rule's shared sums
                res["local_rule"].add_sums_to(self.core.state, sums)
            self.positions[k] += res["steps"]
            if self.pace is not None:
                self.pace.advance(k, res["steps"])
                self.cond.notify_all()
            self.local_rules[k] = res["local_rule"]
            self.senders[k] = res["sender"]
            self.tally.add(k, res)
            add_figures(self.live, k, res["loss"], res["steps"], res["examples"],
                        updates=int(self._land(k, res)))
            if self.elastic and "work" in res:
                self.own[k] = res["work"]
            elif self.average is not None:
                self.average.update(self.w, res["examples"])
            if self.clocks is not None and res["steps"]:
                # the segment's gradients were read at ``floor``, in clock ``finished[k]``
                # (the last one too: a short period that ends the worker, no tick after it)
                self.clock_staleness[k][int(self.clocks.finished[k]) - floor] += res["steps"]
            if self.clocks is not None and res.get("clock") is not None:
                self.bounds[k] = res["clock"]
                self.clocks.tick(k)  # after its push is applied
                self.cond.notify_all()
            self._capture()

    def _land(self, k: int, res: dict) -> bool:
        """Worker k's push or exchange, applied; whether it was (a dropped
        one, not finite, is counted and the rule told: ``ServerCore.drop``;
        a dropped exchange's copy restarts from the centre as it is now)."""
        op = res["op"]
        if res.get("skipped"):  # not finite, nothing sent: a push's gradient, an exchange's copy
            self.core.drop()
            if op == "elastic":
                res["work"][...] = self.w
                self.met[k] = self.core.version
            return False
        if op == "push":
            self._push(k, res)
            return True
        if op != "elastic":
            return False
        # its staleness: the others' exchanges since x_k last met the centre (``elastic.py``)
        self.core.staleness[self.core.version - self.met[k]] += 1
        if "difference" in res:  # compressed: the centre takes the difference
            self.core.add(receive(self.compression, res["difference"], self.w.size,
                                  self.w.dtype))
        else:
            res["work"] -= self.core.elastic(res["work"], res["alpha"])
        self.met[k] = self.core.version
        return True

    def _push(self, k: int, res: dict) -> None:
        """Worker k's finite push (it sent None for a non-finite one)."""
        ticket = int(res["ticket"])
        grad = receive(self.compression, res["grad"], self.w.size, self.w.dtype)
        if self.deltas:  # the worker's own rule steps, added as they are
            self.core.push_delta(grad, ticket)
        else:
            self.core.push(k, grad, ticket, checked=True)

    # -- checkpoints: captured where due, written by the monitor ----------------
    def _capture(self, reason: str = "periodic") -> None:
        """Under the lock, after an applied result (an exact state): a copy
        of the server's state when a checkpoint is due, for the monitor to
        write (its rows are evaluated through the workers' tasks); or, once
        the workers have stopped (``reason`` "interrupted"), whenever."""
        done = self.core.version + self.core.dropped
        if self.elastic or reason == "periodic" and not self.due.checkpoint(done):
            return
        self.due.plan_checkpoint(done)
        params, state = self.core.copy()
        meta = counts(reason, self.tally.examples, self.core.dropped,
                      local=(self.tally.local, self.tally.local_dropped),
                      totals=self._run_tally().totals(),  # every count, at this state
                      applied=self.core.version, server_version=self.core.version)
        arrays = {"positions": np.array(self.positions, dtype=np.int64)}
        self.captured.append((done, time.perf_counter() - self.t0, params, state, meta, arrays))

    def _write_captured(self) -> None:
        while self.captured:
            with self.lock:
                done, now, params, state, meta, arrays = self.captured.pop(0)
            self.ckpts.save(done, now, params, state, meta, arrays)

    # -- the monitor: the calling thread ------------------------------------------

    def _fail_if_lost(self) -> None:
        """Every worker failed: the run fails (``monitor.pool.fail_if_lost``;
        the strategies run here carry on while one is left)."""
        fail_if_lost(self.failed, self.strategy, self.ctx.workers)

    def _cancel_stuck(self) -> None:
        """A worker whose job has run past the timeout is out: named in
        failed_workers, its job cancelled; the others carry on."""
        now = time.monotonic()
        for k, since in list(self.running_since.items()):
            if since is not None and now - since > self.ctx.timeout and k not in self.failed:
                self.failed[k] = (f"WaitTimeout: its job ran past --timeout "
                                  f"{self.ctx.timeout:g} s (a stuck or lost executor)")
                self.ctx.jobs.cancel(k)
                self._retire(k)

    def run(self, recorder, poll_s: float = 0.05) -> dict:
        ctx = self.ctx
        recorder.start(self.w)
        # rows, live updates, the no-progress backstop; and the checkpoints,
        # every ``every`` updates after those resumed from (``_capture``)
        due = self.due = Due(recorder, every=self.ckpts.every, timeout=ctx.timeout)
        due.plan_checkpoint(self.core.version + self.core.dropped)
        self.t0 = t0 = time.perf_counter() - self.before
        threads = [threading.Thread(target=self.worker, args=(k,), daemon=True,
                                    name=f"monsoon-spark-worker-{k}")
                   for k in range(ctx.workers)]
        stopped = None
        try:
            # each worker's long job, started before its thread (or a job per segment)
            self.streamed = every_slot_at_once(ctx.sc, ctx.workers)
            link = TaskLink if self.streamed else JobLink
            for k in range(ctx.workers):
                self.links[k] = link(ctx, k, self.strategy, self.deltas)
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                time.sleep(poll_s)
                self._fail_if_lost()
                self._cancel_stuck()
                due.progress(self.tally.examples, f"no Spark worker returned for "
                             f"{2 * ctx.timeout:g} s; executors are stuck or lost (raise "
                             "--timeout if a push period is genuinely that slow)")
                stopped = due.look(time.perf_counter() - t0, self.tally.examples,
                                   self._snapshot, self._totals, self._figures)
                if not stopped and due.signal():  # SIGTERM/SIGINT: no result applied after
                    stopped = due.stop_reason
                if stopped:
                    break
                self._write_captured()
        finally:
            self.stop.set()
            with self.cond:
                self.cond.notify_all()  # SSP's waiters see the stop
            for t in threads:  # each tells its task to return, within a poll or two
                if t.is_alive():
                    t.join(timeout=ctx.timeout)
            for link in list(self.links.values()):  # a thread that never started
                link.close(0.0)
            ctx.jobs.cancel(workers=ctx.workers)
        wall = time.perf_counter() - t0
        due.live(wall, self._totals, self._figures, final=True)  # the run's last row
        if due.interrupted:  # the state after the last result applied: exact
            with self.lock:
                self._capture("interrupted")
        self._write_captured()  # due after the monitor's last look
        self._fail_if_lost()
        tally = self._run_tally()
        return {"params": self.model, "wall": wall, "examples": self.tally.examples,
                "updates": self.core.version, "dropped": self.core.dropped,
                "local": self.tally.local_totals(self.strategy, self.deltas),
                "staleness": tally.staleness,
                "failed": dict(self.failed), "stopped": stopped, "interrupted": due.interrupted,
                "worker_params": dict(self.own) if self.elastic else {},
                "timing": self.timing,
                "extra": {"spark_jobs": ctx.workers, **self._pace_extra(),
                          **({"averaged_epochs": ctx.average_epochs} if self.average else {}),
                          **tally.extra(self.core.version)}}

    # -- read together under the lock, for the curve and the live series -----
    def _snapshot(self):
        """A row's parameters, counts and examples, read together under the
        lock: a push applied after the monitor read ``tally.examples`` is in
        both or in neither (``Due.look``)."""
        with self.lock:
            return (self.model.copy(), self.core.version, self.core.dropped,
                    self.tally.local_totals(self.strategy, self.deltas), self.tally.examples)

    @property
    def model(self):
        """What the run evaluates and returns: the server's parameters, or
        their tail average (``--average-epochs``)."""
        return self.w if self.average is None else self.average.params

    def _totals(self):
        with self.lock:
            return self.tally.examples, self.core.version, self.core.dropped

    def _figures(self):
        with self.lock:
            return ({k: dict(f) for k, f in self.live.items()}, Counter(self.core.staleness),
                    bytes_sent(self._run_tally().traffic))

    def _pace_extra(self) -> dict:
        """Async's and EASGD's pace: the seconds each worker waited for the
        others, and the workers dropped from it (SSP's clock fields come
        from ``_run_tally``)."""
        if self.clocks is not None:
            return {}
        return {"pace_wait_s": [round(t, 3) for t in self.wait_s],
                "pace_dropped": sorted(self.pace.dropped)}

    def _run_tally(self) -> RunTally:
        """The whole run's counts so far (under the lock, or once the
        workers have stopped): those of the checkpoint it resumed from
        (``carried``) and this attempt's, which the driver counts itself
        as each segment is applied: each worker's report (its sender's
        traffic, SSP's clock report) and the server's staleness counts."""
        ssp = self.clocks is not None
        reports = {k: {"traffic": self.senders[k].stats(),
                       "clocks": {"clocks": int(self.clocks.finished[k]),
                                  "wait_s": self.wait_s[k],
                                  "staleness": self.clock_staleness[k]} if ssp else None}
                   for k in range(self.ctx.workers)}
        tally = RunTally.resumed(self.ctx.workers, self.compression, self.carried, reports, ssp)
        tally.staleness.update(self.core.staleness)
        return tally

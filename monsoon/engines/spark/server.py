"""async (Downpour), SSP and EASGD on Spark: the parameter server on the driver.

DeepDist's design (seed 004): the server (parameters, rule state, version,
read records, staleness counts) lives in the driver process. Each worker k
is a driver thread that, in a loop:

1. reads the server under its lock: a copy of the parameters and the
   version (the read ticket); a delay-aware rule's ``on_read`` runs here;
2. runs one Spark job on partition k alone (``sc.runJob(..., [k])``): the
   task runs the worker's program from the steps it has done to its next
   exchange (``n_push`` steps, Downpour; ``tau``, EASGD) and returns it;
3. applies ONLY that finished job's result under the lock: a push (its
   staleness = version now - ticket), or EASGD's elastic exchange
   d = alpha (x_k - centre), centre += d, x_k -= d (x_k and its rule state
   stay on the driver; ``--compress``: the task sends D = C(d + e)).

A push of n > 1 steps carries the delta of the task's own rule steps, and
the driver adds it (DeepDist's gradient/descent pair: ``pushes_deltas``);
a push of one step, or for a delay-aware rule, carries the gradient, to
which the server applies its rule (Downpour as the paper ran it).

A retried task recomputes the same segment from the same broadcast, and the
driver applies the job's one result: an update lands exactly once. A task
reads the parameters once, at its start (``placement.check_segments``
refuses a program that reads them again before its exchange).

SSP (``Clock``): a segment is one clock. After applying k's push the driver
ticks k's clock (``server/clocks.py``); before k's next job it waits, under
the run's timeout, until every live worker has finished clock c - S - 1,
then reads the clock floor with the parameters: a segment's gradients are
at most S clocks stale. A worker that ends, fails or times out is retired.

A worker whose job fails after Spark's retries, or runs past ``timeout``
(its job group cancelled), is named in ``failed_workers``; the others carry
on. The monitor (the calling thread) records the loss curve, fails the run
if no worker returns for twice ``timeout``, and cancels every job at the end.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace

import numpy as np

from ...errors import WaitTimeout
from ..base import lost_workers_error
from ...strategies.ops import Clock, Elastic
from ...server.clocks import ClockTable, clock_extra
from ...compressors.messages import Sender, receive, summarize
from ...server.core import LocalUpdate, ServerCore, new_readers
from ...record.checkpoints import restore_state, staleness_arrays
from ...record.live import add_figures
from ..due import Due
from .jobs import share, short_error
from .sizing import JobTiming
from .tasks import run_segment


def pushes_deltas(rule, strategy) -> bool:
    """Whether a pushing program's pushes are deltas (DeepDist, Neumann 2014:
    each partition's task trains a copy of the model on its rows, and the
    driver's descent adds the difference the task returns):

        task k:  x = w (read at launch);  for each of its n batches:
                     g = gradient(x, batch);  x <- rule_k(x, g)
                 push delta = w - x
        driver:  w <- w - delta

    rule_k is the run's rule (``--rule``, ``--lr``) with worker k's own
    state (momentum), kept on the driver between jobs and shipped with each
    (``LocalUpdate``), as local SGD's inner rule is: every gradient takes
    one rule step, as on the local engine. The rule's sums over gradients
    (``Rule.summed_state``: AdaGrad's sums of squares) are the server's, one
    for all workers: a task starts from them as they are at its launch, and
    the driver adds what its applied steps added. (With a sum per worker,
    each scales its gradients by its own statistics, and the run settles
    where sum_k D_k grad f_k = 0, above the loss's minimum.) Pushing the
    accrued sum of n gradients for one server step instead would make n
    gradients one step: AdaGrad's first step on a coordinate is lr in size
    whatever the gradient. With plain SGD the two are the same update.

    Deltas when the push period is more than one step and the rule needs
    nothing of the server at a push (no read record: dcasgd, adarevision;
    no ``--staleness-lr``); else gradients, with the server's rule."""
    from ...strategies.ops import Push

    if Push not in strategy.uses or (strategy.period_steps() or 1) <= 1:
        return False
    reader = rule.init_reader(1, np.float64)
    return not reader._fields and not rule.staleness_lr


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
        self.updates = self.examples = 0
        self.live = {}  # each worker's losses, examples, updates: for the live series
        self.failed: dict[int, str] = {}
        self.finished: set[int] = set()
        self.own = {k: np.array(w0, copy=True) for k in range(ctx.workers)}  # EASGD's x_k
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
        self.timing = JobTiming()
        self.clocks = ClockTable(ctx.workers) if Clock in strategy.uses else None
        self.bounds = [0] * ctx.workers  # each worker's bound, from its last Clock op
        self.clock_staleness = Counter()
        self.wait_s = [0.0] * ctx.workers
        saved = None if self.elastic else ckpts.load(
            self.w, rule, {"positions": ((ctx.workers,), "int64")})
        if saved is not None:
            self.w[...] = saved.arrays["params"]
            restore_state(saved, self.core.state)
            self.positions = [int(x) for x in saved.arrays["positions"]]
            self.updates = saved.meta["applied"]
            self.core.version = saved.meta["server_version"]
            self.core.dropped, self.examples = saved.meta["dropped"], saved.meta["examples"]
            self.before = saved.meta["time_s"]
            self.core.staleness.update(dict(zip(saved.arrays["staleness.values"].tolist(),
                                           saved.arrays["staleness.counts"].tolist())))

    # -- a worker: a driver thread ------------------------------------------------
    def worker(self, k: int) -> None:
        ctx = self.ctx
        try:
            ctx.jobs.join_group(k)
            while not self.stop.is_set():
                if self.clocks is not None:
                    self._wait_for_bound(k)
                local_rule = self.local_rules[k]
                with self.lock:
                    floor = self.clocks.floor() if self.clocks is not None else 0
                    ticket = self.core.read(k)
                    params = self.w.copy()
                    # the rule's shared sums (AdaGrad's), for this worker's steps
                    sums = local_rule.start_from_sums(self.core.state) if self.deltas else {}
                own = self.own[k] if self.elastic else None
                bc = share(ctx.sc, params, params.nbytes)
                job = replace(ctx.job(k), start_step=self.positions[k])
                strategy = self.strategy
                sender = self.senders[k]

                def task(it, bc=bc, job=job, ticket=ticket, local_rule=local_rule, own=own,
                         sender=sender, deltas=self.deltas):
                    return [run_segment(b, strategy, job, bc.value, ticket, local_rule, own,
                                        sender, deltas) for b in it]

                self.running_since[k] = began = time.monotonic()
                try:
                    (res,) = ctx.sc.runJob(ctx.blocks, task, [k])
                finally:
                    self.running_since[k] = None
                    bc.destroy(blocking=False)
                self.timing.add(time.monotonic() - began, res["task_s"])
                if self.stop.is_set() or k in self.failed:
                    return  # the run has ended: a late result is not applied
                self._apply(k, res, floor, sums)
                if res["ended"]:
                    self.finished.add(k)
                    return
        except Exception as exc:  # noqa: BLE001 - this worker is out; the others go on
            if not self.stop.is_set() and k not in self.failed:
                self.failed[k] = short_error(exc)
        finally:
            self._retire(k)

    # -- SSP's clock --------------------------------------------------------------
    def _wait_for_bound(self, k: int) -> None:
        """Wait until worker k may start its next clock (at most the run's timeout)."""
        with self.cond:
            clock, bound = int(self.clocks.finished[k]), self.bounds[k]
            began = time.monotonic()
            ok = self.cond.wait_for(lambda: self.stop.is_set() or k in self.failed
                                    or self.clocks.allows(clock, bound), self.ctx.timeout)
            self.wait_s[k] += time.monotonic() - began
            if not ok:
                raise WaitTimeout(self.clocks.too_long(k, clock, bound, self.ctx.timeout))

    def _retire(self, k: int) -> None:
        """Worker k (ended, failed or out of time) no longer holds the others back."""
        if self.clocks is not None:
            with self.cond:
                self.clocks.retire(k)
                self.cond.notify_all()

    def _apply(self, k: int, res: dict, floor: int = 0, sums: dict | None = None) -> None:
        with self.cond:
            if sums and res["op"] == "push" and res["grad"] is not None:
                # what the applied steps added to the rule's shared sums
                res["local_rule"].add_sums_to(self.core.state, sums)
            self.positions[k] += res["steps"]
            self.local_rules[k] = res["local_rule"]
            self.senders[k] = res["sender"]
            self.examples += res["examples"]
            self.core.dropped += res["dropped"]
            add_figures(self.live, k, res["loss"], res["steps"], res["examples"],
                        updates=int(res["op"] in ("push", "elastic")))
            if res["op"] == "push":
                if res["grad"] is None:
                    self.core.dropped += 1
                else:
                    self._push(k, res)
            elif res["op"] == "elastic":
                if "difference" in res:  # compressed: the centre takes the difference
                    self.core.add(receive(self.compression, res["difference"], self.w.size,
                                          self.w.dtype))
                else:
                    res["work"] -= self.core.elastic(res["work"], res["alpha"])
                self.updates += 1
                self.core.staleness[0] += 1
            if self.elastic and "work" in res:
                self.own[k] = res["work"]
            if self.clocks is not None and res.get("clock") is not None:
                # the segment's gradients were read at ``floor``, in clock ``finished[k]``
                self.clock_staleness[int(self.clocks.finished[k]) - floor] += res["steps"]
                self.bounds[k] = res["clock"]
                self.clocks.tick(k)  # after its push is applied
                self.cond.notify_all()

    def _push(self, k: int, res: dict) -> None:
        """Worker k's finite push (it sent None for a non-finite one)."""
        core, ticket = self.core, int(res["ticket"])
        grad = receive(self.compression, res["grad"], self.w.size, self.w.dtype)
        if self.deltas:  # the worker's own rule steps, added as they are
            self.w -= grad
            core.staleness[core.version - ticket] += 1
            core.version += 1
        else:
            core.push(k, grad, ticket, checked=True)
        self.updates += 1

    # -- the monitor: the calling thread ------------------------------------------
    def _save(self, now: float) -> None:
        with self.lock:  # between two applied results: an exact state
            params, state = self.core.copy()
            meta = {"applied": self.updates, "dropped": self.core.dropped,
                    "examples": self.examples, "server_version": self.core.version}
            arrays = {"positions": np.array(self.positions, dtype=np.int64),
                      **staleness_arrays(self.core.staleness)}
            done = self.updates + self.core.dropped
        self.ckpts.save(done, now, params, state, meta, arrays)

    def _fail_if_lost(self) -> None:
        """Every worker failed: the run fails (``base.lost_workers_error``;
        the strategies run here carry on while one is left)."""
        err = lost_workers_error(self.failed, self.strategy, self.ctx.workers)
        if err is not None:
            raise err

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
        due = Due(recorder, timeout=ctx.timeout)  # rows, live updates, the no-progress backstop
        t0 = time.perf_counter() - self.before
        threads = [threading.Thread(target=self.worker, args=(k,), daemon=True,
                                    name=f"monsoon-spark-worker-{k}")
                   for k in range(ctx.workers)]
        for t in threads:
            t.start()
        stopped = None
        try:
            while any(t.is_alive() for t in threads):
                time.sleep(poll_s)
                self._fail_if_lost()
                self._cancel_stuck()
                due.progress(self.examples, f"no Spark worker returned for {2 * ctx.timeout:g} "
                             "s; executors are stuck or lost (raise --timeout if a push "
                             "period is genuinely that slow)")
                stopped = due.look(time.perf_counter() - t0, self.examples, self._snapshot,
                                   self._totals, self._figures)
                if stopped:
                    break
                if not self.elastic and self.ckpts.due(self.updates + self.core.dropped):
                    self._save(now)
        finally:
            self.stop.set()
            with self.cond:
                self.cond.notify_all()  # SSP's waiters see the stop
            ctx.jobs.cancel(workers=ctx.workers)
            for t in threads:
                t.join(timeout=ctx.timeout)
        wall = time.perf_counter() - t0
        self._fail_if_lost()
        return {"params": self.w, "wall": wall, "examples": self.examples,
                "updates": self.updates, "dropped": self.core.dropped,
                "staleness": self.core.staleness,
                "failed": dict(self.failed), "stopped": stopped,
                "worker_params": dict(self.own) if self.elastic else {},
                "timing": self.timing,
                "extra": {**self._clock_extra(),
                          **summarize([self.senders[k].stats() for k in range(ctx.workers)],
                                      self.compression, self.updates)}}

    # -- read together under the lock, for the curve and the live series -----
    def _snapshot(self):
        with self.lock:
            return self.w.copy(), self.updates, self.core.dropped

    def _totals(self):
        with self.lock:
            return self.examples, self.updates, self.core.dropped

    def _figures(self):
        with self.lock:
            return {k: dict(f) for k, f in self.live.items()}, Counter(self.core.staleness)

    def _clock_extra(self) -> dict:
        if self.clocks is None:
            return {}
        return clock_extra(self.clock_staleness, dict(enumerate(self.wait_s)),
                           dict(enumerate(self.clocks.finished.tolist())), self.ctx.workers)

"""The sim engine: a deterministic discrete-event virtual cluster.

N virtual workers (one to tens of thousands) run the SAME strategy programs
as the local engine, in virtual time. The math is real: every gradient is
computed, at the moment its virtual worker starts it, on the parameters that
worker actually holds (the shared ones for Hogwild! and sync, its own copy
otherwise), so staleness effects are exact. Time is simulated by
``DelayModel``: compute times with stragglers, message latency and
bandwidth, and parameter-server shards that serve one request at a time.

How each op spends virtual time:
- ``Gradient``: computed now, resumed after k / batch_size of ``--compute-s``
  for k examples. A Hogwild! worker instead reads the shared vector shard by
  shard over that time (inconsistent reads: others' writes land mid-read)
  and takes the gradient on what it read.
- ``Apply`` (Hogwild!): applied to the shared parameters now.
- ``Fetch`` / ``Push`` / ``Elastic``: a message to every shard; each shard
  queues requests and serves them in arrival order (the read or the update
  happens when it is served); a fetch resumes when all replies are back, a
  push as soon as it is sent. A compressed ``Elastic`` (``--compress``) is a
  read of the centre, then the compressed difference sent like a push.
- ``AllReduce`` / ``Average``: the contribution (and an inner rule's sums,
  ``server/summed.py``) travels to the server; the first N arrivals of a
  step count (later ones are dropped, counted), the N-th triggers the
  update, and the step's workers resume when the result reaches them.

Invariants (each has a test): events at equal times are taken in the order
they were scheduled, and every random draw comes from the seed, so a seed
gives the same event order and bit-identical parameters; with zero latency,
zero service time and constant compute, sim sync equals local sync bit for
bit (the same shard-wise reduction and update).

Checkpoints (``record/checkpoints.py``; every ``checkpoint_every`` updates,
and on SIGTERM/SIGINT) hold the parameters, rule state, private copies,
counters, the delays' RNG state, the virtual time, the events taken and
the loss curve. In-flight messages and program positions live in the event
queue and in generators, which cannot be saved: ``--resume`` replays the
simulation from the seed to the checkpoint's update (an interrupted one's
event), checks that it is the checkpoint (else refuses it, ``_check_replay``)
and carries on, ending bit-identical to an uninterrupted run of its budget.
"""
from __future__ import annotations

import heapq
import time
from collections import Counter
from functools import partial

import numpy as np

from ...errors import ConfigError
from ...strategies import WorkerJob
from ...strategies.ops import AllReduce, Apply, Average, Clock, Fetch, Gradient, Push
from ..base import ALL_OPS, BACKUP_WORKERS, SHARED_MEMORY, STAGES, Engine
from ...server.collective import apply_mean
from ...server.reduce import into_slot
from ...server.core import ServerCore, new_readers
from ...server.shards import replicates, shard_bounds, shard_count
from ...server.summed import SharedSums
from ...server.worker import WAIT, Worker
from ...record import checkpoints
from ...record.live import LOSS_CELLS, add_loss
from ...record.progress import counters_shapes, counts
from ...monitor.lifecycle import stop_reason, stop_requested
from ..options import CHECKPOINT_EVERY, RESUME, SERVER_OPS, SHARDS, refuse_unused_shards
from ...monitor.tally import EngineResult, local_totals, run_folder_extra
from .delays import OPTIONS as DELAY_OPTIONS
from .delays import REQUEST_BYTES, DelayModel, delay_model
from ...compressors.messages import Sender, compressing, summarize
from .clocks import SimClocks


class _Worker(Worker):
    """A virtual worker: the shared interpreter (``server/worker.py``), its
    ops that take virtual time carried out by the engine's handlers, which
    return ``WAIT`` and schedule the event that resumes it (``_resume``)."""
    __slots__ = ("sim", "grad", "examples", "updates", "dropped", "late", "busy",
                 "others_at_read", "pending", "ticket", "sync_step", "done", "sender",
                 "snapshot", "losses", "local", "ssp", "held_losses", "sending")
    engine_name = "sim"

    def __init__(self, rank, sim, work):
        super().__init__(rank, sim.problem, sim.strategy, work)
        self.sim = sim
        self.handlers.update({op: partial(f, self) for op, f in sim.handlers.items()})
        self.handlers[Push] = self.push  # ``server/worker.py``'s, around ``sim._push``
        self.ssp = None if sim.ssp is None else sim.ssp.join(self)  # SSP's clock, around them
        self.examples = self.updates = self.dropped = self.late = 0
        # its gradients' examples and losses the server has not taken yet
        # (``SimEngine._took``), and those of the push it is sending
        self.held, self.held_losses, self.sending = 0, [], None
        self.busy = 0.0
        self.others_at_read = 0
        self.pending = 0
        self.sync_step = 0
        self.done = False
        self.snapshot = None
        self.losses = [0.0] * LOSS_CELLS  # its mini-batch losses, for the live series
        self.local = [0, 0]  # its local steps: applied, dropped

    def admits(self, grad) -> bool:
        return self.sim.server.admits(grad)

    def send_push(self, grad, ticket):
        return self.sim._push(self, grad, ticket)

    def send_elastic(self, op):
        return self.sim._elastic(self, op)

    def release(self) -> tuple:
        """The examples and losses of the gradients held since the last
        message (``SimEngine._taken`` counts them)."""
        parcel = (self.held, self.held_losses)
        self.held, self.held_losses = 0, []
        return parcel

    def count_examples(self, parcel) -> None:
        self.sending = parcel  # a push's (``Worker.push``): counted when it lands

    def count_dropped(self) -> None:
        self.dropped += 1
        self.sim.total["dropped"] += 1
        self.sim._taken(self, self.release())  # dropped: taken now
        if self.sending is not None:
            self.sim._taken(self, self.sending)
            self.sending = None

    def count_local(self, applied: bool) -> None:
        column = 0 if applied else 1
        self.local[column] += 1
        self.sim.local[column] += 1


def unused_delay(name: str, strategy) -> str | None:
    """Why the delay option ``name`` has no effect on ``strategy``'s run,
    or None: without messages (in-memory updates: one worker, shared
    memory), latency, bandwidth and service time; pipeline stages send
    messages to each other and have no server."""
    if name not in ("sim_latency_s", "sim_bandwidth", "sim_service_s"):
        return None
    if STAGES in strategy.needs(2):
        return "stages exchange activations with no server" if name == "sim_service_s" else None
    if not set(SERVER_OPS) & set(strategy.uses):
        return "no message is sent and no server serves (updates are made in memory)"
    return None


class SimEngine(Engine):
    name = "sim"
    ops = ALL_OPS
    compresses = True  # the encoded size is charged to the bandwidth model

    @staticmethod
    def keeps_compressor_state(strategy) -> bool:
        """A resumed simulation replays from the seed to its checkpoint,
        compressors and residuals included."""
        return True

    @staticmethod
    def keeps_buffers(strategy) -> bool:
        """The replay recomputes them too (BatchNorm's statistics)."""
        return True

    meets = frozenset({SHARED_MEMORY, BACKUP_WORKERS, STAGES})

    virtual_time = True   # its clock is simulated: evaluating costs no time
    stops_on_signal = True  # SIGTERM/SIGINT: a final checkpoint, then return (lifecycle.py)
    options = (SHARDS, CHECKPOINT_EVERY, RESUME) + DELAY_OPTIONS

    @classmethod
    def arguments(cls, run, **values) -> dict:
        args = super().arguments(run, **values)
        args["delays"] = delay_model(**{o.name: args.pop(o.name) for o in DELAY_OPTIONS})
        return args

    def __init__(self, delays: DelayModel | None = None, shards: int | None = None,
                 checkpoint_dir: str | None = None,
                 checkpoint_every: int = CHECKPOINT_EVERY.default, resume_dir: str | None = None):
        self.delays = delays or DelayModel()
        self.shards = shards
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume_dir = resume_dir
        self.backend_used = "virtual"

    def describe(self) -> dict:
        return {"engine": self.name, **{f"sim_{k}": v for k, v in self.delays.describe().items()}}

    def preflight(self, problem, strategy, workers, batch_size) -> None:
        """Refuse what would change nothing yet be recorded: ``--shards``
        where the local engine refuses it, but Hogwild!'s, whose read of the
        shared vector is cut at the shards (``_inconsistent_read``), and a
        message or server delay where no message or server is (``unused_delay``)."""
        super().preflight(problem, strategy, workers, batch_size)
        refuse_unused_shards(self, problem, strategy, reads_by_shard=True)
        unused = [o for o in DELAY_OPTIONS
                  if o.name in self.given - self.shared and unused_delay(o.name, strategy)]
        if unused:
            flags = ", ".join(o.named(self.cli) for o in unused)
            they = "it" if len(unused) == 1 else "they"
            raise ConfigError(f"{flags}: in {strategy.name} "
                              f"{unused_delay(unused[0].name, strategy)}, so {they} would "
                              f"change nothing: drop {flags}")
        if STAGES in strategy.needs(workers):  # one stage time per stage
            self.delays.stage_times(getattr(strategy, "stages_for", lambda w: w)(workers),
                                    self.cli)
        elif self.delays.stage_compute_s is not None:
            raise ConfigError(f"--stage-compute-s gives pipeline stages' times; the "
                              f"{strategy.name} strategy has no stages: use --compute-s")

    # -- set-up ----------------------------------------------------------------
    def run(self, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder):
        self.check(strategy, workers)
        if STAGES in strategy.needs(workers):  # stage workers: this engine's pipeline runner
            from .pipeline import run_pipeline
            return run_pipeline(self, strategy, problem, rule, w0, workers, batch_size, seed,
                                budget, recorder)
        if self.delays.stage_compute_s is not None:
            raise ConfigError(f"--stage-compute-s gives pipeline stages' times; the "
                              f"{strategy.name} strategy has no stages: use --compute-s")
        t_real = time.perf_counter()
        self.batch_size = batch_size  # --compute-s is a gradient over this many examples
        self._set_up_server(problem, rule, strategy, w0, workers, seed)
        # the ops that take virtual time, ``(worker, op)``; each worker binds them
        self.handlers = {Gradient: self._gradient, Apply: self._apply, Fetch: self._fetch,
                         AllReduce: self._all_reduce, Average: self._average}
        self.ssp = SimClocks(self) if Clock in strategy.uses else None
        self._set_up_workers(w0, batch_size, seed, budget)
        self.keeper = checkpoints.Checkpointer.for_engine(self, problem, strategy, rule, workers,
                                                          batch_size, seed, recorder)
        # checked, and its loss curve handed to the recorder
        self.resumed = self.keeper.load(w0, rule, counters_shapes(workers))
        self.interrupted, self.live_row = None, None
        recorder.start(self.params)
        stopped = self._loop(recorder)
        self._live(recorder, self.now, final=True)  # the run's last row
        blocked = [w.rank for w in self.workers if not w.done]
        if blocked and stopped is None:
            raise RuntimeError(f"simulation ended with workers {blocked[:10]} still waiting "
                               "(a synchronous step could not gather its workers)")
        return self._result(stopped, t_real)

    def _set_up_server(self, problem, rule, strategy, w0, workers, seed) -> None:
        """The simulated server's state: the parameters and rule state, split
        into shards with their versions and busy times, the delay model's
        random stream, the run's totals and the synchronous step's slots."""
        n = w0.size
        self.problem, self.strategy = problem, strategy
        self.W = workers
        self.S = shard_count(self.shards, workers, n)
        self.shards_used = self.S
        self.bounds = shard_bounds(n, self.S)
        self.params = np.array(w0, copy=True)
        self.state = rule.init(n, w0.dtype)
        self.replicated = replicates(strategy, w0)
        # the server's update (``server/core.py``): the whole vector (Hogwild!, a
        # replicated step) and each shard; one staleness count for the run
        self.staleness = Counter()
        self.server = ServerCore(self.params, rule, self.state,
                                 new_readers(rule, workers, n, w0.dtype), staleness=self.staleness)
        self.cores = self.server.shards(self.bounds)
        if workers == 1:
            self.server.readers = None  # a lone worker's read is never stale
        self.shard_free = np.zeros(self.S)
        self.shard_busy = np.zeros(self.S)
        self.rng = np.random.default_rng([seed, 7919])
        self.nbytes = n * w0.itemsize
        self.heap, self.seq, self.now = [], 0, 0.0
        self.total = {"examples": 0, "updates": 0, "dropped": 0, "late": 0}
        # the workers' local steps (applied, dropped); a resumed run replays them
        self.local = [0, 0]
        # synchronous step state
        self.counted = workers - strategy.backup_workers
        self.sync_step = 0
        self.arrivals: list[int] = []
        self.waiting_late: list[_Worker] = []
        if strategy.synchronous:
            self.slots = np.zeros((workers, n), dtype=w0.dtype)
            self.slot_examples = [0] * workers
            self.acc, self.tmp = np.empty(n, dtype=w0.dtype), np.empty(n, dtype=w0.dtype)
        # Local AdaAlter's shared sums (``server/summed.py``) and each worker's a_k
        self.sums = (SharedSums.of(strategy.local_rule, n, w0.dtype)
                     if Average in strategy.uses else None)
        self.sum_slots = None if self.sums is None else [
            np.zeros((workers, n), dtype=s.dtype) for s in self.sums.sums]

    def _set_up_workers(self, w0, batch_size, seed, budget) -> None:
        """One simulated worker a rank: its (compressing) strategy program,
        working copy, gradient buffer and inner rule; each starts at
        virtual time 0."""
        n, strategy = w0.size, self.strategy
        self.workers = []
        for rank in range(self.W):
            w = _Worker(rank, self, self.params if strategy.shared_params
                        else np.array(w0, copy=True))
            w.sender = Sender(self.compression, rank)
            w.sender.keep_previous = strategy.backup_workers > 0  # a late message: ``_late``
            w.program = compressing(strategy.program(WorkerJob(
                rank, self.W, self.problem.n_examples, batch_size, seed, budget)), w.sender,
                self.nbytes)
            w.grad = np.empty(n, dtype=w0.dtype)
            if self.sums is not None:
                self.sums.start(w.local_rule, w.work)
            self.workers.append(w)
            self._at(0.0, self._resume, w, None)

    def _result(self, stopped, t_real: float) -> EngineResult:
        """The run's result at the simulated end: parameters and totals, the
        simulated and real times, the workers' and shards' utilization, the
        traffic summary, SSP's figures and the checkpoint paths."""
        end, workers = self.now, self.W
        result = EngineResult(np.array(self.params, copy=True), 0.0, end,
                              self.total["examples"], self.total["updates"],
                              self.total["dropped"], Counter(self.staleness), [],
                              stopped=stopped,
                              late_gradients=self.total["late"],
                              worker_params={} if self.strategy.shared_params else
                              {w.rank: w.work.copy() for w in self.workers[:64]},
                              interrupted=self.interrupted)
        result.local_updates, result.dropped_local_updates = (
            local_totals(self.strategy, *self.local) or (None, None))
        busy = sum(w.busy for w in self.workers)
        result.extra = {
            "simulated_time_s": end, "real_time_s": time.perf_counter() - t_real,
            "utilization": {"workers": busy / (workers * end) if end > 0 else None,
                            "shards": float(self._shard_busy_by(end).sum() / (self.S * end))
                            if end > 0 else None},
            "delays": self.delays.describe(workers),
            **summarize([w.sender.stats() for w in self.workers],
                        self.compression, self.total["updates"])}
        if self.ssp is not None:
            result.extra.update(self.ssp.extra())
        resumed = self.resumed.path if self.resumed is not None else None
        result.extra.update(run_folder_extra(self.keeper.last_path, resumed))
        return result

    def _shard_busy_by(self, end: float) -> np.ndarray:
        """Each shard's service seconds up to ``end``: a request's service is
        counted when it arrives, so the part that runs past the simulation's
        end is taken off. Every request counted arrived by ``end``, so one
        served after it starts as the one before it ends: the shard is busy
        from ``end`` to ``shard_free`` without a gap."""
        return self.shard_busy - np.maximum(self.shard_free - end, 0.0)

    # -- the event loop ----------------------------------------------------------
    def _at(self, t: float, fn, *args) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn, args))

    def _loop(self, recorder):
        heap, total = self.heap, self.total
        events = 0
        replaying = self.resumed is not None
        keeper = self.keeper
        # a diverging run says so through its status, not NumPy's warnings
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._events(heap, total, events, replaying, keeper, recorder)

    def _events(self, heap, total, events, replaying, keeper, recorder):
        """Carry out the events in time order (``_loop``): the reason the run
        stopped early, or None."""
        while heap:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            fn(*args)
            events += 1
            if replaying:  # replaying up to the checkpoint: silently
                if self._replayed(events):
                    self._check_replay()
                    replaying = False
                continue
            if keeper.every and keeper.due(total["updates"] + total["dropped"]):
                self._save(events, "periodic")
            if events & 255 == 0 and stop_requested():
                self.interrupted = stop_requested()
                self._save(events, "interrupted")
                return stop_reason(self.interrupted)
            if recorder.due(t, total["examples"]):
                reason = recorder.record(t, total["updates"], total["examples"], self.params,
                                         total["dropped"],
                                         local_totals(self.strategy, *self.local))
                if reason is not None:
                    return reason
                self._live(recorder, t)  # virtual seconds may hold the whole run
            elif recorder.live_due(t):  # against virtual time
                self._live(recorder, t)
        if replaying:
            raise checkpoints.CheckpointError(
                f"replaying the simulation ended before checkpoint {self.resumed.path} "
                "(another run's?); start a new run without --resume")
        return None

    def _live(self, recorder, t: float, final: bool = False) -> None:
        figures = {w.rank: {"losses": w.losses, "examples": w.examples,
                            "updates": w.updates} for w in self.workers[:recorder.live_workers]}
        total = self.total
        if final and self.live_row is not None and self.live_row[1] == total["examples"]:
            # nothing trained since the last row (the last messages landing): the row's
            # time is that row's, so it writes no rate rather than a drop to 0
            t = self.live_row[0]
        self.live_row = (t, total["examples"])
        recorder.live(t, total["examples"], total["updates"], figures, self.staleness,
                      total["dropped"], sum(w.sender.sent_bytes for w in self.workers))

    # -- checkpoints ----------------------------------------------------------
    def _arrays(self) -> dict:
        """What a checkpoint holds besides the parameters and the rule state."""
        # in ``record/progress.py``'s columns: examples, updates, dropped, late
        arrays = {"counters": np.array([[w.examples, w.updates, w.dropped, w.late]
                                        for w in self.workers], dtype=np.int64)}
        if not self.strategy.shared_params:
            arrays.update(checkpoints.private_arrays({w.rank: w.work for w in self.workers}))
        if self.sums is not None:  # not read at resume (the replay rebuilds them): checked
            for name, shared in zip(self.strategy.local_rule.summed_state, self.sums.sums):
                arrays["sums." + name] = shared
        return arrays

    def _save(self, events: int, reason: str) -> None:
        total = self.total
        meta = counts(reason, total["examples"], total["dropped"], updates=total["updates"],
                      exact=True, positions=[w.examples for w in self.workers],
                      late=total["late"], events=events,
                      rng=checkpoints.jsonable(self.rng.bit_generator.state))
        self.keeper.save(total["updates"] + total["dropped"], self.now, self.params, self.state,
                         meta, self._arrays())

    def _replayed(self, events: int) -> bool:
        """Whether the replay has reached the checkpoint: a periodic one at
        its update (updates and dropped ones, as ``_save`` counts them), an
        interrupted one at its event. Not a periodic one's event: near the
        end of a run, how many events lead to an update depends on the budget
        (workers done schedule no more), and a run may resume with a larger one."""
        meta = self.resumed.meta
        if meta.get("reason") == "periodic":
            return (self.total["updates"] + self.total["dropped"]
                    >= int(meta["updates"]) + int(meta["dropped"]))
        return events >= int(meta["events"])

    def _check_replay(self) -> None:
        """The replay reached the checkpoint: it must be the checkpoint, or
        (``_ahead_of``) the same model with workers gone on past it."""
        saved = self.resumed
        arrays = self._arrays()
        if not (saved.reproduced_by(self.params, self.state, arrays,
                                    rng=self.rng.bit_generator.state)
                or self._ahead_of(saved, arrays)):
            raise checkpoints.CheckpointError(
                f"replaying the simulation to checkpoint {saved.path} did not reproduce its "
                "parameters (the problem, the delays or monsoon changed, or it is the last "
                "of a run with a smaller budget whose workers, with varying compute times, "
                "stopped in another order); start a new run without --resume")

    def _ahead_of(self, saved, arrays: dict) -> bool:
        """Whether the replay holds ``saved``'s model (parameters, rule state,
        private copies, shared sums) and each worker's updates, dropped and
        late steps, having computed more gradients than it: the checkpoint
        ended a run with a smaller budget whose workers, done, began no more
        (so the delays drew fewer compute times too); this run's go on."""
        counters = arrays.pop("counters")
        theirs = saved.arrays["counters"]
        return (counters.shape == theirs.shape
                and np.array_equal(counters[:, 1:], theirs[:, 1:])
                and bool((counters[:, 0] >= theirs[:, 0]).all())
                and bool((counters[:, 0] > theirs[:, 0]).any())
                and saved.reproduced_by(self.params, self.state, arrays))

    def _resume(self, w: _Worker, value) -> None:
        """Run ``w``'s program until an op has to wait for virtual time."""
        if w.advance(value):
            w.done = True
            self._taken(w, w.release())  # none: every program ends with its message
            if self.ssp is not None:  # it no longer counts toward the bound
                self.ssp.retire(w)

    def _message(self, nbytes: int) -> float:
        return self.delays.message_time(nbytes)

    def _shard_arrive(self, s: int, serve, *args) -> None:
        """A request reaches shard s: it is served when the shard is free."""
        start = max(self.now, self.shard_free[s])
        service = self.delays.service_s
        self.shard_free[s] = start + service
        self.shard_busy[s] += service
        self._at(start, serve, s, *args)

    # -- ops ---------------------------------------------------------------------
    def _gradient(self, w, op):
        if self.strategy.shared_params:
            w.others_at_read = self.total["updates"] - w.updates
            if not self.strategy.synchronous:
                self.server.read(w.rank)
            if not self.strategy.synchronous and self.S > 1:
                return self._inconsistent_read(w, op)
        loss, grad = self.problem.gradient(w.work, op.indices)
        self._took(w, loss, grad, len(op.indices), op.weight)
        dt = self._compute_time(w, op)
        w.busy += dt
        self._at(self.now + dt, self._resume, w, (loss, w.grad))
        return WAIT

    def _compute_time(self, w, op) -> float:
        """``op``'s compute seconds: ``--compute-s`` is a gradient over
        ``--batch-size`` examples, so a slice of k costs k / batch_size of it."""
        return self.delays.compute_time(self.rng, w.rank, self.W,
                                        len(op.indices) / self.batch_size)

    def _inconsistent_read(self, w, op):
        """Hogwild!: the worker reads the shared vector while it computes, so
        shard s is read at t + dt * s / S and other workers' writes land in
        the middle of its read; the gradient is taken on what it read."""
        dt = self._compute_time(w, op)
        w.busy += dt
        if w.snapshot is None:
            w.snapshot = np.empty_like(self.params)
        for s in range(self.S):
            self._at(self.now + dt * s / self.S, self._read_shard, w, s)
        self._at(self.now + dt, self._gradient_on_snapshot, w, op)
        return WAIT

    def _read_shard(self, w, s):
        a, b = self.bounds[s]
        np.copyto(w.snapshot[a:b], self.params[a:b])

    def _gradient_on_snapshot(self, w, op):
        loss, grad = self.problem.gradient(w.snapshot, op.indices)
        self._took(w, loss, grad, len(op.indices), op.weight)
        self._resume(w, (loss, w.grad))

    def _took(self, w, loss, grad, examples: int, weight: float) -> None:
        """A gradient computed: kept in the worker's buffer times its
        ``weight`` (``ops.Gradient``); its examples held until the server
        takes the message that carries it (``_taken``)."""
        np.multiply(grad, weight, out=w.grad)
        w.held += examples
        w.held_losses.append(loss)

    def _taken(self, w, parcel) -> None:
        """The server took ``w``'s message carrying ``parcel`` (``release``:
        its gradients' examples and losses): applied (the step, the push's
        last slice, the exchange) or dropped (not finite, late). A row's
        examples are those of the parameters it holds, and a live row's
        losses those of its examples: a push in flight, or a step still
        gathering, is not counted yet."""
        examples, losses = parcel
        w.examples += examples
        self.total["examples"] += examples
        for loss in losses:
            add_loss(w.losses, loss)

    def _apply(self, w, op):
        self.server.version = self.total["updates"]
        if self.server.push(w.rank, op.grad, w.updates + w.others_at_read) is None:
            w.count_dropped()
        else:
            self._taken(w, w.release())
            self._updated(w)

    def _updated(self, w):
        w.updates += 1
        self.total["updates"] += 1

    # Downpour: fetch and push, shard by shard
    def _fetch(self, w, op):
        w.ticket = np.empty(self.S, dtype=np.int64)
        return self._read(w, w.work, self._fetched)

    def _fetched(self, w):
        ticket = w.ticket.copy()
        w.took_centre(ticket)
        self._resume(w, ticket)

    def _read(self, w, into, then, *args):
        """A request to every shard for its slice of the parameters, copied
        into ``into`` as each serves it (a fetch, ``w.ticket`` not None: its
        version read too, into it); ``then(w, *args)`` once every reply is back."""
        w.pending = self.S
        arrive = self.now + self._message(REQUEST_BYTES)
        for s in range(self.S):
            self._at(arrive, self._shard_arrive, s, self._serve_read, w, into, then, args)
        return WAIT

    def _serve_read(self, s, w, into, then, args):
        a, b = self.bounds[s]
        if w.ticket is not None:
            w.ticket[s] = self.cores[s].read(w.rank)
        np.copyto(into[a:b], self.params[a:b])
        self._at(self._replied(a, b), self._reply, w, then, args)

    def _replied(self, a: int, b: int) -> float:
        """When a shard's reply of the slice [a, b) reaches its worker."""
        return self.now + self.delays.service_s + self._message((b - a) * self.params.itemsize)

    def _reply(self, w, then, args):
        w.pending -= 1
        if w.pending == 0:
            then(w, *args)

    def _send(self, w, size: int, parcel, serve, *args) -> None:
        """``w``'s message (``sender.last_nbytes``, the encoded size of a
        vector of ``size``) carrying ``parcel`` (``release``) to every shard,
        each its slice's share, served there by ``serve(s, w, *args, left)``;
        ``w`` resumes once it is sent."""
        nbytes, left = w.sender.last_nbytes, {"shards": self.S, "parcel": parcel}
        for s, (a, b) in enumerate(self.bounds):
            arrive = self.now + self._message(nbytes * (b - a) // size)
            self._at(arrive, self._shard_arrive, s, serve, w, *args, left)
        send = nbytes / self.delays.bandwidth_Bps if self.delays.bandwidth_Bps else 0.0
        self._at(self.now + send, self._resume, w, None)

    def _landed(self, w, left) -> bool:
        """A shard has applied ``w``'s message: whether it was the last."""
        left["shards"] -= 1
        if left["shards"]:
            return False
        self._taken(w, left["parcel"])
        self._updated(w)
        return True

    def _push(self, w, grad, ticket):
        """A finite push's transport (``Worker.push``): sent to every shard."""
        if self.ssp is not None:
            self.ssp.pushing(w.rank)
        parcel, w.sending = w.sending, None
        self._send(w, grad.size, parcel, self._serve_push, grad.copy(), ticket)
        return WAIT

    def _serve_push(self, s, w, grad, ticket, left):
        a, b = self.bounds[s]
        tau = self.cores[s].push(w.rank, grad[a:b], int(ticket[s]), checked=True, count=False)
        left["worst"] = max(left.get("worst", 0), tau)  # the push's: its stalest slice's
        if self._landed(w, left):
            self.staleness[left["worst"]] += 1
            if self.ssp is not None:  # this clock's tick may be published
                self.ssp.pushed(w.rank)

    def _elastic(self, w, op):
        w.ticket = None
        if w.sender.compression.active:  # read the centre, then send the compressed difference
            centre = np.empty_like(w.work)
            return self._read(w, centre, self._centre_read, centre, op.alpha)
        w.pending = self.S
        left = {"shards": self.S, "worst": 0}  # the exchange's staleness: its stalest shard's
        for s in range(self.S):
            a, b = self.bounds[s]
            arrive = self.now + self._message((b - a) * self.params.itemsize)
            self._at(arrive, self._shard_arrive, s, self._serve_elastic, w, op.alpha, left)
        return WAIT

    def _centre_read(self, w, centre, alpha):
        """The whole centre has arrived: D = C(alpha (x_i - x~) + e) goes to
        every shard (x~ += D there) and x_i -= D (Zhang et al.'s asynchronous
        exchange, the difference compressed)."""
        _, sent = w.elastic_difference(centre, alpha)
        self._send(w, sent.size, w.release(), self._serve_difference, sent)

    def _serve_difference(self, s, w, sent, left):
        a, b = self.bounds[s]
        self._exchanged(s, w, left)
        self.cores[s].add(sent[a:b])
        if self._landed(w, left):
            self.staleness[left["worst"]] += 1

    def _serve_elastic(self, s, w, alpha, left):
        a, b = self.bounds[s]
        self._exchanged(s, w, left)
        w.work[a:b] -= self.cores[s].elastic(w.work[a:b], alpha)
        left["shards"] -= 1
        if not left["shards"]:
            self._taken(w, w.release())
            self._updated(w)
            self.staleness[left["worst"]] += 1
        self._at(self._replied(a, b), self._reply, w, self._resume, (None,))

    def _exchanged(self, s, w, left) -> None:
        """``w``'s exchange reaches shard ``s``: its staleness there, into
        the exchange's worst (``server/elastic.py``)."""
        left["worst"] = max(left.get("worst", 0), w.exchanged(s, self.cores[s].version))

    # synchronous steps
    def _all_reduce(self, w, op):
        if into_slot(self.slots[w.rank], op.grad):
            return self._contribute(w, op.examples, w.sender.last_nbytes)
        return self._contribute(w, 0, 0)

    def _average(self, w, op):
        w.drift(self.params, self.slots[w.rank], self.sums, self.sum_slots)
        nbytes = w.sender.last_nbytes
        if self.sums is not None:  # a_k travels with the drift, dense
            nbytes += self.sums.nbytes
        return self._contribute(w, op.examples, nbytes)

    def _contribute(self, w, examples, nbytes):
        self._at(self.now + self._message(nbytes), self._sync_arrive, w, w.sync_step,
                 examples)
        return WAIT

    def _sync_arrive(self, w, step, examples):
        if step < self.sync_step:  # the step was applied without it
            self._late(w, examples)
            self._at(self.now + self._message(self.nbytes), self._sync_resume, w, step)
            return
        if len(self.arrivals) >= self.counted:  # the step is full: wait for its update
            self._late(w, examples)
            self.waiting_late.append(w)
            return
        self.arrivals.append(w.rank)
        self.slot_examples[w.rank] = examples
        if len(self.arrivals) == self.counted:
            self._complete_step()

    def _late(self, w, examples):
        """``w``'s contribution came too late and is dropped; one that carried
        a message (``examples``) leaves its sender as before that message
        (``Sender.take_back``: error feedback keeps no residual of a message
        nobody applied)."""
        w.late += 1
        self.total["late"] += 1
        self._taken(w, w.release())  # dropped: taken now
        if examples:
            w.sender.take_back()

    def _complete_step(self):
        ranks = sorted(self.arrivals)
        examples = [self.slot_examples[k] for k in ranks]
        # replicated, as the local engine: one update of the whole vector; a
        # dropped step: the rule is told, as the local engine's steps tell it
        ok = apply_mean([self.server] if self.replicated else self.cores, self.slots, ranks,
                        examples, self.bounds, self.acc, self.tmp, self.sync_step,
                        sums=self.sums, sum_parts=self.sum_slots)
        if self.replicated:
            for core in self.cores:
                core.version += int(ok)
        for k in ranks:
            self._taken(self.workers[k], self.workers[k].release())
        if ok:
            self.staleness[0] += 1
        self.total["updates" if ok else "dropped"] += 1
        self.shard_busy += self.delays.service_s  # every shard serves the step
        self.shard_free = np.maximum(self.shard_free, self.now + self.delays.service_s)
        reply = self.nbytes
        if self.compression.active:
            # the step's update travels back as the encoded contributions it
            # combined (an allgather, as DGC's), or dense when that is smaller
            reply = min(self.nbytes, sum(self.workers[k].sender.last_nbytes for k in ranks))
            for k in ranks:
                self.workers[k].sender.received_bytes -= self.nbytes - reply
        if self.sums is not None:
            reply += self.sums.nbytes  # S comes back with the parameters
        done = self.now + self.delays.service_s + self._message(reply)
        resumed = [self.workers[k] for k in self.arrivals] + self.waiting_late
        step = self.sync_step
        self.sync_step += 1
        self.arrivals, self.waiting_late = [], []
        for w in resumed:
            self._at(done, self._sync_resume, w, step)

    def _sync_resume(self, w, step):
        """``w`` contributed to ``step``; it joins the current step, skipping
        those the others completed without it (counted when it resumes)."""
        w.sync_step = self.sync_step
        w.restart(self.params, self.sums)
        self._resume(w, self.sync_step - (step + 1))

"""The local engine (the default, zero set-up): workers on this machine.

Workers are processes (spawn start method) or threads; the parameters, the
rule state and the counters live in shared memory (``store.py``). ``serial``
runs inline in the calling thread, with no engine overhead at all.

Each worker process sets its torch thread count so that workers x threads
<= cores (oversubscription is a known 30x slowdown).

The calling process is the monitor (``monitor.py``): it starts the workers
and waits (with ``start_timeout``) until every one is ready, which is
``startup_s``; then it releases them together and, until they finish,
snapshots the parameters for the loss curve (evaluated after the run; with a
target loss, as taken: the first at it stops the run), drives the progress
bar, and watches for failure. Between looks it sleeps on the workers' pipes
and process sentinels (``monitor/pool.py``; threads: their queue's
doorbell), so a message, a death or a stop signal wakes it at once;
otherwise it sleeps until the next row is due at the run's pace so far, or
the next checkpoint is (workers fill its buffer, the monitor writes the
file), and at most ``idle_s``. A worker that raises or dies is named in
``failed_workers``; if the strategy needs all workers (sync) the others are
aborted and the run fails with that worker's error. If no worker makes
progress for twice ``timeout`` seconds (a stuck barrier says so itself after
``timeout``), the run is aborted: nothing can hang forever.

Nothing is lost, nothing is left behind:

- every worker process asks the kernel to kill it when the monitor dies
  (``lifecycle.py``: PR_SET_PDEATHSIG, and a parent check in every wait);
- the shared-memory file is unlinked as soon as every worker has mapped it,
  so the kernel frees it with the last process, however they end; the
  locks are unnamed once their owner exits normally;
- SIGTERM or SIGINT (``lifecycle.StopSignals``, installed by
  ``monsoon.train``) makes the monitor stop the workers (synchronous ones at
  a step boundary), write a final checkpoint and return what it has, with
  ``interrupted`` set;
- with a run folder, a checkpoint is written every ``checkpoint_every``
  updates (``checkpointing.py``); ``resume_dir`` carries a run on from the
  newest good one.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import sys
import time
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from ...options import Option
from ...problems.base import seed_worker
from ...problems.buffers import flat as flat_buffers
from ...strategies import WorkerJob
from ...strategies.ops import Average
from ...server.summed import initial_sums
from ...record import checkpoints
from ...record.progress import counters_shapes
from ...monitor.lifecycle import stop_reason, stop_requested
from ..options import CHECKPOINT_EVERY, RESUME, SHARDS, TIMEOUT, refuse_unused_shards
from ...monitor.processes import (limit_threads, single_blas_thread, single_torch_thread,
                                  start_context, torch_threads_per_worker)
from ...monitor.due import Due
from ...monitor.waiting import Aborted, wait_until
from .checkpointing import (RunCheckpoints, buffer_slots, hands_over_senders, sender_slots,
                            traffic_slots)
from ...monitor.pool import WorkerPool, failure, read_payload, start_advice, start_timeout
from ...compressors.messages import Sender, compressing
from ... import arrays
from .monitor import WorkerMonitor
from .runtime import SharedSender, WorkerRuntime
from .store import (ABORTED, DONE, DROPPED, EXAMPLES, FAILED, READY, RUNNING, START, STEP,
                    UPDATES, ParameterStore)
from ..base import ALL_OPS, BACKUP_WORKERS, SHARED_MEMORY, STAGES, Engine
from ...server.shards import replicates, shard_count
from ...monitor.tally import RunTally, bytes_sent, run_folder_extra
from .synchronous import Stopped

BACKENDS = ("processes", "threads")
# serial runs a step of at most this many parameters x examples on one torch thread
SMALL_STEP = 1 << 20


@dataclass
class WorkerSetup:
    """Everything a worker needs, sent once at start (pickled for processes)."""
    rank: int
    workers: int
    store: ParameterStore
    problem: object
    rule: object
    strategy: object
    job: WorkerJob
    timeout: float
    start_timeout: float
    torch_threads: int
    live: bool  # the monitor snapshots the parameters during the run
    checkpoint_every: int = 0      # synchronous steps between checkpoints
    work0: np.ndarray | None = None  # a resumed private copy
    compression: object = None     # messages.Compression (--compress)
    sender_state: dict | None = None  # a resumed worker's compressor state
    # the synchronous step every worker joins first, the same for all (a resumed
    # local SGD run's workers may be batches apart: ``progress.snapshot_positions``)
    sync_step: int = 0


@contextlib.contextmanager
def own_stream(store, strategy):
    """A Hogwild! thread on a GPU launches its kernels on a stream of its
    own, so that concurrent steps can fill what one stream leaves idle
    (seed 002; its lock-free updates race by design, as on the CPU). The
    others share the device's stream, so that the order their locks and
    barriers give is the order their kernels run (a Downpour push is then
    whole before the next fetch). The stream is drained before the worker
    reports, so the monitor reads finished work."""
    device = getattr(store, "device", None)
    lock_free = strategy.shared_params and not strategy.synchronous
    if device is None or device.type != "cuda" or not lock_free:
        yield
        return
    torch = sys.modules["torch"]
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))  # the store's initial copy
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        stream.synchronize()


def _worker_body(messages, setup: WorkerSetup) -> None:
    store = setup.store
    rank = setup.rank

    def report(kind: str, status: int, params: bool) -> None:
        """The worker's end, to the monitor (``Worker.report``: its examples,
        dropped and late gradients are in shared memory)."""
        store.status[rank] = status
        messages.put((kind, rank, runtime.report(params, staleness=dict(runtime.staleness))))

    try:
        runtime = WorkerRuntime(rank, setup.workers, store, setup.problem, setup.rule,
                                setup.strategy, setup.timeout, setup.live,
                                start_step=setup.sync_step,
                                checkpoint_every=setup.checkpoint_every, work0=setup.work0)
        sender = runtime.sender = SharedSender(setup.compression, rank, store.sent_counts[rank])
        # for a stop mid-step, and a late message a step drops (synchronous.py)
        sender.keep_previous = hands_over_senders(store) or setup.strategy.backup_workers > 0
        if setup.sender_state is not None:
            sender.restore(setup.sender_state)
        program = compressing(setup.strategy.program(setup.job), sender,
                              arrays.nbytes(store.params))
        store.status[rank] = READY
        wait_until(lambda: store.control[START], setup.start_timeout + setup.timeout,
                   lambda: store.control[1], "the start signal")
        store.status[rank] = RUNNING
        with own_stream(store, setup.strategy):
            runtime.run(program)
        report("done", DONE, params=True)
    except Stopped:  # at a step boundary, as the monitor asked
        runtime.on_stop()
        report("stopped", ABORTED, params=False)
    except Aborted:
        runtime.on_abort()
        report("aborted", ABORTED, params=True)
    except BaseException as exc:  # noqa: BLE001 - reported to the monitor, by name
        store.status[rank] = FAILED
        messages.put(failure(rank, exc))


@contextlib.contextmanager
def _seeded_rng(problem, seed: int, rank: int, done: int):
    """Seed the problem's random draws (Dropout) for worker ``rank``, which
    made ``done`` gradients before (resumed), in the caller's process: the
    caller's generator state comes back after, and the problem draws as it
    did before."""
    if problem.seed_rng is None:
        yield
        return
    import torch

    with torch.random.fork_rng(devices=[]):
        seed_worker(problem, seed, rank, done)
        try:
            yield
        finally:
            seed_worker(problem, None, rank)


def _process_main(reader, outbox, locks, sync_lock) -> None:
    """A worker process (in ``pool._worker_process``)."""
    setup = read_payload(reader)
    setup.store.attach_locks(locks, sync_lock)
    limit_threads(setup.torch_threads, setup.problem.uses_torch)
    # this process is the worker's own
    seed_worker(setup.problem, setup.job.seed, setup.rank,
                setup.strategy.gradients_before(setup.job))
    _worker_body(outbox, setup)


class _InlineWatch:
    """What serial does between its ops (``WorkerRuntime.run`` calls it after
    each), asking the same ``Due`` as the parallel monitor: at a step
    boundary, a due checkpoint or a stop signal (which raises ``Stopped``);
    every 8 ops, a due curve row or live update. ``watch``: the step count
    when a checkpoint or a stop became near; from then on every op looks for
    the next step boundary. ``t0`` starts the run's clock (``wall``)."""

    def __init__(self, engine, store, problem, sender, recorder, ck, resume):
        self.store, self.problem, self.sender = store, problem, sender
        self.recorder, self.ck, self.resume = recorder, ck, resume
        self.kernel, self.n = engine.kernel, problem.n_examples
        every = ck.every
        if self.kernel and every:  # positions count epochs: at most one checkpoint per epoch
            every = max(1, -(-every // self.n))
        recorder.start(store.params)
        self.t0, self.ops = time.perf_counter(), 0
        self.counters = store.counters[0]
        self.due = Due(recorder, every)
        self.due.plan_checkpoint(self.steps_done())
        self.watch = None
        self.totals = dict  # the run's counts so far, for every checkpoint (``_run_inline``)

    def steps_done(self) -> int:
        """The position a checkpoint records: epochs for a compiled pass, else steps."""
        counters = self.counters
        if self.kernel:
            return int(counters[EXAMPLES]) // self.n
        return int(counters[UPDATES] + counters[DROPPED])

    def checkpoint_extra(self) -> dict:
        """The model's buffers, and the sender's state where the run
        compresses (as a worker's)."""
        out = checkpoints.buffer_arrays(self.problem)
        if self.sender.compression.stateful:
            n, dtype = self.store.params.size, self.store.params.dtype
            out.update(checkpoints.worker_arrays([self.sender.state(n, dtype)], "sender."))
        return out

    def boundary(self, steps: int) -> None:
        """At a step boundary: write a due checkpoint (or the final one, and
        stop, on a signal); watch for the next boundary if one is near."""
        store, now = self.store, time.perf_counter() - self.t0
        self.due.signal()
        sig = self.due.interrupted
        if sig or (self.due.checkpoint(steps) and self.ck.allowed()):
            self.ck.write(params=store.params, state=store.state, counters=store.counters.copy(),
                          positions=[steps], time_s=self.resume.time_s + now,
                          rows=self.recorder.settled_rows(),
                          reason="interrupted" if sig else "periodic", exact=True,
                          extra=self.checkpoint_extra(),
                          totals=self.totals())  # the one worker's counts are here
            self.due.plan_checkpoint(steps)
        if sig:
            raise Stopped()
        self.watch = steps if self.due.checkpoint(steps, margin=8) else None

    def __call__(self) -> None:
        """One op done: a boundary's checkpoint or stop, then (every 8 ops)
        a row, and whether a checkpoint or a stop is near."""
        self.ops += 1
        if self.kernel:  # every op is an epoch's pass: a boundary
            self.boundary(self.steps_done())
        if self.watch is not None:
            steps = self.steps_done()
            if steps != self.watch:
                self.boundary(steps)
        if self.ops & 7 == 0:
            self.record_if_due()
            if self.watch is None and not self.kernel:
                steps = self.steps_done()
                self.due.signal()
                if self.due.interrupted or self.due.checkpoint(steps, margin=8):
                    self.watch = steps

    def record_if_due(self) -> None:
        """Record a due curve row (a diverged one, or one at the target, aborts
        the run), else hand the live writer a due update."""
        store, now = self.store, time.perf_counter() - self.t0
        at = self.resume.time_s + now
        if self.due.row(at, store.counters[:, EXAMPLES].sum()):
            ex, up, dropped, late = store.totals()
            if self.recorder.record(at, int(up), int(ex), store.params,
                                    int(dropped)) is not None:
                store.abort()
            # The clock stops while serial evaluates: parallel runs
            # evaluate in the monitor, off the workers' clock.
            self.t0 += time.perf_counter() - self.t0 - now
        else:
            self.due.live(at, store.totals, self.live_figures)

    def live_figures(self) -> tuple:
        """The one worker's figures for a live row, and the run's bytes sent."""
        return (*self.store.live_figures(1), bytes_sent(self.totals()["traffic"]))


def _daemonic() -> bool:
    """Whether this process is daemonic (a ``multiprocessing.Pool`` worker):
    it may start no child process, so no worker process either."""
    return multiprocessing.current_process().daemon


class LocalEngine(Engine):
    name = "local"
    virtual_time = False
    stops_on_signal = True  # SIGTERM/SIGINT: a final checkpoint, then return (lifecycle.py)
    ops = ALL_OPS
    meets = frozenset({SHARED_MEMORY, BACKUP_WORKERS, STAGES})
    compresses = True  # in shared memory: the math and the counts change, not the transport
    device_placement = "index"  # worker k's problem copy computes on cuda:(k mod GPUs)
    options = (
        Option("backend", str, "auto", "processes, threads, or auto: threads for problems with "
               "a compiled GIL-free loop (sparse), on GPUs (the towers share the device's "
               "arrays) and inside a daemonic process (a Pool worker), else processes",
               choices=("auto",) + BACKENDS),
        TIMEOUT, SHARDS, CHECKPOINT_EVERY, RESUME)
    described = ("backend", "timeout", "checkpoint_every", "resume_dir")

    @staticmethod
    def keeps_compressor_state(strategy) -> bool:
        """Whether checkpoints hold each worker's compressor state: those
        taken at step boundaries (``checkpointing.save_sender``)."""
        return checkpoints.exact_checkpoints(strategy)

    @staticmethod
    def keeps_buffers(strategy) -> bool:
        """Every checkpoint holds the model's buffers (``buffer.<name>``):
        serial's, the problem's; an exact run's, those of the strategy's
        rule at the step; a snapshot's, the workers' combined
        (``checkpointing.py``)."""
        return True

    keeps_inner_state = False  # a private copy's inner rule state is not checkpointed

    def checkpoint_shapes(self, problem, strategy, w0, workers: int) -> dict:
        """Every worker's counters; each worker's sender state where an exact
        run's compression is stateful; the model's buffers."""
        stateful = self.compression.stateful and checkpoints.exact_checkpoints(strategy)
        sender = self.compression.sender_layout(w0.size, w0.dtype) if stateful else None
        return {**counters_shapes(workers),
                **checkpoints.held_shapes(workers, sender, checkpoints.buffer_arrays(problem))}

    device = "cpu"  # the run's --device (``from_options``)

    @classmethod
    def from_options(cls, run, **values):
        engine = super().from_options(run, **values)
        engine.device = str(getattr(run, "device", "cpu"))
        return engine

    @classmethod
    def arguments(cls, run, **values) -> dict:
        args = super().arguments(run, **values)
        if args["backend"] == "auto":  # compiled loops release the GIL: threads share the
            # data; GPU towers in one process share the parameters on the device (seed 002)
            gpu = str(getattr(run, "device", "cpu")).startswith("cuda")
            threads = run.problem.sgd_pass is not None or gpu or _daemonic()
            args["backend"] = "threads" if threads else "processes"
        return args

    def __init__(self, backend: str = "processes", timeout: float = 60.0,
                 start_timeout: float = 120.0, shards: int | None = None, idle_s: float = 1.0, checkpoint_dir: str | None = None,
                 checkpoint_every: int = CHECKPOINT_EVERY.default, resume_dir: str | None = None):
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume_dir = resume_dir
        self.backend = backend
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.shards = shards
        self.idle_s = idle_s    # the longest the monitor sleeps (messages wake it sooner)

    @staticmethod
    def uses_kernel(problem, rule, strategy, budget, given=frozenset()) -> bool:
        """Hogwild!/serial on a problem with a compiled per-example SGD loop,
        plain SGD at one rate, an epoch budget, and no ``--batch-size``
        asked for (the loop steps once per example): run the loop, not
        mini-batches."""
        return (problem.sgd_pass is not None and rule.plain_step and not rule.staleness_lr
                and budget.epochs is not None and strategy.per_example_loop
                and "batch_size" not in given)

    @classmethod
    def gives_loss(cls, strategy) -> bool:
        """One worker's steps (serial): a sharded sync step sums no loss."""
        return strategy.full_batch_steps and strategy.single_worker

    def shares_device_arrays(self) -> bool:
        """Workers are threads of this process: on a GPU they share one device
        tensor of parameters (towers, Hogwild! threads)."""
        return self.backend == "threads"

    def _array_device(self, problem, rule, backend: str):
        """The device the store's arrays live on (``store.to_device``), or
        None for host memory: a problem that computes on a device, workers
        that share this process, a rule written for either kind of array,
        and nothing that reads them as NumPy on the way (a compiled SGD
        pass, a compressor)."""
        device = problem.array_device()
        if (device is None or backend == "processes" or not rule.device_arrays or self.kernel
                or self.compression.active):
            return None
        return device

    def preflight(self, problem, strategy, workers, batch_size) -> None:
        """The stage runner runs each stage in its own process: --backend
        threads is refused; "auto"'s choice of threads becomes processes.
        Inside a daemonic process, worker processes are refused."""
        super().preflight(problem, strategy, workers, batch_size)
        refuse_unused_shards(self, problem, strategy, self.device)
        if STAGES in strategy.needs(workers) and self.backend == "threads":
            if "backend" in self.given:
                raise ConfigError("the pipeline runs each stage in its own process on the "
                                  "local engine; drop --backend threads")
            self.backend = "processes"
        if self.backend == "processes" and not strategy.single_worker and _daemonic():
            fix = ("run the pipeline outside it: its stages are processes"
                   if STAGES in strategy.needs(workers) else
                   "use backend='threads' (--backend threads), or train outside it")
            raise ConfigError("inside a daemonic process (a Pool worker) worker processes "
                              f"cannot start; {fix}")

    def run(self, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder):
        self.check(strategy, workers)
        if STAGES in strategy.needs(workers):  # stage workers: this engine's pipeline runner
            from .pipeline import run_pipeline
            return run_pipeline(self, strategy, problem, rule, w0, workers, batch_size, seed,
                                budget, recorder)
        self.kernel = self.uses_kernel(problem, rule, strategy, budget,
                                       getattr(self, "given", frozenset()))
        if self.kernel:
            problem.prepare_kernel()
        shards = shard_count(self.shards, workers, w0.size)
        inline = strategy.single_worker
        backend = "inline" if inline else self.backend
        self.backend_used = backend
        exact = checkpoints.exact_checkpoints(strategy)
        ident = checkpoints.identity(problem, strategy, rule, workers, batch_size, seed,
                                     self.name, self.settings)
        ident["plan"] = "epochs" if self.kernel else "batches"  # what a position counts
        ck = RunCheckpoints(self.checkpoint_dir, self.checkpoint_every, self.resume_dir, ident,
                            exact, recorder)
        senders = exact and self.compression.stateful  # checkpoints hold each worker's sender
        resume = ck.start(w0, rule, workers,  # checked before anything starts
                          self.checkpoint_shapes(problem, strategy, w0, workers))
        if resume.saved is not None:  # every worker starts from its buffers (serial: the problem)
            checkpoints.restore_buffers(resume.saved, problem)
        held = None if inline else flat_buffers(problem.state())  # the model's, flat (None: none)
        buffer = exact and not inline and bool(ck.directory) and self.checkpoint_every > 0
        ctx = start_context() if backend == "processes" else None
        device = self._array_device(problem, rule, backend)
        store = ParameterStore(w0, rule, workers, shards, sync_slots=strategy.synchronous,
                               backend=backend, mp_context=ctx,
                               replicated=(not inline and device is None
                                           and replicates(strategy, w0)),
                               checkpoint_buffer=buffer,
                               snapshot_ring=recorder.evals > 0,
                               live=recorder.live_writer is not None,
                               extra_layout=self._slots(strategy, w0, workers,
                                                        bool(ck.directory), held),
                               sums=initial_sums(strategy.local_rule, w0.size, w0.dtype)
                               if Average in strategy.uses else None,
                               # curve rows and snapshot checkpoints: the workers' buffers
                               buffers=held if recorder.evals > 0 or ck.directory else None)
        self.shards_used = shards
        if resume.saved is not None:
            ck.restore(resume, store)
            if not senders:  # a worker's compressor state, only where this run keeps it
                resume.senders.clear()
            if strategy.synchronous:
                store.sync[STEP] = min(resume.positions)
        if device is not None:  # the arrays live where the problem computes
            store.to_device(device)
        try:
            if inline:
                # A small model's ops are microseconds long: waking a second
                # intra-op thread costs more than it saves, and far more when
                # another process holds the other core (bench/seed_overhead.py).
                small = w0.size * batch_size <= SMALL_STEP
                with single_torch_thread() if small else contextlib.nullcontext():
                    res = self._run_inline(store, problem, rule, strategy, batch_size, seed,
                                           budget, recorder, ck, resume)
            else:
                threads = ctx is None  # worker threads: BLAS limited as torch is
                with single_torch_thread(), (single_blas_thread() if threads
                                             else contextlib.nullcontext()):
                    res = self._run_workers(store, ctx, problem, rule, strategy, workers,
                                            batch_size, seed, budget, recorder, ck, resume)
        finally:
            store.close()
        res.wall_time_s += resume.time_s
        res.extra.update(run_folder_extra(ck.last_path, resume.path))
        if self.kernel:  # what ran: one update per example
            res.extra.update(batch_size=1, per_example_loop=True)
        return res

    def _slots(self, strategy, w0, workers: int, folder: bool, held) -> dict | None:
        """The store's extra layout of an exact parallel run with a folder
        (a stop's final checkpoint holds them too, not only periodic ones):
        each worker's byte counts (periodic ones), its sender state where the
        compression is stateful, and its model's buffers (``held``, flat;
        None: none) at checkpoint steps (``checkpointing.py``)."""
        if not folder or strategy.single_worker or not checkpoints.exact_checkpoints(strategy):
            return None
        out = traffic_slots(workers)
        if self.compression.stateful:
            out.update(sender_slots(self.compression, w0.size, w0.dtype, workers))
        if held is not None:
            out.update(buffer_slots(held, workers))
        return out

    # -- serial: in the calling thread --------------------------------------
    def _run_inline(self, store, problem, rule, strategy, batch_size, seed, budget, recorder,
                    ck, resume):
        """Serial: the one worker's program runs in the calling thread; between
        its ops, ``_InlineWatch`` checkpoints, stops and records."""
        job = WorkerJob(0, 1, problem.n_examples, batch_size, seed, budget,
                        start_step=resume.positions[0], kernel=self.kernel)
        runtime = WorkerRuntime(0, 1, store, problem, rule, strategy, self.timeout)
        sender = runtime.sender = Sender(self.compression, 0)
        if resume.senders.get(0) is not None:
            sender.restore(resume.senders[0])
        watch = _InlineWatch(self, store, problem, sender, recorder, ck, resume)

        def tally():  # the run's counts so far: its checkpoint's, and this attempt's
            return RunTally.resumed(1, self.compression, resume.totals,
                                    {0: {"staleness": runtime.staleness,
                                         "traffic": sender.stats()}})

        watch.totals = lambda: tally().totals()
        stopped = interrupted = None
        try:
            with _seeded_rng(problem, seed, 0, strategy.gradients_before(job)):
                runtime.run(compressing(strategy.program(job), sender, arrays.nbytes(store.params)),
                            watch)
        except Stopped:
            interrupted = stop_requested()
            stopped = stop_reason(interrupted)
        except Aborted:  # a divergence, or the target (``record_if_due``)
            stopped = recorder.stop_reason or recorder.target_reason
        wall = time.perf_counter() - watch.t0
        ex, up, dropped, late = store.totals()
        watch.due.live(resume.time_s + wall, store.totals, watch.live_figures,
                       final=True)  # the run's last row
        counts = tally()
        return counts.result(np.array(arrays.to_host(store.params), copy=True), 0.0, wall,
                            int(ex), int(up), int(dropped), counts.extra(int(up)),
                            late=int(late), stopped=stopped, interrupted=interrupted)

    # -- parallel: processes or threads --------------------------------------
    def _start_timeout(self, workers: int) -> float:
        """``pool.start_timeout`` for this engine's backend."""
        return start_timeout(self.start_timeout, workers, self.backend == "processes")

    def _run_workers(self, store, ctx, problem, rule, strategy, workers, batch_size, seed,
                     budget, recorder, ck, resume):
        """Start the workers (processes where ``ctx`` is given, else threads),
        then watch them to the end (``monitor.WorkerMonitor``)."""
        t_begin = time.perf_counter()
        pool = WorkerPool(ctx, workers, "monsoon-w")
        start_timeout = self._start_timeout(workers)
        try:
            try:
                self._start_workers(store, pool, problem, rule, strategy, workers, batch_size,
                                    seed, budget, recorder, resume, start_timeout)
                monitor = WorkerMonitor(self, store, pool, problem, strategy, workers,
                                        batch_size, recorder, ck, resume)
            except BaseException:  # the workers started so far end, and the inbox closes
                store.abort()
                pool.join(max(5.0, min(self.timeout, 30.0)))
                raise
            return monitor.run(t_begin, start_timeout)
        finally:  # the workers are joined: a start that failed leaves no data in /dev/shm
            if ctx is not None:  # (once every worker is ready the monitor unlinked it)
                problem.unlink_shared()

    def _start_workers(self, store, pool, problem, rule, strategy, workers, batch_size,
                       seed, budget, recorder, resume, start_timeout):
        """Start a worker per rank with its ``WorkerSetup``: a process gets it
        pickled (``WorkerPool.start``), a thread gets its own copy of the rule."""
        import copy

        ctx = pool.ctx
        # Processes: a problem whose data can live in shared memory is
        # pickled as a reference to it, not one copy per worker.
        sharing = contextlib.ExitStack()
        if ctx is not None:
            sharing.enter_context(problem.shared_data())
        for rank in range(workers):
            job = WorkerJob(rank, workers, problem.n_examples, batch_size, seed, budget,
                            start_step=resume.positions[rank], kernel=self.kernel,
                            synced=resume.updates + resume.dropped)
            setup = WorkerSetup(rank, workers, store, problem.for_worker(rank, workers),
                                rule if ctx is not None else copy.deepcopy(rule),
                                strategy, job, self.timeout, start_timeout,
                                torch_threads_per_worker(workers), live=recorder.evals > 0,
                                checkpoint_every=self.checkpoint_every if store.ckpt else 0,
                                work0=resume.private.get(rank),
                                compression=self.compression,
                                sender_state=resume.senders.get(rank),
                                sync_step=min(resume.positions))
            if ctx is not None:
                pool.start(_process_main, (store.locks, store.sync_lock), setup,
                           setup.torch_threads)
            else:
                pool.start(_worker_body, (setup,))
        pool.send_payloads()
        sharing.close()

    _start_advice = staticmethod(start_advice)

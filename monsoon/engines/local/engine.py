"""The local engine (the default, zero set-up): workers on this machine.

Workers are processes (spawn start method) or threads; the parameters, the
rule state and the counters live in shared memory (``store.py``). ``serial``
runs inline in the calling thread, with no engine overhead at all.

Each worker process sets its torch thread count so that workers x threads
<= cores (oversubscription is a known 30x slowdown).

The calling process is the monitor: it starts the workers and waits (with
``start_timeout``) until every one is ready, which is ``startup_s``; then it
releases them together and, until they finish, evaluates the full loss on
snapshots of the parameters, drives the progress bar, and watches for
failure. Between looks it sleeps on the workers' pipes and process
sentinels (``inbox.py``), so a message or a death wakes it at once; with no
loss curve to record it looks only every ``idle_s`` otherwise. A worker
that raises or dies is named in ``failed_workers``; if the strategy needs
all workers (sync) the others are aborted and the run fails with that
worker's error. If no worker makes progress for twice ``timeout``
seconds (a stuck barrier says so itself after ``timeout``), the run is
aborted: nothing can hang forever.
"""
from __future__ import annotations

import multiprocessing as mp
import contextlib
import os
import pickle
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ...errors import WaitTimeout, WorkerError
from ...options import Option
from ...strategies import WorkerJob
from ..options import SHARDS, TIMEOUT
from ..waiting import Aborted, wait_until
from .inbox import Outbox, PipeInbox, QueueInbox
from .runtime import WorkerRuntime
from .store import ABORTED, DONE, EXAMPLES, FAILED, READY, RUNNING, START, ParameterStore
from .synchronous import replicates

BACKENDS = ("processes", "threads")
# Parameter-server shards default to one per worker, up to this many.
DEFAULT_MAX_SHARDS = 8


@dataclass
class EngineResult:
    params: np.ndarray
    startup_s: float
    wall_time_s: float
    examples: int
    updates: int
    dropped_updates: int
    staleness: Counter
    failed_workers: list = field(default_factory=list)
    late_gradients: int = 0
    worker_params: dict = field(default_factory=dict)  # private copies (local SGD, EASGD)
    worker_states: dict = field(default_factory=dict)  # each worker's buffers (BatchNorm)
    extra: dict = field(default_factory=dict)          # engine-specific summary fields
    stopped: str | None = None   # why the monitor stopped the run early, if it did


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


def torch_threads_per_worker(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


@contextlib.contextmanager
def single_torch_thread():
    """The monitor evaluates the loss while workers hold every core; with
    more than one intra-op thread its evaluation would spin waiting for a
    thread that cannot run (measured: 30x the CPU of a quiet evaluation)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _worker_body(setup: WorkerSetup, messages) -> None:
    store = setup.store
    rank = setup.rank
    try:
        runtime = WorkerRuntime(rank, setup.workers, store, setup.problem, setup.rule,
                                setup.strategy, setup.timeout, setup.live)
        program = setup.strategy.program(setup.job)
        store.status[rank] = READY
        wait_until(lambda: store.control[START], setup.start_timeout + setup.timeout,
                   lambda: store.control[1], "the start signal")
        store.status[rank] = RUNNING
        runtime.run(program)
        store.status[rank] = DONE
        own = None if setup.strategy.shared_params else np.array(runtime.work, copy=True)
        messages.put(("done", rank, {"staleness": dict(runtime.staleness), "params": own,
                                     "state": _state(setup.problem)}))
    except Aborted:
        store.status[rank] = ABORTED
        messages.put(("aborted", rank, {"staleness": dict(runtime.staleness), "params": None,
                                        "state": _state(setup.problem)}))
    except BaseException as exc:  # noqa: BLE001 - reported to the monitor, by name
        store.status[rank] = FAILED
        messages.put(("failed", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _state(problem):
    """The worker's buffers (``Problem.state``), if its problem has any."""
    state = getattr(problem, "state", None)
    return state() if state is not None else None


@contextlib.contextmanager
def _main_module_hidden(needed: bool):
    """Spawned children re-run the parent's ``__main__`` script unless it is
    hidden; a script that calls ``monsoon.train`` without an
    ``if __name__ == "__main__":`` guard would then start workers from its
    workers. Workers need ``__main__`` only when the payload refers to
    something defined there (a user's own module class), so hide it otherwise."""
    main = sys.modules.get("__main__")
    if needed or main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)


@contextlib.contextmanager
def _blas_threads(threads: int):
    """Spawned workers read these when NumPy loads its BLAS: give each the
    same share of the cores as its torch threads (the parent's are kept)."""
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update({k: str(threads) for k in names})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


MAIN_HINT = ("; the problem refers to code in your script, which every worker process "
             "re-runs: put the call to monsoon under `if __name__ == \"__main__\":`, "
             "or use --backend threads")


def _process_main(payload: bytes, locks, sync_lock, conn) -> None:
    import pickle

    import torch

    outbox = Outbox(conn)
    setup = pickle.loads(payload)
    setup.store.attach_locks(locks, sync_lock)
    torch.set_num_threads(setup.torch_threads)
    _worker_body(setup, outbox)
    outbox.close()


class LocalEngine:
    name = "local"
    virtual_time = False
    options = (
        Option("backend", str, "auto", "processes, threads, or auto: threads for problems with "
               "a compiled GIL-free loop (sparse), else processes",
               choices=("auto",) + BACKENDS),
        TIMEOUT, SHARDS)

    @classmethod
    def from_options(cls, run, backend="auto", timeout=60.0, shards=None):
        if backend == "auto":  # compiled loops release the GIL: threads share the data
            backend = "threads" if hasattr(run.problem, "sgd_pass") else "processes"
        return cls(backend=backend, timeout=timeout, shards=shards)

    def __init__(self, backend: str = "processes", timeout: float = 60.0,
                 start_timeout: float = 120.0, shards: int | None = None, poll_s: float = 0.02,
                 idle_s: float = 1.0):
        self.backend = backend
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.shards = shards
        self.poll_s = poll_s    # how often the monitor looks, when rows can be due
        self.idle_s = idle_s    # ... and when nothing is recorded (messages wake it)

    def describe(self) -> dict:
        return {"engine": self.name, "backend": self.backend, "timeout_s": self.timeout}

    @staticmethod
    def uses_kernel(problem, rule, strategy, budget) -> bool:
        """Hogwild!/serial on a problem with a compiled per-example SGD loop,
        plain SGD, an epoch budget: run the loop, not mini-batches."""
        return (hasattr(problem, "sgd_pass") and rule.name == "sgd" and not rule.staleness_lr
                and budget.epochs is not None and strategy.name in ("serial", "hogwild"))

    def run(self, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder):
        self.kernel = self.uses_kernel(problem, rule, strategy, budget)
        if self.kernel:
            problem.prepare_kernel()
        shards = self.shards or min(workers, DEFAULT_MAX_SHARDS)
        shards = max(1, min(shards, w0.size))
        inline = strategy.single_worker
        backend = "inline" if inline else self.backend
        self.backend_used = backend
        ctx = mp.get_context("spawn") if backend == "processes" else None
        store = ParameterStore(w0, rule, workers, shards, sync_slots=strategy.synchronous,
                               backend=backend, mp_context=ctx,
                               replicated=not inline and replicates(strategy, w0))
        self.shards_used = shards
        try:
            if inline:
                return self._run_inline(store, problem, rule, strategy, batch_size, seed,
                                        budget, recorder)
            with single_torch_thread():
                return self._run_workers(store, ctx, problem, rule, strategy, workers,
                                         batch_size, seed, budget, recorder)
        finally:
            store.close()

    # -- serial: in the calling thread --------------------------------------
    def _run_inline(self, store, problem, rule, strategy, batch_size, seed, budget, recorder):
        job = WorkerJob(0, 1, problem.n_examples, batch_size, seed, budget, kernel=self.kernel)
        runtime = WorkerRuntime(0, 1, store, problem, rule, strategy, self.timeout)
        recorder.start(store.params)
        clock = [time.perf_counter(), 0]  # start, ops so far

        def between_ops():
            clock[1] += 1
            if clock[1] & 7 == 0:
                now = time.perf_counter() - clock[0]
                ex = store.counters[:, EXAMPLES].sum()
                if recorder.due(now, ex):
                    ex, up, dropped, late = store.totals()
                    if recorder.record(now, int(up), int(ex), store.params, int(dropped)) is not None:
                        store.abort()
                    # The clock stops while serial evaluates: parallel runs
                    # evaluate in the monitor, off the workers' clock.
                    clock[0] += time.perf_counter() - clock[0] - now

        stopped = None
        try:
            runtime.run(strategy.program(job), between_ops)
        except Aborted:
            stopped = recorder.stop_reason
        wall = time.perf_counter() - clock[0]
        ex, up, dropped, late = store.totals()
        return EngineResult(np.array(store.params, copy=True), 0.0, wall, int(ex), int(up),
                            int(dropped), runtime.staleness, [], stopped=stopped,
                            late_gradients=int(late))

    # -- parallel: processes or threads --------------------------------------
    def _run_workers(self, store, ctx, problem, rule, strategy, workers, batch_size, seed,
                     budget, recorder):
        import copy

        t_begin = time.perf_counter()
        inbox = PipeInbox(ctx, workers) if ctx is not None else QueueInbox()
        handles = []
        needs_main = False
        # Processes: a problem whose data can live in shared memory is
        # pickled as a reference to it, not one copy per worker.
        sharing = contextlib.ExitStack()
        if ctx is not None and hasattr(problem, "shared_data"):
            sharing.enter_context(problem.shared_data())
        for rank in range(workers):
            job = WorkerJob(rank, workers, problem.n_examples, batch_size, seed, budget,
                            kernel=self.kernel)
            setup = WorkerSetup(rank, workers, store, problem.for_worker(rank, workers),
                                rule if ctx is not None else copy.deepcopy(rule),
                                strategy, job, self.timeout, self.start_timeout,
                                torch_threads_per_worker(workers), live=recorder.evals > 0)
            if ctx is not None:
                # Plain pickle, not multiprocessing's: torch's reducers would
                # try to pass tensors as file descriptors.
                payload = pickle.dumps(setup, protocol=pickle.HIGHEST_PROTOCOL)
                needs_main = b"__main__" in payload
                h = ctx.Process(target=_process_main,
                                args=(payload, store.locks, store.sync_lock, inbox.senders[rank]),
                                name=f"monsoon-worker-{rank}", daemon=True)
                with _main_module_hidden(needs_main), _blas_threads(setup.torch_threads):
                    h.start()
                inbox.started(rank, h)
                handles.append(h)
                continue
            else:
                h = threading.Thread(target=_worker_body, args=(setup, inbox.outbox(rank)),
                                     name=f"monsoon-worker-{rank}", daemon=True)
            h.start()
            handles.append(h)
        sharing.close()
        failed: dict[int, str] = {}
        worker_params: dict[int, np.ndarray] = {}
        worker_states: dict[int, dict] = {}
        started_at = [None]
        staleness = Counter()
        finished: set[int] = set()

        def drain(block_s: float = 0.0):
            for kind, rank, payload in inbox.receive(block_s, finished):
                finished.add(rank)
                if kind == "failed":
                    failed[rank] = payload
                elif kind in ("done", "aborted"):
                    staleness.update(payload["staleness"])
                    if payload["params"] is not None:
                        worker_params[rank] = payload["params"]
                    if payload.get("state"):
                        worker_states[rank] = payload["state"]

        def check_dead():
            if ctx is None:
                return
            for rank, h in enumerate(handles):
                if rank not in finished and h.exitcode is not None:
                    drain(0.2)  # its last message may still be in the pipe
                    if rank not in finished:
                        finished.add(rank)
                        hint = MAIN_HINT if started_at[0] is None and needs_main else ""
                        failed[rank] = f"worker process died (exit code {h.exitcode}){hint}"

        stopped = None
        try:
            # start-up: every worker imported, unpickled and ready
            deadline = time.monotonic() + self.start_timeout
            while not all(store.status[r] == READY or r in finished for r in range(workers)):
                drain()
                check_dead()
                if self._must_stop(strategy, failed, workers):
                    raise self._fail(failed, workers)
                if len(finished) == workers:
                    break
                if time.monotonic() > deadline:
                    raise WaitTimeout(f"workers did not start within {self.start_timeout:g} s")
                time.sleep(0.005)
            startup = time.perf_counter() - t_begin
            started_at[0] = startup
            recorder.start(store.params)
            t0 = time.perf_counter()
            store.control[START] = 1
            snapshot = np.empty_like(store.params)
            last_progress, last_examples = time.monotonic(), -1
            while len(finished) < workers:
                # Poll fast while the run is young (short runs still get a
                # curve), then settle, so the monitor steals little CPU; with
                # no curve to draw, sleep until a worker reports or dies.
                if recorder.evals > 0:
                    drain(0.002 if time.perf_counter() - t0 < 1.0 else self.poll_s)
                else:
                    drain(self.idle_s)
                check_dead()
                if self._must_stop(strategy, failed, workers):
                    raise self._fail(failed, workers)
                now = time.perf_counter() - t0
                ex, up, dropped, late = store.totals()
                if ex != last_examples:
                    last_examples, last_progress = ex, time.monotonic()
                elif time.monotonic() - last_progress > 2 * self.timeout:
                    # A backstop: a stuck barrier reports itself (and who it
                    # waited for) after ``timeout``; this catches the rest.
                    raise WaitTimeout(f"no worker made progress for {2 * self.timeout:g} s; "
                                      "raise --timeout if steps are genuinely that slow")
                if recorder.due(now, ex):
                    np.copyto(snapshot, store.params)
                    reason = recorder.record(now, int(up), int(ex), snapshot, int(dropped))
                    if reason is not None:
                        stopped = reason
                        store.abort()
            wall = time.perf_counter() - t0
            ex, up, dropped, late = store.totals()
            params = np.array(store.params, copy=True)
        except BaseException:
            store.abort()
            inbox.close()  # a worker still sending gets a broken pipe, not a wait
            self._join(handles, ctx)
            raise
        self._join(handles, ctx)
        inbox.close()
        failed_list = [{"worker": r, "error": failed[r].splitlines()[0], "traceback": failed[r]}
                       for r in sorted(failed)]
        extra = {}
        if strategy.synchronous:
            extra["sync_step"] = "replicated" if store.replicated else "sharded"
        return EngineResult(params, startup, wall, int(ex), int(up), int(dropped), staleness,
                            failed_list, stopped=stopped, late_gradients=int(late),
                            worker_params=worker_params, worker_states=worker_states,
                            extra=extra)

    @staticmethod
    def _must_stop(strategy, failed: dict, workers: int) -> bool:
        """Sync cannot lose more workers than it has backups; nobody can lose all."""
        return len(failed) == workers or (strategy.needs_all_workers
                                          and len(failed) > strategy.backup_workers)

    @staticmethod
    def _fail(failed: dict, workers: int) -> WorkerError:
        rank = min(failed)
        text = failed[rank]
        why = "every worker failed" if len(failed) == workers else "this strategy needs every worker"
        err = WorkerError(f"worker {rank} failed, and {why}: {text.splitlines()[0]}")
        err.worker = rank
        err.worker_traceback = text
        return err

    def _join(self, handles, ctx) -> None:
        deadline = time.monotonic() + max(5.0, min(self.timeout, 30.0))
        for h in handles:
            h.join(max(0.0, deadline - time.monotonic()))
        if ctx is not None:
            for h in handles:
                if h.is_alive():
                    h.terminate()
                    h.join(2.0)
                if h.is_alive():
                    h.kill()
                    h.join(2.0)

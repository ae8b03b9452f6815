"""Starting worker processes on this machine: what every engine that
spawns them shares (the local engine's workers, its pipeline's stages).

- ``torch_threads_per_worker``: workers x threads <= cores
  (oversubscription is a known 30x slowdown);
- ``blas_threads``: the same share for the BLAS a spawned child loads;
- ``environment``: variables set for the children started meanwhile and
  restored after (``blas_threads``, the fork server's start, the torch
  launcher's agent and ranks);
- ``single_torch_thread``, ``single_blas_thread``: one thread for the
  monitor's torch, and for worker threads' shared BLAS;
- ``main_module_hidden``: a spawned child does not re-run the parent's
  ``__main__`` script unless its payload needs it, and one that does and
  reaches a call to monsoon (no ``__main__`` guard) leaves quietly
  (``leave_if_re_running_main``);
- ``start_context``: workers are forked from a fork server that has
  imported monsoon (and torch, where the parent uses it) once, instead of
  each importing them anew; its OpenBLAS has one thread, so that a forked
  worker starts no BLAS threads it was not given.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time

from .lifecycle import STOP_SIGNALS

# What the fork server imports before it forks any worker; with torch
# where the parent has it (the pipeline's stages run torch modules).
PRELOAD = ("monsoon.monitor.fork_server", "monsoon.engines.local.engine")
PRELOAD_TORCH = ("torch", "monsoon.engines.local.pipeline")
# The fork server's OpenBLAS (NumPy's and SciPy's each) starts with one thread.
# With a pool of one per core, every forked worker's ``limit_threads`` (even to
# one thread) rebuilds that pool after the fork: threads that busy-wait
# (OpenBLAS's thread timeout) on the cores the workers start computing on. A
# worker given more threads gets them from ``limit_threads``.
FORK_SERVER_BLAS = {"OPENBLAS_NUM_THREADS": "1"}


def start_context():
    """The multiprocessing context worker processes start from.

    A fork server (Python 3.14's default start method on Linux): one
    process, started at the first run of this Python process, imports
    monsoon, and torch when the parent has imported it (a torch problem),
    then forks each worker in milliseconds. Spawned from scratch, each
    worker would import them itself, about two seconds for torch. The
    fork server imports only: no thread pool or CUDA context exists in it
    when it forks, and its OpenBLAS has one thread (``FORK_SERVER_BLAS``):
    each worker sets its own share (``limit_threads``). It is started
    here, by this thread, and told this process's pid, so that it dies
    with this process (``lifecycle.tie_fork_server``); a worker's parent is
    the fork server, and each worker also watches a pipe from this process
    (``lifecycle.worker_started``). Where there is no fork server (not on
    Linux or macOS), workers are spawned."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    from multiprocessing import forkserver, resource_tracker

    from .lifecycle import FORK_SERVER_ENV, fork_server_env

    ctx = mp.get_context("forkserver")
    # Read when the server starts, which happens once: later calls change nothing.
    torch = PRELOAD_TORCH if "torch" in sys.modules else ()
    ctx.set_forkserver_preload(list(PRELOAD[:1] + torch + PRELOAD[1:]))
    # PR_SET_PDEATHSIG follows the thread that started a process: the fork
    # server relies on it only if the main thread starts it
    main = threading.current_thread() is threading.main_thread()
    with environment({FORK_SERVER_ENV: fork_server_env(main), **FORK_SERVER_BLAS}):
        # the resource tracker first: starting it unblocks SIGINT afterwards
        # (it blocks and unblocks it around its own start, as here)
        resource_tracker.ensure_running()
        with stop_signals_blocked(), start_method_kept():
            forkserver.ensure_running()
    return ctx


@contextlib.contextmanager
def start_method_kept():
    """Starting a process (or the fork server) asks multiprocessing for the
    default start method, which fixes it as a side effect; where the user
    had set none, none is set after, so their own
    ``multiprocessing.set_start_method`` still works after a run."""
    default = mp.context._default_context
    unset = default._actual_context is None
    try:
        yield
    finally:
        if unset:
            default._actual_context = None


@contextlib.contextmanager
def stop_signals_blocked():
    """SIGINT and SIGTERM blocked in this thread meanwhile (one that arrives
    is delivered after): a process started from it inherits the blocked
    signals, so Ctrl-C or a SIGTERM to the process group (``timeout``)
    cannot kill the fork server while its interpreter starts, before it can
    ignore them itself (``lifecycle.tie_fork_server``)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    saved = signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, saved)


def torch_threads_per_worker(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


def leave_if_re_running_main() -> None:
    """Called where a run starts: a worker process that re-runs the user's
    script (its ``__main__``, needed when the problem refers to code there)
    and reaches a call to monsoon, unguarded by ``if __name__ ==
    "__main__":``, exits at once and quietly, before it starts anything or
    prints a traceback; the parent names the cause (the local monitor's
    ``MAIN_HINT``). ``_inheriting`` is multiprocessing's own mark of a child
    still importing its parent's main module."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise SystemExit(1)


@contextlib.contextmanager
def main_module_hidden(needed: bool):
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
def environment(values: dict):
    """``values`` in this process's environment meanwhile, for the children
    started then (None: the variable unset), and the variables as they were
    after, also where something else changed them meanwhile."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        _set_environment(values)
        yield
    finally:
        _set_environment(saved)


def _set_environment(values: dict) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def blas_threads(threads: int):
    """Spawned workers read these when NumPy loads its BLAS: give each the
    same share of the cores as its torch threads (the parent's are kept).
    A forked worker's BLAS is loaded already: ``limit_threads`` sets it."""
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    return environment(dict.fromkeys(names, str(threads)))


@contextlib.contextmanager
def single_torch_thread():
    """The monitor evaluates the loss while workers hold every core; with
    more than one intra-op thread its evaluation would spin waiting for a
    thread that cannot run."""
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


@contextlib.contextmanager
def single_blas_thread():
    """Worker threads share the process's BLAS: one thread each. OpenBLAS
    splits an axpy or asum of more than 10,000 elements over its own
    threads, which then spin on the cores the workers need, slowing
    Hogwild! and sync on dense models severalfold (bench/hogwild_vs_torch.py)."""
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def limit_threads(threads: int, torch_problem: bool = False) -> None:
    """In a worker process: ``threads`` threads for its BLAS and for torch
    (when the worker's problem loaded it), whatever the process inherited.
    A torch problem's BLAS gets one: torch computes, and OpenBLAS's threads,
    woken by monsoon's passes over the flat vector (asum, axpy), would spin
    beside torch's on the same cores (``single_blas_thread``)."""
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency

    threadpool_limits(limits=threads)
    if torch_problem:
        threadpool_limits(limits=1, user_api="blas")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def join_or_kill(handles, wait_s: float) -> None:
    """Join worker processes (threads: only joined), all within ``wait_s``;
    a process still alive then is killed: a pool's workers ignore SIGTERM
    (``lifecycle.worker_started``), so it would only add a wait. No process
    outlives the run that started it."""
    deadline = time.monotonic() + wait_s
    for h in handles:
        h.join(max(0.0, deadline - time.monotonic()))
    for h in handles:
        if h.is_alive() and hasattr(h, "kill"):
            h.kill()
            h.join(2.0)

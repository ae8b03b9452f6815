"""The one worker pool of a monitor on this machine (``WorkerPool``: the
local engine's monitor and its pipeline runner start theirs with it,
processes in ``_worker_process``, and watch them with it): start the
workers, wait until every one is ready (``await_ready``, within
``start_timeout``, with ``start_advice`` when they do not start), take
their reports, name the lost, and join them; and the one rule for when
lost workers fail a run (``fail_if_lost``), on every engine.

Every worker sends exactly one message when it stops: ``("done" | "aborted"
| "stopped" | "failed", rank, payload)``; a pipeline stage first sends
``("ready", rank, None)``.

- Processes (``PipeInbox``): one pipe per worker. The monitor blocks in
  ``multiprocessing.connection.wait`` on the pipes and on the processes'
  sentinels of the workers still running, so it wakes at once for a
  message or a death, and otherwise sleeps for as long as it is told (when
  nothing is to be recorded, a second at a time). A monitor that wakes
  just to look preempts a worker on a machine whose cores the workers
  hold, and its peer waits at the barrier (``bench/seed_overhead.py``).
- Threads (``QueueInbox``): one queue; a thread cannot die without its
  ``finally`` sending the message. Each message also rings a socket (the
  doorbell), so the monitor waits on it and on the stop signals' wake-up
  socket in the same ``wait`` as on the pipes: a signal wakes it at once
  on either backend (a lock wait would sleep the signal through).

A large message (local SGD's private parameters) blocks its sender until
the monitor reads it, which it does as soon as the pipe is readable.
"""
from __future__ import annotations

import os
import pickle
import queue
import socket
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait

from ..errors import WaitTimeout, WorkerError
from .heap import keep_freed_memory
from .lifecycle import worker_started
from .processes import blas_threads, join_or_kill, main_module_hidden, start_method_kept


class Outbox:
    """A worker process's end of its pipe."""

    def __init__(self, conn):
        self.conn = conn

    def put(self, message) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the monitor is gone: nobody is left to tell

    def close(self) -> None:
        self.conn.close()


class PipeInbox:
    def __init__(self, ctx, workers: int):
        pipes = [ctx.Pipe(duplex=False) for _ in range(workers)]
        self.receivers = [r for r, _ in pipes]
        self.senders = [s for _, s in pipes]
        self.sentinels: list = [None] * workers

    def outbox(self, rank: int):
        return self.senders[rank]

    def started(self, rank: int, process) -> None:
        """The child has its copy of the sender: close ours, so that its
        death reads as end-of-file rather than as silence."""
        self.sentinels[rank] = process.sentinel
        self.senders[rank].close()

    def receive(self, timeout: float, finished: set, wake=None) -> list:
        """The messages that arrive within ``timeout`` seconds (returning
        early on the first message or death, or when ``wake``, a socket a
        signal handler writes to, is readable) from workers not ``finished``."""
        watched = {}
        for rank, conn in enumerate(self.receivers):
            if rank not in finished:
                watched[conn] = rank
                if self.sentinels[rank] is not None:
                    watched[self.sentinels[rank]] = rank
        if not watched:
            return []
        messages = []
        for ready in wait(list(watched) + ([wake] if wake is not None else []), timeout):
            if ready is wake:
                _empty(wake)
                continue
            if ready is self.receivers[watched[ready]]:
                try:
                    messages.append(ready.recv())
                except (EOFError, OSError):
                    pass  # died mid-message: the sentinel and exit code tell
        return messages

    def close(self) -> None:
        for conn in self.receivers + self.senders:
            conn.close()


class QueueInbox:
    """The worker threads' queue (each thread's outbox is this inbox), and
    its doorbell: a socket pair, rung after each message is queued and
    emptied before the queue is looked at, so that a message queued while
    the monitor waits wakes it. The lock keeps a ring off a closed socket."""

    def __init__(self):
        self.queue = queue.Queue()
        self.bell, self.ringer = socket.socketpair()
        for s in (self.bell, self.ringer):
            s.setblocking(False)
        self.lock = threading.Lock()

    def outbox(self, rank: int):
        return self

    def put(self, message) -> None:
        """A worker thread's message."""
        with self.lock:
            self.queue.put(message)
            if self.ringer.fileno() >= 0:  # else closed: nobody is left to tell
                try:
                    self.ringer.send(b"\0")
                except BlockingIOError:
                    pass  # a full buffer rings already

    def receive(self, timeout: float, finished: set, wake=None) -> list:
        """The messages queued now or, if none, within ``timeout`` seconds
        (returning early on the first, or when ``wake`` is readable)."""
        _empty(self.bell)
        messages = self._queued()
        if not messages and timeout > 0:
            if wake in wait([self.bell] + ([wake] if wake is not None else []), timeout):
                _empty(wake)
            messages = self._queued()
        return messages

    def _queued(self) -> list:
        messages = []
        try:
            while True:
                messages.append(self.queue.get_nowait())
        except queue.Empty:
            return messages

    def close(self) -> None:
        with self.lock:
            self.bell.close()
            self.ringer.close()


def _empty(sock) -> None:
    """Read what a wake-up socket holds, so that it waits again."""
    try:
        while sock.recv(4096):
            pass
    except OSError:  # nothing left (BlockingIOError), or closed
        pass


class WorkerPool:
    """Workers (processes where ``ctx`` is given, else threads) as their
    monitor knows them: who said it is ``ready``, who ``finished`` (sent its
    last message or died), who ``failed`` (rank -> why), and each other last
    message (``reports``: rank -> (kind, payload)); ``needs_main``: a
    process's payload refers to ``__main__``."""

    def __init__(self, ctx, workers: int, name: str):
        self.ctx, self.name = ctx, name
        self.inbox = PipeInbox(ctx, workers) if ctx is not None else QueueInbox()
        self.handles: list = []
        self.ready, self.finished, self.failed, self.reports = set(), set(), {}, {}
        self.needs_main, self.payloads = False, []

    def start(self, target, args: tuple, payload=None, threads: int = 1) -> None:
        """Start the next rank's worker: a thread, ``target(outbox, *args)``,
        or a process (``_worker_process``), ``target(reader, outbox, *args)``,
        with as many BLAS ``threads`` as torch ones (a second one stalls for
        milliseconds while a neighbour holds the other core), the parent's
        ``__main__`` only where ``payload`` refers to it, and a pipe
        (``reader``) it reads ``payload`` from, pickled, once all have started
        (``send_payloads``; a large one passed to ``Process.start`` would
        hold the next start until this child had imported monsoon). Named
        ``name`` + rank."""
        rank, name = len(self.handles), f"{self.name}{len(self.handles)}"
        outbox = self.inbox.outbox(rank)
        if self.ctx is None:
            h = threading.Thread(target=target, args=(outbox, *args), name=name, daemon=True)
            h.start()
        else:
            reader, writer = self.ctx.Pipe(duplex=False)
            h = self.ctx.Process(target=_worker_process, name=name, daemon=True,
                                 args=(name, outbox, target, reader, *args))
            # Plain pickle, not multiprocessing's: torch's reducers would
            # try to pass tensors as file descriptors.
            payload = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
            needs_main = b"__main__" in payload
            self.needs_main = self.needs_main or needs_main
            with main_module_hidden(needs_main), blas_threads(threads), start_method_kept():
                h.start()
            reader.close()  # the child's end
            self.payloads.append((writer, payload))
            self.inbox.started(rank, h)
        self.handles.append(h)

    def send_payloads(self) -> None:
        """Each started process's payload, through its own pipe."""
        for writer, payload in self.payloads:
            try:
                writer.send_bytes(payload)
            except OSError:  # it died before reading: its monitor names it
                pass
            finally:
                writer.close()
        self.payloads = []

    def drain(self, block_s: float = 0.0, wake=None, hint: str = "") -> list:
        """Take the workers' messages (waiting up to ``block_s`` for one, or
        for ``wake``), and name each process that ended without a last
        message as failed, with its exit code and ``hint``: their ranks."""
        self._take(block_s, wake)
        lost = []
        for rank, h in enumerate(self.handles):
            if rank not in self.finished and getattr(h, "exitcode", None) is not None:
                self._take(0.2)  # its last message may still be in the pipe
                if rank not in self.finished:
                    self.finished.add(rank)
                    self.failed[rank] = f"worker process died (exit code {h.exitcode}){hint}"
                    lost.append(rank)
        return lost

    def _take(self, block_s: float, wake=None) -> None:
        for kind, rank, payload in self.inbox.receive(block_s, self.finished, wake):
            if kind == "ready":
                self.ready.add(rank)
                continue
            self.finished.add(rank)
            if kind == "failed":
                self.failed[rank] = payload
            else:
                self.reports[rank] = (kind, payload)

    def await_ready(self, ready, start_timeout: float, due, on_signal, check, advice: str,
                    drain=None, block_s: float = 0.005, ends_when_stopped: bool = True) -> None:
        """Wait until ``ready()`` (or every worker has finished), taking the
        workers' messages meanwhile (``drain(block_s)``, ``self.drain`` if
        none given) and calling ``check()`` after each (it raises for the
        lost workers that fail the run). The first stop signal (``due.signal``)
        calls ``on_signal()`` (stop the workers: nothing is done yet), and
        the wait goes on until each has seen it. Past ``start_timeout``
        seconds, ``WaitTimeout(advice)``; once stopped, the wait ends instead
        where ``ends_when_stopped`` (those still starting are killed at the
        end: ``join``); a caller whose next wait needs every worker started
        (the pipeline's stages) keeps the timeout."""
        deadline = time.monotonic() + start_timeout
        drain = drain or self.drain
        while not ready() and len(self.finished) < len(self.handles):
            drain(block_s)
            check()
            if due.signal():
                on_signal()
            if time.monotonic() > deadline:
                if ends_when_stopped and due.interrupted is not None:
                    return
                raise WaitTimeout(advice)

    def join(self, wait_s: float) -> None:
        """Close the pipes (a worker still sending gets a broken pipe, not a
        wait), then join the workers, killing any alive after ``wait_s``."""
        self.inbox.close()
        for writer, _ in self.payloads:  # never sent: a process waiting for it ends
            writer.close()
        join_or_kill(self.handles, wait_s)


def _worker_process(name: str, conn, target, reader, *args) -> None:
    """A worker process: first, die with the monitor and leave Ctrl-C to it
    (``lifecycle.worker_started``); then ``target(reader, outbox, *args)``."""
    worker_started(name=name)
    keep_freed_memory()  # a step's activations are not mmapped and unmapped every step
    outbox = Outbox(conn)
    target(reader, outbox, *args)
    outbox.close()


def failure(rank: int, exc: BaseException) -> tuple:
    """The last message of a worker that ``exc`` ended (in its ``except``):
    the error's type and text, then its traceback."""
    return ("failed", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")


def read_payload(reader):
    """In a worker process: the payload its pool sent (``WorkerPool.start``), unpickled."""
    try:
        return pickle.loads(reader.recv_bytes())
    finally:
        reader.close()


def fail_if_lost(failed: dict, strategy, workers: int, who=None,
                 needs: str = "this strategy needs every worker",
                 lost: int | None = None) -> None:
    """The one rule for when lost workers fail a run, on every engine that
    carries on without some: when every worker failed, or when the strategy
    needs every worker and more failed than its backup workers cover. Then
    it raises a ``WorkerError`` naming ``lost`` (the rank whose loss is
    checked now; default: the lowest failed) with the first line of its
    reason (``failed``: rank -> reason; the whole text in
    ``worker_traceback``); else the others carry on. ``who(rank)`` names a
    worker (``worker {rank}`` if not given); ``needs`` says why one lost
    worker fails the run (a pipeline: every stage)."""
    if not failed or not (len(failed) == workers or (
            strategy.needs_all_workers and len(failed) > strategy.backup_workers)):
        return
    rank = min(failed) if lost is None else lost
    why = "every worker failed" if len(failed) == workers else needs
    name = who(rank) if who is not None else f"worker {rank}"
    err = WorkerError(f"{name} failed, and {why}: {failed[rank].splitlines()[0]}")
    err.worker = rank
    err.worker_traceback = failed[rank]
    raise err


def start_timeout(seconds: float, workers: int, processes: bool) -> float:
    """How long ``workers`` may take to start: ``seconds``, more where
    worker processes are many for the cores (each imports NumPy and torch:
    about a second of one core), with a warning where they are very many."""
    cores = os.cpu_count() or 1
    if not processes:
        return seconds
    if workers > 4 * cores:
        print(f"monsoon: warning: {workers} worker processes on {cores} cores take a while "
              "to start and then share the cores; --backend threads, or fewer --workers, "
              "starts at once", file=sys.stderr)
    return seconds * max(1.0, workers / (2 * cores))


def start_advice(workers: int, waited: float) -> str:
    """What to do when ``workers`` worker processes did not start within ``waited`` s."""
    cores = os.cpu_count() or 1
    return (f"{workers} worker processes did not start within {waited:g} s on {cores} "
            f"cores; use fewer --workers (at most {2 * cores} start quickly here) or "
            "--backend threads")

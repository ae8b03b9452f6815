"""One long Spark job per worker: its task trains segment after segment,
exchanging with the driver's server over a socket.

DeepDist (seed 004) ran this way: each partition's task fetched the model
from the driver's HTTP server, trained and posted the update, within one
``mapPartitions``. A Spark job per push costs its scheduling
(``bench/spark_overhead.py``: 50-300 ms), which forced a push period of a
quarter of an epoch, where async SGD lags sync; a round trip over a socket
costs far less (the summary's ``exchange_s``) and sizes the push period.

The protocol (``barrier.send/receive``: a length, then a pickle), between
the driver's worker thread k (``server.py``) and the task of partition k:

    task   -> ("hello", k)                              on (re)connecting
    driver -> ("segment", job, w, ticket, rule, own, sender)
    task   -> the segment's result (``tasks.run_segment``)
    driver -> ("sums", W, per_block)    task -> per_block(block, W)
    driver -> ("end",)                  the task returns

Exactly once: the driver applies a segment's result only when it has it
whole. A task that fails, or whose executor is lost, is run again by Spark
(its retries); the new attempt connects, replacing the old connection, and
is sent the segment the driver still waits for, from the same start step,
parameters and state, so a lost attempt's work is never applied and a
retried segment is applied once.

Where the executors hold fewer slots than workers (or allocate them
dynamically), a long task would keep a worker from starting at all: each
segment is then a Spark job of its own (``JobLink``, the same ``call``),
and the loss is evaluated by jobs.

``sums``: while the tasks hold every slot, a Spark job that evaluates the
loss would wait for one, so the driver asks the tasks themselves
(``SparkHeld.streams``); the monitor falls back to a job once a worker's
task has left.

Waits: a task waits at most ``IDLE_FACTOR`` times the run's timeout for
the driver's next message, then returns. The driver polls every ``POLL_S``
for the run's stop; the monitor cancels a worker's job whose segment runs
past ``--timeout`` (``DriverServer._cancel_stuck``).
"""
from __future__ import annotations

import select
import socket
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

from ...errors import WorkerError
from .barrier import driver_host, receive, send
from .jobs import short_error

POLL_S = 0.2
IDLE_FACTOR = 3


class Stopped(Exception):
    """The run has stopped, or this worker is out: its thread returns."""


def stream_task(strategy, deltas, address, timeout):
    """The long task of one worker (a Spark partition function)."""
    def run(blocks):
        from .tasks import run_segment

        (block,) = list(blocks)
        sock = socket.create_connection(address, timeout=timeout)
        sock.settimeout(IDLE_FACTOR * timeout)
        try:
            send(sock, ("hello", block.index))
            while True:
                try:
                    message = receive(sock, timeout)
                except (socket.timeout, ConnectionError):
                    return []  # the driver has gone or stopped answering
                kind = message[0]
                if kind == "end":
                    return [True]
                if kind == "segment":
                    send(sock, run_segment(block, strategy, *message[1:], deltas=deltas))
                elif kind == "sums":
                    _, W, per_block = message
                    send(sock, per_block(block, W))
                else:
                    raise ValueError(f"unknown message {kind!r} from the driver")
        finally:
            sock.close()

    return run


class TaskLink:
    """The driver's end of worker k's long job: starts the job, answers
    its (re)connections, and carries one message and its answer at a time
    (``call``). Used by worker k's thread alone."""

    def __init__(self, ctx, k: int, strategy, deltas: bool):
        self.ctx = ctx
        self.server = socket.create_server(("", 0))
        self.server.settimeout(POLL_S)
        address = (driver_host(ctx.sc), self.server.getsockname()[1])
        task = stream_task(strategy, deltas, address, ctx.timeout)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"monsoon-spark-job-{k}",
                                        initializer=ctx.jobs.join_group, initargs=(k,))
        self.future = self._pool.submit(ctx.sc.runJob, ctx.blocks, task, [k])
        self.conn = None

    def call(self, message, alive):
        """Send ``message`` to the task and return its answer, sending it
        again to a retried attempt; ``alive()`` False raises ``Stopped``;
        a job that Spark gave up on raises ``WorkerError``."""
        sent = False
        while True:
            if not alive():
                raise Stopped
            if self.conn is None:
                if not self._connect():
                    continue
                sent = False
            if not sent:
                try:
                    self.conn.settimeout(self.ctx.timeout)
                    send(self.conn, message)
                    self.conn.settimeout(POLL_S)
                    sent = True
                except OSError:  # a timeout too: a message cut midway breaks the stream
                    self._drop()
                    continue
            try:
                return receive(self.conn, self.ctx.timeout)
            except socket.timeout:
                if self._newer():  # Spark runs the task again: the old attempt is lost
                    sent = False
                continue
            except OSError:  # the attempt died: Spark runs the task again, or fails the job
                self._drop()

    def connect(self, alive) -> None:
        """Wait for the task's first connection (Spark launching it)."""
        while self.conn is None:
            if not alive():
                raise Stopped
            self._connect()

    def _connect(self) -> bool:
        if self.future.done():
            exc = self.future.exception()
            if exc is not None:
                raise WorkerError(short_error(exc))
            raise WorkerError("its Spark task ended before the worker's program did")
        try:
            conn, _ = self.server.accept()
        except socket.timeout:
            return False
        conn.settimeout(POLL_S)
        try:
            receive(conn, self.ctx.timeout)  # the attempt's hello
        except (socket.timeout, OSError):
            conn.close()
            return False
        self.conn = conn
        return True

    def _newer(self) -> bool:
        """Whether a new attempt has connected (its executor lost, Spark ran
        the task again elsewhere): it replaces the old connection."""
        if not select.select([self.server], [], [], 0)[0]:
            return False
        old, self.conn = self.conn, None
        if self._connect():
            old.close()
            return True
        self.conn = old
        return False

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def close(self, wait_s: float) -> None:
        """Tell the task to return (where it is connected) and wait at most
        ``wait_s`` for its job to end; the engine cancels what is left."""
        if self.conn is not None:
            try:
                send(self.conn, ("end",))
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        while not self.future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._drop()
        self.server.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class JobLink:
    """``TaskLink``'s ``call`` with a Spark job per segment on partition k
    (where the slots are too few for a long task per worker)."""

    def __init__(self, ctx, k: int, strategy, deltas: bool):
        self.ctx, self.k, self.strategy, self.deltas = ctx, k, strategy, deltas
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"monsoon-spark-job-{k}",
                                        initializer=ctx.jobs.join_group, initargs=(k,))

    def connect(self, alive) -> None:
        pass

    def call(self, message, alive):
        from .jobs import share

        kind, job, params, *rest = message
        if kind != "segment":
            raise ValueError(f"a job per segment carries segments, not {kind!r}")
        bc = share(self.ctx.sc, params, params.nbytes)
        strategy, deltas = self.strategy, self.deltas

        def task(it, bc=bc, job=job, rest=rest):
            from .tasks import run_segment

            return [run_segment(b, strategy, job, bc.value, *rest, deltas=deltas) for b in it]

        future = self._pool.submit(self.ctx.sc.runJob, self.ctx.blocks, task, [self.k])
        try:
            while True:
                if not alive():
                    raise Stopped
                try:
                    (res,) = future.result(timeout=POLL_S)
                    return res
                except FutureTimeout:
                    continue
                except Exception as exc:  # noqa: BLE001 - Spark gave up after its retries
                    raise WorkerError(short_error(exc)) from exc
        finally:
            bc.destroy(blocking=False)

    def close(self, wait_s: float) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

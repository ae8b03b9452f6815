"""sync in one barrier stage: the partitions reduce among themselves.

Run on the driver (``driver.py``), each sync step is one Spark job, and a
job's scheduling (0.1-0.3 s on a busy 2-core machine) dwarfs a small
model's step: DDP under ``TorchDistributor`` steps in milliseconds. Here the
whole run is ONE barrier job (``RDD.barrier()``): Spark starts a task per
partition at once, task k is rank k, and the ranks build a
``torch.distributed`` gloo group through a TCPStore the driver hosts, as
torchrun's agent does (``BarrierTaskContext.allGather`` would do, but its
JVM side polls once a second).

Algorithm: every rank runs ``DriverPrograms`` (every worker's sync program, as
the driver would), on its own Block. A step's gradient is ``_reduced`` in
place: each rank sums the loss and gradient over its rows of the step's global
batch, their count and each worker's rows left out (``tasks.usable``), one
all-reduce adds the ranks' buffers, and every rank applies the rule once to the
same mean. The ranks hold the same parameters: the run equals the driver-run
sync, hence serial SGD, to floating-point reduction order (float64, 1e-9).

The driver's part: rank 0 reports to the driver over a socket. At most
every ``ASK_EVERY_S`` it asks whether the recorder wants a row (it then
sends the parameters, which the recorder snapshots and evaluates after the
run, as always) or a live row, and whether to stop (divergence; a signal:
``RankRecorder``); a stop rides in the next all-reduce: one step for all.
The driver waits at most ``--timeout`` for each message; every collective
has the same timeout, so a rank that dies or stalls fails the stage.

Faults: Spark does not retry a failed barrier result stage; the engine
starts the job again (a new store) as often as Spark would retry a task
(``task_attempts``), its failed attempt's snapshots dropped: nothing is applied twice.

Used for sync (AllReduce of raw gradients on shared parameters) on two or
more workers when the executors hold a slot for every partition at once
(``defaultParallelism``), without dynamic allocation, and the data's
lineage is one Spark allows a barrier stage (``barrier_lineage``: a
DataFrame built on a ``union`` is not); else the driver runs sync.
Checkpoints: every rank knows when one is due; rank 0 sends it to the
driver, which writes it at once with the curve rows already evaluated (no
loss job can run: the stage holds every slot), and after the stage again
with every row (``StageCheckpoints``); ``--resume`` carries either path on.
"""
from __future__ import annotations

import pickle
import re
import socket
import struct
import time
from dataclasses import replace

import numpy as np

from ...compressors.messages import Sender
from ...errors import WaitTimeout, WorkerError
from ...monitor.lifecycle import stop_requested
from ...monitor.tally import RunTally
from ...strategies.ops import AllReduce
from ...record.checkpoints import KEEP, Checkpointer, applied, next_checkpoint
from .jobs import every_slot_at_once, short_error

ASK_EVERY_S = 0.01
_LEN = struct.Struct("!Q")


def may_fit(strategy, workers: int) -> bool:
    """Whether this run's sync may go into one barrier stage, whatever its
    session (``fits`` asks the session too): its ranks need torch."""
    return (workers >= 2 and strategy.shared_params and strategy.raw_gradients
            and AllReduce in strategy.uses)


def fits(strategy, sc, workers: int, blocks) -> bool:
    """Can this run's sync go into one barrier stage (on ``blocks``)?"""
    if not may_fit(strategy, workers):
        return False
    import torch.distributed as dist

    return dist.is_available() and every_slot_at_once(sc, workers) and barrier_lineage(blocks)


def barrier_lineage(rdd) -> bool:
    """Whether a barrier stage may run on ``rdd``: Spark refuses one whose
    stage (``rdd`` and its ancestors up to a shuffle) holds an RDD with
    another number of partitions (a ``union``, a ``coalesce``) or a
    partition-pruning one, as its DAGScheduler checks at submission."""
    top = rdd._jrdd.rdd()
    n, seen, todo = top.getNumPartitions(), set(), [top]
    while todo:
        r = todo.pop()
        if r.id() in seen:
            continue
        seen.add(r.id())
        if r.getNumPartitions() != n or r.getClass().getSimpleName() == "PartitionPruningRDD":
            return False
        deps = r.dependencies().iterator()
        while deps.hasNext():
            dep = deps.next()
            if dep.getClass().getSimpleName() != "ShuffleDependency":
                todo.append(dep.rdd())
    return True


# -- messages: a length, then a pickle -------------------------------------------
def send(sock, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LEN.pack(len(data)) + data)


def receive(sock, patience: float = 60.0):
    """The next message. A socket timeout before its first byte is raised
    (the caller's idle wait); once a message has begun, its rest is waited
    for up to ``patience`` seconds, so a slow transfer never splits it."""
    (size,) = _LEN.unpack(_exactly(sock, _LEN.size, patience, started=False))
    return pickle.loads(_exactly(sock, size, patience, started=True))


def _exactly(sock, n: int, patience: float, started: bool) -> bytes:
    parts, left, deadline = [], n, time.monotonic() + patience
    while left:
        try:
            chunk = sock.recv(min(left, 1 << 20))
        except socket.timeout:
            if not (started or parts) or time.monotonic() > deadline:
                raise
            continue
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


# -- in the tasks ----------------------------------------------------------------
class RankRecorder:
    """What ``DriverPrograms.run`` sees as its recorder, in a rank: rank 0
    asks the driver's recorder over the socket; every rank stops once the
    all-reduce has carried a stop (``stop_seen``). A stop signal at the
    driver (SIGTERM, SIGINT) comes with its answer to rank 0's ask, and the
    all-reduce hands its number to every rank (``interrupted``): each then
    stops where every gradient counted is applied (``DriverPrograms``), the
    same step, and rank 0 hands the driver the last checkpoint there."""

    def __init__(self, sock, target_loss=None):
        self.sock = sock  # None: a rank other than 0
        self.target_loss = target_loss
        self.target_reason = None
        self.stop_seen = None  # the reason, once every rank knows it
        self.stop_wanted = None  # the driver's reason, sent in the next all-reduce
        self.interrupt_wanted = 0  # the driver's stop signal, sent in the next all-reduce
        self.interrupted = None  # the stop signal, once the all-reduce carried it
        self._asked = -1.0
        self._live = False

    def start(self, w) -> None:
        if self.sock is not None:
            send(self.sock, ("start", np.asarray(w)))
            self.stop_wanted = receive(self.sock) or self.stop_wanted

    def due(self, now: float, examples: int) -> bool:
        if self.stop_seen:
            return True
        if self.sock is None or now - self._asked < ASK_EVERY_S:
            return False
        self._asked = now
        send(self.sock, ("ask", now, examples))
        row, self._live, signum = receive(self.sock)
        self.interrupt_wanted = signum or self.interrupt_wanted
        return row

    def record(self, now, updates, examples, w, dropped=0, local=None, left_out=0):
        if self.stop_seen:
            return self.stop_seen
        if self.sock is not None:  # ``local``, the local steps' counts, where there are any
            send(self.sock, ("record", now, updates, examples, np.asarray(w), dropped, local,
                             left_out))
            self.stop_wanted = receive(self.sock) or self.stop_wanted
        return None

    def target_met(self, loss: float, updates: int, dropped: int = 0) -> bool:
        """The all-reduced full-batch loss is every rank's alike: every rank
        stops at the same step once it is at the target. Rank 0 passes it on
        to the driver's recorder (no answer awaited), whose curve then need
        not evaluate a snapshot at these parameters again."""
        if self.sock is not None:
            send(self.sock, ("known", loss, updates, dropped))
        if self.target_loss is not None and loss <= self.target_loss and not self.stop_seen:
            from ...record.recorder import TARGET_REACHED

            self.target_reason = self.stop_seen = TARGET_REACHED.format(
                target=self.target_loss, loss=loss, updates=updates)
        return self.target_reason is not None

    def live_due(self, now: float, final: bool = False) -> bool:
        """Due when the driver said so; the last row (``final``) is rank 0's
        to send: the driver's recorder writes it where it has live series."""
        return self._live or (final and self.sock is not None)

    def live(self, now, examples, updates, workers=None, staleness=None, dropped=None):
        self._live = False
        if self.sock is not None:
            send(self.sock, ("live", now, examples, updates, workers, dict(staleness or {}),
                             dropped))


class RankCheckpoints(Checkpointer):
    """What ``DriverPrograms.run`` sees as its checkpoints, in a rank: the
    checkpoint the driver loaded (``--resume``), due every ``every``
    updates on every rank alike; rank 0 hands each to the driver, which
    writes it (``Checkpointer.save``, with the recorder's rows)."""

    def __init__(self, every: int, saved, sock):
        super().__init__(None, 0, None, {})
        self.every, self.saved, self.sock = every, saved, sock

    def load(self, w0, rule, extra_shapes=None):
        return self.saved

    def save(self, updates, now, params, state, meta, arrays=None, rows=None):
        self.next_at = next_checkpoint(updates, self.every)
        if self.sock is not None:
            send(self.sock, ("checkpoint", updates, now, np.asarray(params), state, meta))
            receive(self.sock)  # written


def _rank_programs(ctx, rule, strategy, w0, block, all_reduce, recorder, ckpts):
    from .driver import DriverPrograms
    from .tasks import gradient_sum, left_counts, step_union

    class RankPrograms(DriverPrograms):
        def _reduced(self, waiting, ranks):
            union = step_union(waiting, ranks, self.ctx.n_examples)
            _, count, loss, grad, left = gradient_sum(block, self.w, union, self.ctx.fewest)
            buf, n = self.buffer, self.w.size
            if count:
                np.multiply(grad, count, out=buf[:n])
            else:
                buf[:n] = 0
            buf[n:-4] = 0  # per worker, the rows of its indices this rank left out
            for k, rows in left_counts(waiting, ranks, [left]).items():
                buf[n + k] = rows
            buf[-4:] = (loss * count, count, 1.0 if recorder.stop_wanted else 0.0,
                        recorder.interrupt_wanted)  # rank 0's alone: the sum is the signal
            all_reduce(buf)
            # this rank's gradient sum went in, the ranks' sum came back (its
            # counts and flags are not counted, as torchrun's flags are not)
            self.sender.dense(buf[:n].nbytes, buf[:n].nbytes)
            self.left.update({k: int(buf[n + k]) for k in ranks})
            if buf[-2] > 0 and not recorder.stop_seen:
                recorder.stop_seen = recorder.stop_wanted or "stopped by the driver"
            if buf[-1] > 0 and recorder.interrupted is None:
                recorder.interrupted = int(buf[-1])
            out = self.grads[0]
            np.divide(buf[:n], max(buf[-3], 1.0), out=out)
            loss = float(buf[-4] / max(buf[-3], 1.0))
            self.full_loss = loss if union is None else None
            return {k: (loss, out) for k in ranks}

        def _interrupted(self, due):
            return recorder.interrupted  # every rank's alike: it came in an all-reduce

    programs = RankPrograms(ctx, rule, strategy, w0, ckpts)
    # a full-batch rule's line search decides on the loss sum: float64 for it, else
    # the parameters' dtype (half the bytes to all-reduce in float32)
    dtype = np.float64 if rule.full_batch else np.asarray(w0).dtype
    programs.buffer = np.zeros(len(w0) + ctx.workers + 4, dtype=dtype)
    programs.sender = Sender(ctx.compression, block.index)  # the all-reduce's bytes
    return programs


def rank_task(ctx, rule, strategy, w0, driver, store_port, timeout, every, saved):
    """The barrier task: partition k's rank of the sync run (a Spark
    ``mapPartitions`` function). ``driver``: the driver's (host, port) for
    rank 0's reports; ``store_port``: the attempt's TCPStore there."""
    def run(blocks):
        import datetime

        import torch
        import torch.distributed as dist
        from pyspark import BarrierTaskContext

        task = BarrierTaskContext.get()
        rank, world = task.partitionId(), ctx.workers
        (block,) = list(blocks)
        limit = datetime.timedelta(seconds=timeout)
        store = dist.TCPStore(driver[0], store_port, None, False, limit)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=limit)

        def all_reduce(buf):  # a sum over the ranks, in place (no copy: a view)
            dist.all_reduce(torch.from_numpy(buf))

        sock = None
        try:
            if rank == 0:
                sock = socket.create_connection(driver, timeout=timeout)
                sock.settimeout(timeout)
            recorder = RankRecorder(sock, ctx.target_loss)
            ckpts = RankCheckpoints(every, saved, sock)
            programs = _rank_programs(ctx, rule, strategy, w0, block, all_reduce, recorder,
                                      ckpts)
            out = programs.run(recorder)
            if sock is not None:
                send(sock, ("done",))
            # every rank's traffic; rank 0's result
            return [(rank, programs.sender.stats(), out if rank == 0 else None)]
        finally:
            dist.destroy_process_group()
            if sock is not None:
                sock.close()

    return run


# -- on the driver ---------------------------------------------------------------
class StageCheckpoints:
    """The driver's writer of rank 0's checkpoints. During the stage a
    checkpoint carries the curve rows already evaluated: evaluating the
    snapshots' loss (``settled_rows``) would be a Spark job on a Spark-held
    problem, which waits for a slot the stage holds until it ends. After
    the stage (``settle``) the last checkpoints are written again, each
    with the rows up to it, every snapshot then evaluated."""

    def __init__(self, ckpts, recorder):
        self.ckpts, self.recorder = ckpts, recorder
        self.kept: list[tuple] = []  # the newest KEEP checkpoints' contents

    def save(self, updates, now, w, state, meta):
        path = self.ckpts.save(updates, now, w, state, meta, rows=self.recorder.rows)
        if path is not None:
            self.kept = self.kept[-(KEEP - 1):] + [(updates, now, w, state, meta)]
        return path

    def settle(self, final_updates: int) -> None:
        if not self.kept:
            return
        rows = self.recorder.settled_rows(final_updates=final_updates)
        for updates, now, w, state, meta in self.kept:  # oldest first: the newest stays
            self.ckpts.save(updates, now, w, state, meta, rows=rows)


def driver_host(sc) -> str:
    return sc.getConf().get("spark.driver.host", None) or socket.gethostname()


def task_attempts(sc) -> int:
    """How many times Spark would run a failed task: ``local[N, F]``'s F,
    1 on ``local[N]``, else ``spark.task.maxFailures`` (4)."""
    m = re.fullmatch(r"local\[(\*|\d+)\s*,\s*(\d+)\]", sc.master)
    if m:
        return int(m.group(2))
    if sc.master.startswith("local"):
        return 1
    return int(sc.getConf().get("spark.task.maxFailures", "4"))


def run_barrier(ctx, rule, strategy, w0, recorder, ckpts) -> dict:
    """The sync run as one barrier job; the driver's recorder follows it,
    and the driver writes its checkpoints (``ckpts``). Spark does not
    retry a failed barrier result stage: the job is started again, from
    the run's start, as many times as Spark would run a failed task."""
    saved = ckpts.load(w0, rule)  # --resume: the recorder takes its rows now
    stage_ckpts = StageCheckpoints(ckpts, recorder)
    light = replace(ctx, sc=None, jobs=None, blocks=None)  # what a task needs of it
    server = socket.create_server(("", 0))
    server.settimeout(0.2)
    address = (driver_host(ctx.sc), server.getsockname()[1])
    began = time.perf_counter()
    attempts = task_attempts(ctx.sc)
    store = None
    try:
        for attempt in range(1, attempts + 1):
            recorder.snapshots.clear()  # a failed attempt's: the run starts again
            stage_ckpts.kept.clear()  # its checkpoints: the next attempt writes them again
            store = _store(ctx.timeout)  # each attempt its own: nothing stale in it
            stage = ctx.blocks.barrier().mapPartitions(rank_task(
                light, rule, strategy, w0, address, store.port, ctx.timeout, ckpts.every, saved))
            submitted = time.perf_counter()
            future = ctx.jobs.submit(stage, lambda it: list(it))
            started = _follow(future, server, ctx.timeout, recorder,
                              stage_ckpts)  # errors: the run's
            try:
                ranks = future.result()
                break
            except Exception as exc:  # noqa: BLE001 - the stage failed
                if attempt == attempts:
                    raise WorkerError(f"the sync stage failed {attempts} time(s) (Spark's "
                                      f"task attempts): {short_error(exc)}") from exc
    finally:
        ctx.jobs.cancel()
        server.close()
        store = None  # the last attempt's, kept alive until here
    (out,) = [o for _, _, o in ranks if o is not None]
    stage_ckpts.settle(out["updates"])  # the slots are free: the curve's loss jobs can run
    # each rank's bytes in the all-reduces, over the updates after the checkpoint resumed
    # (its checkpoints hold no traffic)
    tally = RunTally(ctx.workers, ctx.compression)
    tally.from_update = 0 if saved is None else applied(saved.meta)
    for rank, traffic, _ in ranks:
        tally.add(rank, {"traffic": traffic})
    # the stage's launch (tasks, gloo group) is start-up: the run's clock starts after it
    out["launch_s"] = (started or submitted) - submitted
    stage_s = time.perf_counter() - began
    # one job: what of it was not the ranks' training (launch, gloo group, teardown)
    share = max(0.0, stage_s - out["wall"]) / stage_s if stage_s > 0 else None
    out["extra"] = {"spark_sync": "one barrier stage", "barrier_attempts": attempt,
                    "barrier_stage_s": round(stage_s, 4),
                    "barrier_launch_s": round(out["launch_s"], 4),
                    "spark_jobs": 1, "spark_job_share": None if share is None else round(share, 4),
                    **tally.extra(out["updates"])}
    return out


def _store(timeout: float):
    """A TCPStore the driver hosts, on a free port, for one attempt's ranks
    to build their gloo group (as torchrun's agent hosts one)."""
    import datetime

    import torch.distributed as dist

    return dist.TCPStore("0.0.0.0", 0, None, True, datetime.timedelta(seconds=timeout),
                         wait_for_workers=False)


def _follow(future, server, timeout, recorder, ckpts) -> float | None:
    """Answer rank 0 until the stage ends; at most ``timeout`` between its
    messages (and ``timeout`` + 30 s for the stage to start). Returns when
    (``perf_counter``) rank 0 started its steps, if it did."""
    conn, last, allowance, started = None, time.monotonic(), timeout + 30.0, None
    try:
        while not future.done():
            if conn is None:
                try:
                    conn, _ = server.accept()
                    conn.settimeout(0.2)
                    last = time.monotonic()
                except socket.timeout:
                    if time.monotonic() - last > allowance:
                        raise WaitTimeout(f"waited {allowance:g} s for the sync stage's "
                                          "ranks to start; the executors lack a slot per "
                                          "partition, or one is stuck") from None
                continue
            try:
                message = receive(conn, timeout)
            except socket.timeout:
                if time.monotonic() - last > timeout:
                    raise WaitTimeout(f"waited {timeout:g} s for a sync step in the barrier "
                                      "stage; an executor is stuck or lost (raise --timeout "
                                      "if a step is genuinely that slow)") from None
                continue
            except ConnectionError:  # rank 0 ended or failed: the future says which
                conn.close()
                conn = None
                continue
            last = time.monotonic()
            if message[0] == "start":
                started = time.perf_counter()
            _answer(conn, message, recorder, ckpts)
    finally:
        if conn is not None:
            conn.close()
    return started


def _answer(conn, message, recorder, ckpts) -> None:
    kind = message[0]
    if kind == "checkpoint":
        _, updates, now, w, state, meta = message
        send(conn, str(ckpts.save(updates, now, w, state, meta)))
    elif kind == "start":
        recorder.start(message[1])
        send(conn, recorder.stop_reason)
    elif kind == "ask":
        _, now, examples = message
        send(conn, (recorder.due(now, examples), recorder.live_due(now), stop_requested()))
    elif kind == "record":
        _, now, updates, examples, w, dropped, local, left_out = message
        send(conn, recorder.record(now, updates, examples, w, dropped, local,
                                   left_out=left_out))
    elif kind == "known":  # one-way: the loss at the last snapshot, from a full-batch step
        recorder.target_met(*message[1:])
    elif kind == "live":
        _, now, examples, updates, workers, staleness, dropped = message
        from collections import Counter

        recorder.live(now, examples, updates, workers, Counter(staleness), dropped)

"""The pipeline strategy on the local engine: one process per (replica, stage).

Each process runs the strategy's ``StageWorker`` (``strategies/pipeline/
worker.py``). Transport: one shared-memory channel per direction between
neighbouring stages of a replica (activations forward, their gradients
backward; ``channels.py``), one duplex pipe between replica 0 and replica r
of each stage (the 2D gradient sum, once a step). A channel has a slot per micro-batch,
so a stage never blocks on a neighbour that is itself sending (1F1B sends
both ways at once); every wait has the run's timeout and stops on abort.

The 2D sum runs in rank order on replica 0 (g_0 + g_1 + ... ), which sends
the sum back: every replica applies the same bits, so replicas never drift.

The monitor (the calling process) starts the workers, releases them
together, and for the loss curve asks replica 0's stages to copy their
parameters into a shared snapshot vector at the end of a step (each copies
only its own slice); the snapshot is recorded once every stage has served.
At the end replica 0's stages report their parameters and their layers'
buffers (BatchNorm's running statistics, ``runner.finish``).

SIGTERM or SIGINT (``lifecycle.StopSignals``): the monitor sets ``STOP``,
a step no stage has begun, and every stage ends before it, so all stop
after the same step with their slices of one set of parameters. With m
the most steps a stage of replica 0 has decided, no stage has finished
more than m + 1 (a stage needs its upstream neighbour's activations of the
step, and another replica replica 0's sum of it), so none has begun step
m + 2. The stages ignore both signals
(Ctrl-C or ``kill`` of the process group reaches them too): stopping them
is the monitor's.
"""
from __future__ import annotations

import time

import numpy as np

from ...errors import ConfigError
from ...strategies.batches import budget_steps, global_batches
from ...strategies.pipeline.runner import add_replicas, finish, stage_payloads
from ...monitor.tally import EngineResult
from ...monitor.due import Due
from ..options import refuse_checkpoints
from ...monitor.processes import limit_threads, start_context, torch_threads_per_worker
from ...shared_memory import SharedArrays
from ...monitor.waiting import Aborted, wait_until
from .channels import Channel, boundary_bytes, largest_micro_batch
from ...monitor.pool import WorkerPool, fail_if_lost, failure, read_payload

ABORT, START, ASKED, STOP = 0, 1, 2, 3  # STOP: 1 + the step to stop before (0: none)


class Link:
    """A stage's transport: shared-memory channels to its neighbours
    (``channels.py``), pipes to its replicas."""

    def __init__(self, conns: dict, control, timeout: float):
        self.conns, self.control, self.timeout = conns, control, timeout
        aborted = lambda: bool(control[ABORT])  # noqa: E731
        for key in ("act_in", "act_out", "grad_in", "grad_out"):
            if key in conns:
                conns[key].attach(timeout, aborted)

    def send_act(self, m, a):
        self.conns["act_out"].send(m, a, "an activation")

    def recv_act(self, m):
        return self.conns["act_in"].recv(m, f"the activation of micro-batch {m}")

    def send_grad(self, m, g):
        self.conns["grad_out"].send(m, g, "a gradient")

    def recv_grad(self, m):
        return self.conns["grad_in"].recv(m, f"the gradient of micro-batch {m}")

    def reduce(self, grad: np.ndarray) -> None:
        peers = self.conns.get("replicas")
        if peers:  # replica 0: sum in rank order, send the sum back
            add_replicas(grad, (self._recv_on(c, r) for r, c in enumerate(peers, start=1)))
            for conn in peers:
                conn.send((0, grad))
        elif "replica0" in self.conns:
            self.conns["replica0"].send((0, grad))
            grad[...] = self._recv_on(self.conns["replica0"], 0)

    def _recv_on(self, conn, who):
        wait_until(lambda: conn.poll(0.05), self.timeout, lambda: self.control[ABORT],
                   f"replica {who}'s gradient", spin=False)
        return conn.recv()[1]


def _stage_main(reader, outbox, conns, shared, rank, timeout, threads):
    """A stage's process (in ``pool._worker_process``)."""
    worker = t0 = None
    try:
        setup = read_payload(reader)  # imports torch: a stage runs a torch module
        limit_threads(threads, torch_problem=True)
        control, served, counters, snap = (shared["control"], shared["served"],
                                           shared["counters"], shared["snap"])
        worker = setup["make"]()
        link = Link(conns, control, timeout)
        outbox.put(("ready", rank, None))
        wait_until(lambda: control[START], setup["start_timeout"], lambda: control[ABORT],
                   "the start signal", spin=False)
        spec, lead = worker.spec, worker.replica == 0
        t0 = time.perf_counter()
        for t, batch in enumerate(global_batches(*setup["batches"])):
            if control[STOP] and t >= control[STOP] - 1:
                break  # a stop signal: every stage ends before the same step
            worker.step(batch, t, link)
            if lead:  # the step decided here: dropped or not, then how many decided
                if worker.dropped_steps[-1:] == [t]:
                    shared["dropped_at"][t] = 1
                counters[2 + spec.index] = worker.dropped
                counters[2 + spec.count + spec.index] = t + 1
                if spec.first:
                    counters[0] += 1
                    counters[1] += len(batch)
                if served[spec.index] < control[ASKED]:
                    snap[spec.lo:spec.hi] = worker.params
                    served[spec.index] = control[ASKED]
            if control[ABORT]:
                raise Aborted()
        wall = time.perf_counter() - t0
        outbox.put(("done", rank, {"params": worker.params if lead else None,
                                   "state": worker.buffers() if lead else None,
                                   "stats": worker.stats(wall)}))
    except Aborted:  # its stats (the steps it dropped) and buffers still count
        outbox.put(("aborted", rank, None if t0 is None else {
            "params": None, "state": worker.buffers() if worker.replica == 0 else None,
            "stats": worker.stats(time.perf_counter() - t0)}))
    except BaseException as exc:  # noqa: BLE001 - reported to the monitor
        shared["control"][ABORT] = 1
        outbox.put(failure(rank, exc))


def _links(ctx, stages: int, replicas: int, boundary: list, rows: int, micro: int):
    """Each worker's channels (to its neighbours) and pipes (to its replicas)."""
    conns = [dict() for _ in range(stages * replicas)]
    channels = []
    for r in range(replicas):
        for s in range(stages - 1):
            a, b = r * stages + s, r * stages + s + 1
            fwd, back = (Channel(micro, rows * boundary[s]) for _ in range(2))
            channels += [fwd, back]
            conns[a]["act_out"], conns[b]["act_in"] = fwd, fwd
            conns[b]["grad_out"], conns[a]["grad_in"] = back, back
    for s in range(stages):
        for r in range(1, replicas):
            lead, other = ctx.Pipe(duplex=True)
            conns[s].setdefault("replicas", []).append(lead)
            conns[r * stages + s]["replica0"] = other
    return conns, channels


def run_pipeline(engine, strategy, problem, rule, w0, workers, batch_size, seed, budget,
                 recorder):
    """Run ``strategy`` (one that needs ``STAGES``) on the local ``engine``."""
    refuse_checkpoints(engine, strategy, workers)
    if engine.backend == "threads":
        raise ConfigError("the pipeline runs each stage in its own process on the local engine; "
                          "drop --backend threads")
    specs, stages, replicas = strategy.layout(problem, workers, batch_size)
    ctx = start_context()
    shared = SharedArrays({"control": ((4,), "int64"), "served": ((stages,), "int64"),
                           # steps, examples, each stage's dropped steps, each
                           # stage's steps decided; which steps some stage dropped
                           "counters": ((2 + 2 * stages,), "int64"),
                           "dropped_at": ((max(1, budget_steps(problem.n_examples, batch_size,
                                                               budget)),), "int8"),
                           "snap": ((w0.size,), str(w0.dtype))})
    shared["snap"][:] = w0
    control = shared["control"]
    pool = WorkerPool(ctx, workers, "monsoon-stage")
    threads = torch_threads_per_worker(workers)
    engine.backend_used = "processes"
    channels = []
    t_begin = time.perf_counter()
    try:
        conns, channels = _links(ctx, stages, replicas, boundary_bytes(problem, specs),
                                 largest_micro_batch(batch_size, replicas,
                                                     strategy.micro_batches),
                                 strategy.micro_batches)
        payloads = stage_payloads(strategy, problem, rule, specs, replicas, w0, batch_size,
                                  seed, budget)
        for rank, payload in enumerate(payloads):
            pool.start(_stage_main, (conns[rank], shared, rank, engine.timeout, threads),
                       {**payload, "start_timeout": engine.start_timeout}, threads)
        pool.send_payloads()
        for c in conns:  # the children hold their ends of the pipes now
            for key in ("replicas", "replica0"):
                for conn in (c[key] if key == "replicas" else [c[key]]) if key in c else ():
                    conn.close()
        return _monitor(engine, strategy, shared, pool, specs, w0, recorder, t_begin)
    except BaseException:
        control[ABORT] = 1
        raise
    finally:
        pool.join(5.0)
        shared.close()
        for channel in channels:
            channel.close()


def _check(pool, strategy, specs) -> None:
    """Fail the run on a lost stage (a pipeline needs every one), naming
    its stage and replica (the others are aborted on the way out)."""
    stages = len(specs)
    fail_if_lost(pool.failed, strategy, len(pool.handles), lambda rank: (
        f"pipeline worker {rank} (stage {rank % stages}, replica {rank // stages})"),
        needs="a pipeline needs every stage")


def _monitor(engine, strategy, shared, pool, specs, w0, recorder, t_begin):
    """Wait until every stage is ready, release them together, record the
    curve until they finish (``_watch``), and put the result together."""
    control, counters, snap = shared["control"], shared["counters"], shared["snap"]
    workers = len(pool.handles)
    due = Due(recorder, timeout=engine.timeout)

    def stop():  # stopped before the first step: released, they end at once
        control[STOP] = 1

    pool.await_ready(lambda: len(pool.ready) == workers, engine.start_timeout, due, stop,
                     lambda: _check(pool, strategy, specs),
                     f"pipeline workers did not start within {engine.start_timeout:g} s",
                     block_s=0.05, ends_when_stopped=False)  # _watch waits for every stage
    startup = time.perf_counter() - t_begin
    recorder.start(snap)
    t0 = time.perf_counter()
    control[START] = 1
    stopped = _watch(engine, strategy, pool, specs, shared, recorder, t0, due)
    wall = time.perf_counter() - t0
    _check(pool, strategy, specs)
    results = {r: payload for r, (kind, payload) in pool.reports.items() if kind == "done"}
    if stopped is not None and len(results) < workers:  # stopped early: the snapshot is the run
        params = np.array(snap, copy=True)
    else:
        params = np.concatenate([results[s]["params"] for s in range(len(specs))])
    reports = {r: payload for r, (kind, payload) in pool.reports.items()
               if kind in ("done", "aborted") and payload}  # aborted: the steps it dropped
    stats = [reports[r]["stats"] for r in sorted(reports)]
    states = [reports[s]["state"] for s in range(len(specs)) if s in reports]
    return finish(EngineResult, strategy, params, startup, wall, int(counters[1]),
                  int(counters[0]), stats, stopped, w0, interrupted=due.interrupted,
                  states=states)


def _watch(engine, strategy, pool, specs, shared, recorder, t0, due):
    """Until every stage has finished: ask replica 0's stages for a snapshot
    when a row is due (``Due``), record it once all have served, and stop the
    run on a failure, no progress, a diverged row or a stop signal (its
    reason returned)."""
    control, served, counters, snap = (shared["control"], shared["served"],
                                       shared["counters"], shared["snap"])
    stopped = due.stop_reason if due.interrupted else None

    def ask():
        control[ASKED] += 1

    while len(pool.finished) < len(pool.handles):
        pool.drain(0.002 if due.asking else min(0.05, engine.idle_s))
        _check(pool, strategy, specs)
        now = time.perf_counter() - t0
        up, ex, dropped = _counts(shared, len(specs))
        due.progress(ex, f"no pipeline step finished for {2 * engine.timeout:g} s")
        due.live(now, lambda: (ex, up, dropped), _no_worker_figures)
        if due.signal():  # stop before step m + 2, which no stage has begun: 1 + (m + 2)
            stopped = due.stop_reason
            control[STOP] = int(counters[2 + len(specs):].max()) + 3
        # no new copy asked for once stopped (one asked before is still recorded)
        if (due.asking or not stopped) and due.asked_row(
                now, ex, lambda: all(served[s] >= control[ASKED] for s in range(len(specs))),
                ask):
            reason = recorder.record(now, up, ex, snap, dropped)
            if reason is not None:
                stopped = reason
                control[ABORT] = 1
    up, ex, dropped = _counts(shared, len(specs))  # the run's last live row: its final counts
    due.live(time.perf_counter() - t0, lambda: (ex, up, dropped), _no_worker_figures, final=True)
    return stopped


def _counts(shared, stages: int) -> tuple[int, int, int]:
    """(updates, examples, dropped) so far. The steps applied: of the steps
    every stage has decided, those no stage dropped (as ``finish`` counts
    them), so the curve never falls."""
    counters = shared["counters"]
    done = int(counters[2 + stages:].min())
    dropped = int(np.count_nonzero(shared["dropped_at"][:done]))
    return done - dropped, int(counters[1]), dropped


def _no_worker_figures() -> tuple:
    """A live row's worker figures: none (a stage's losses stay in it), so
    the pipeline's rows carry the run's counts and throughput only."""
    return None, None

"""The pipeline strategy on the ray engine: one actor per (replica, stage),
object refs between them.

The driver submits each replica's ops in ``schedules.dependency_order``
(each stage's in its schedule's order, each op after the neighbour's op it
takes as input); an op's input is the object reference that op returned
(an activation going forward, its gradient going back), so activations
travel actor to actor through Ray's object store and never through the
driver. A Ray actor runs the tasks one caller submits in submission
order, waiting for their arguments, which is exactly the schedule. After
a step's last op, each stage's gradient (``gather``) goes, as a
reference, to every replica of that stage, which sums them in rank order
and applies its rule (``apply``): replicas apply the same bits. At the end the driver takes
replica 0's stages' parameters and buffers (BatchNorm's, ``runner.finish``).

The driver keeps at most two steps in flight, and every wait has the
engine's timeout. SIGTERM/SIGINT stop the run at the next step boundary
(the steps in flight finish), with no checkpoint: a pipeline writes none.
An actor that fails fails the run with its error (a pipeline needs every
stage).
"""
from __future__ import annotations

import time

import numpy as np

from ...strategies.batches import global_batches, part_bounds
from ...strategies.pipeline.runner import add_replicas, finish, stage_payloads
from ...strategies.pipeline.schedules import dependency_order, schedule
from ...monitor.tally import EngineResult
from ...monitor.due import StepTally
from ..options import refuse_checkpoints
from .hosts import POOL, get_or_fail, kill


class _OneOp:
    """The transport of one op: its input was given, its output is kept."""

    def __init__(self, value=None):
        self.value, self.out = value, None

    def recv_act(self, m):
        return self.value

    recv_grad = recv_act

    def send_act(self, m, array):
        self.out = array

    send_grad = send_act


class StageActor:
    def __init__(self, make):
        import torch

        torch.set_num_threads(1)
        self.worker = make()
        self.busy = 0.0
        self.first_at = self.last_at = None

    def ready(self):
        return True

    def begin(self, batch):
        now = time.perf_counter()
        self.first_at = self.first_at or now
        self.worker.begin(np.asarray(batch))

    def op(self, value=None):
        t0 = time.perf_counter()
        link = _OneOp(None if value is None else np.array(value, copy=True))
        self.worker.run_op(link)
        self.busy += time.perf_counter() - t0
        return link.out

    def gather(self):
        t0 = time.perf_counter()
        self.worker.gather()
        self.busy += time.perf_counter() - t0
        return self.worker.grad

    def apply(self, t, *grads):
        t0 = time.perf_counter()
        w = self.worker
        if len(grads) > 1:  # the replicas' sum, in rank order
            w.grad[...] = grads[0]
            add_replicas(w.grad, grads[1:])
        w.apply(t)
        self.last_at = time.perf_counter()
        self.busy += self.last_at - t0
        return w.dropped_steps[-1:] == [t]  # whether this stage dropped step t

    def params(self):
        return self.worker.params

    def buffers(self):
        return self.worker.buffers()

    def stats(self):
        wall = (self.last_at - self.first_at) if self.first_at and self.last_at else 0.0
        return {**self.worker.stats(wall), "busy_s": self.busy}


def run_pipeline(engine, ray, strategy, problem, rule, w0, workers, batch_size, seed, budget,
                 recorder):
    """Run ``strategy`` (one that needs ``STAGES``) on the ray ``engine``,
    whose Ray session (``ray``) is up."""
    refuse_checkpoints(engine, strategy, workers)
    engine.shards_used = None  # stages hold their own slices: no server shards
    specs, S, R = strategy.layout(problem, workers, batch_size)
    actors, result = [], None
    try:
        t_begin = time.perf_counter()
        for rank, p in enumerate(stage_payloads(strategy, problem, rule, specs, R, w0,
                                                batch_size, seed, budget)):
            actors.append(POOL.take(ray, StageActor, (p["make"],),
                                    {"num_cpus": 0, "max_concurrency": 1},
                                    name=f"monsoon-{engine.run_name}-stage-{rank}"
                                    if engine.named else None))
        _get(ray, [a.ready.remote() for a in actors], engine.start_timeout,
             "start")
        startup = time.perf_counter() - t_begin
        result = _drive(ray, engine, strategy, actors, specs, S, R, w0, batch_size, seed,
                        budget, recorder, startup, problem.n_examples)
        return result
    finally:
        if result is not None and result.stopped is None:  # every step answered
            POOL.give_back(ray, actors)
        else:
            for a in actors:
                kill(ray, a)


def _params(ray, engine, actors, S):
    """The stages' parameters, concatenated in stage order."""
    return np.concatenate(_get(ray, [actors[s].params.remote() for s in range(S)],
                               engine.timeout, "send parameters"))


def _get(ray, refs, timeout, what):
    # fail_if_lost's rule for a pipeline, said here: a get of many stages' refs names no rank
    return get_or_fail(ray, refs, timeout, f"pipeline stage actors did not {what}",
                       "a pipeline stage actor failed, and a pipeline needs every stage: "
                       "{error}")


def _submit_step(actors, S, R, t, batch, micro, name):
    """Submit step t's ops; returns the refs of its applies."""
    for a in actors:
        a.begin.remote(batch)
    for r in range(R):
        lo, hi = part_bounds(len(batch), R, r)
        k = min(micro, hi - lo)
        made = {}
        for s, kind, m, dep in dependency_order([schedule(name, i, S, k) for i in range(S)]):
            actor = actors[r * S + s]
            made[(s, kind, m)] = actor.op.remote(made[dep]) if dep else actor.op.remote()
    applies = []
    for s in range(S):
        grads = [actors[r * S + s].gather.remote() for r in range(R)]
        for r in range(R):
            applies.append(actors[r * S + s].apply.remote(t, *(grads if R > 1 else ())))
    return applies


def _drive(ray, engine, strategy, actors, specs, S, R, w0, batch_size, seed, budget, recorder,
           startup, n):
    tally = StepTally(recorder, w0)
    t0 = time.perf_counter()
    in_flight = []
    for t, batch in enumerate(global_batches(n, batch_size, seed, budget)):
        in_flight.append((_submit_step(actors, S, R, t, batch, strategy.micro_batches,
                                       strategy.schedule), len(batch)))
        if len(in_flight) >= 2:
            refs, size = in_flight.pop(0)
            dropped = any(_get(ray, refs, engine.timeout, "finish a step"))
            if tally.done(time.perf_counter() - t0, size, dropped,
                          lambda: _params(ray, engine, actors, S)):
                break  # the row's reason to stop, or SIGTERM/SIGINT: at this step boundary
    # a step already submitted is finished, stopped or not, so that the steps
    # and examples counted are those the stages ran (``finish`` counts their drops)
    for refs, size in in_flight:
        _get(ray, refs, engine.timeout, "finish a step")
        tally.count(size)
    wall = time.perf_counter() - t0
    params = _params(ray, engine, actors, S)
    stats = _get(ray, [a.stats.remote() for a in actors], engine.timeout, "report")
    states = _get(ray, [actors[s].buffers.remote() for s in range(S)], engine.timeout,
                  "send buffers")
    return finish(EngineResult, strategy, params, startup, wall, tally.examples, tally.steps,
                  stats, tally.stopped, w0, interrupted=tally.interrupted, states=states)

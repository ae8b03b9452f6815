"""The pipeline strategy on the sim engine: real math, virtual time.

Every stage's forward and backward is computed for real, in one process
(the same ``StageWorker`` as on the local engine, so the parameters are the
same), replica by replica in ``schedules.dependency_order``: each op after
the neighbour's op it receives from, through in-process FIFO channels. Time
is modelled per step by ``schedules.timeline``, the schedule's critical path:

- compute: stage s costs ``T_s`` seconds per batch: ``--stage-compute-s``
  (one number per stage, as measured; a local run reports each stage's
  ``busy_s_median`` in its summary) or, without it, ``--compute-s`` (the
  WHOLE model's forward, backward and update on one batch of
  ``--batch-size``) times stage s's share of the parameters. A micro-batch
  of n examples costs ``T_s * n / batch_size``, one third forward and two
  thirds backward (a backward computes two products per layer, a forward
  one). Per-example cost is NOT constant in the micro-batch size (small
  matrix products run slower per example), so ``T_s`` must be measured with
  the micro-batches the run uses; stragglers (``--straggler-p``,
  ``--slow-fraction``, ``--compute-sigma``) scale a worker's ops for the step;
- transfer: an activation (or its gradient) of b bytes between neighbouring
  stages takes ``--latency-s + b / --bandwidth``, with b the real array's
  size, and delays its receiver only if the receiver is idle by then. On the
  local engine that is the shared-memory channel's cost as a waiting stage
  sees it: copy in, wake-up (a waiting stage sleeps), copy out;
- 2D: the replicas' gradient sum costs a message to replica 0 and back.

Not modelled: the update as a separate op after the last backward (it is in
``T_s``, spread over the micro-batches), contention between stages for
cores or memory bandwidth (measure ``T_s`` under the load the run will
have), and the order of a stage's ops beyond its schedule.

The step's bubble is 1 - sum(busy) / (S * makespan); with equal stages and
free transfers it is GPipe's (S - 1) / (M + S - 1) exactly (tested), and the
step is the critical path of the given stage times and message costs
(tested), so the sim answers "which S and M" for a cluster before it is
rented.

The summary has ``simulated_time_s``, ``real_time_s``, ``utilization`` and
the delays, as for every strategy; SIGTERM/SIGINT stop it after the step.
Replica 0's stages' buffers (BatchNorm's) end in the problem, for every row.
"""
from __future__ import annotations

import copy
import time
from collections import deque

import numpy as np

from ...strategies.batches import global_batches
from ...strategies.pipeline.runner import add_replicas, finish, stage_payloads
from ...strategies.pipeline.schedules import dependency_order, timeline
from ...monitor.tally import EngineResult
from ...monitor.due import StepTally
from ..options import refuse_checkpoints


class _Link:
    """In-process FIFO channels of one worker; records the bytes it sends."""

    def __init__(self, channels, r, s, sent):
        self.channels, self.r, self.s, self.sent = channels, r, s, sent

    def send_act(self, m, a):
        self.channels[("act", self.r, self.s + 1)].append((m, a))
        self.sent[(self.r, self.s, m)] = a.nbytes

    def recv_act(self, m):
        got, a = self.channels[("act", self.r, self.s)].popleft()
        assert got == m
        return a

    def send_grad(self, m, g):
        self.channels[("grad", self.r, self.s - 1)].append((m, g))

    def recv_grad(self, m):
        got, g = self.channels[("grad", self.r, self.s)].popleft()
        assert got == m
        return g


def run_pipeline(engine, strategy, problem, rule, w0, workers, batch_size, seed, budget,
                 recorder):
    """Run ``strategy`` (one that needs ``STAGES``) on the sim ``engine``."""
    refuse_checkpoints(engine, strategy, workers)
    t_real = time.perf_counter()
    specs, S, R = strategy.layout(problem, workers, batch_size)
    payloads = stage_payloads(strategy, problem, rule, specs, R, w0, batch_size, seed, budget)
    ws = []
    for p in payloads:  # each worker owns its rule object, as a process would
        make = p["make"]
        args = list(make.args)
        args[2] = copy.deepcopy(args[2])
        ws.append(make.func(*args, **make.keywords))
    delays = engine.delays
    engine.shards_used = None
    rng = np.random.default_rng([seed, 7919])
    n = w0.size
    given = delays.stage_times(S)
    stage_s = list(given) if given is not None else \
        [delays.compute_s * (spec.hi - spec.lo) / n for spec in specs]
    channels = {(k, r, s): deque() for k in ("act", "grad") for r in range(R) for s in range(S)}
    sent: dict = {}
    links = [_Link(channels, r, s, sent) for r in range(R) for s in range(S)]
    busy = [0.0] * len(ws)
    now = 0.0
    tally = StepTally(recorder, w0)
    for t, batch in enumerate(global_batches(problem.n_examples, batch_size, seed, budget)):
        for w in ws:
            w.begin(batch)
        for r in range(R):  # each replica's ops, each after the op it receives from
            group = ws[r * S:(r + 1) * S]
            for s, _, _, _ in dependency_order([w.plan for w in group]):
                group[s].run_op(links[r * S + s])
        for s in range(S):  # the replicas' sum, in rank order
            group = [ws[r * S + s] for r in range(R)]
            for w in group:
                w.gather()
            add_replicas(group[0].grad, (w.grad for w in group[1:]))
            for w in group:
                if w is not group[0]:
                    w.grad[...] = group[0].grad
                w.apply(t)
        now += _step_time(ws, S, R, stage_s, batch_size, delays, rng, sent, busy)
        dropped = any(w.dropped_steps[-1:] == [t] for w in ws)  # a step any stage dropped
        if tally.done(now, len(batch), dropped, lambda: _params(ws, S)):
            break  # the row's reason to stop, or SIGTERM/SIGINT: after this step
    stats = [{**w.stats(now), "busy_s": busy[i]} for i, w in enumerate(ws)]
    extra = {"sim_step_s": now / max(tally.steps, 1), "simulated_time_s": now,
             "real_time_s": time.perf_counter() - t_real,
             "utilization": {"workers": sum(busy) / (len(ws) * now) if now > 0 else None,
                             "shards": None},
             "delays": delays.describe(len(ws))}
    result = finish(EngineResult, strategy, _params(ws, S), 0.0, now, tally.examples,
                    tally.steps, stats, tally.stopped, w0, extra=extra,
                    interrupted=tally.interrupted, states=[ws[s].buffers() for s in range(S)])
    # the trained buffers left in the problem, as the sim's other strategies
    # leave them: every curve row is evaluated with them
    problem.load_state(result.worker_states.get(0))
    return result


def _params(ws, S):
    return np.concatenate([ws[s].params for s in range(S)])


def _step_time(ws, S, R, stage_s, batch_size, delays, rng, sent, busy) -> float:
    """One step's virtual seconds: the schedule's makespan over the replicas
    (``timeline``), plus the 2D gradient sum. ``stage_s[s]``: stage s's
    compute on one whole batch; a micro-batch of k examples costs k /
    batch_size of it."""
    makespans = []
    for r in range(R):
        forward, backward, transfer = [], [], []
        for s in range(S):
            w = ws[r * S + s]
            slow = delays.compute_time(rng, r * S + s, len(ws)) / delays.compute_s \
                if delays.compute_s > 0 else 1.0
            unit = stage_s[s] * slow / batch_size
            sizes = [len(p) for p in w._parts]
            forward.append([unit * k / 3 for k in sizes])
            backward.append([unit * k * 2 / 3 for k in sizes])
            transfer.append([delays.message_time(sent.get((r, s, m), 0))
                             for m in range(len(sizes))])
        if not forward[0]:
            makespans.append(0.0)
            continue
        span, stage_busy = timeline(ws[r * S].schedule_name, forward, backward, transfer)
        makespans.append(span)
        for s in range(S):
            busy[r * S + s] += stage_busy[s]
    step = max(makespans)
    if R > 1:
        step += max(2 * delays.message_time(ws[s].grad.nbytes) for s in range(S))
    return step

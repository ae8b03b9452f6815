"""local-sgd (and DiLoCo) on Spark: one job over every partition per round.

Programs that synchronise by Average and run in tasks (``placement.py``).
Each round broadcasts the server's parameters theta; partition k runs its
worker program up to its next Average (H local steps of local SGD, each on
B/N rows of its own partition: ``placement.task_job``) on its own rows,
with its private inner rule, whose state (momentum) the driver keeps
between rounds and ships with the round's tasks; the task returns its
drift theta - theta_k (packed, ``messages.Sender.pack``: compressed with
``--compress``, the worker's Sender travelling with its task as the rule
state does) and the examples behind it. The driver decodes each drift, takes the
example-weighted mean drift in partition order and applies the outer rule
once. Only a finished job's results are used, so a retried task counts once.
SIGTERM/SIGINT stop the run after the round under way (no checkpoint: the
workers' copies and inner rule states are not kept in one).

An inner rule's sums over gradients (``Rule.summed_state``: AdaGrad's sums
of squares) are synchronised each round, as Local AdaAlter does (Xie et
al. 2019): every worker starts the round from the same sums, and the
driver adds the example-weighted mean of what the workers' steps added.
With a sum per worker, each scales its steps by its own statistics, and the
averaged copies settle where sum_k D_k grad f_k = 0, above the minimum.
The mean (not the sum, as async's pushes add) keeps a worker's steps the
size of one copy's: a round's progress is the mean of its drifts. With
``--average-epochs``, theta's tail average is evaluated and returned, as
async's server's is (``server/averaging.py``).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

import numpy as np

from ...compressors.messages import Sender, receive, summarize
from ...record.live import add_figures
from ...server.averaging import TailAverage
from ...server.reduce import weighted_sum
from ...server.core import LocalUpdate, ServerCore
from ...rules.local import LocalRule
from ...monitor.due import Due
from .jobs import share
from .sizing import JobTiming
from .tasks import run_segment


def run_rounds(ctx, rule, strategy, w0, recorder):
    sc, jobs, blocks = ctx.sc, ctx.jobs, ctx.blocks
    w = np.array(w0, copy=True)
    acc, tmp = np.empty_like(w), np.empty_like(w)
    local_rules = {k: None for k in range(ctx.workers)}
    compression = ctx.compression
    senders = {k: Sender(compression, k) for k in range(ctx.workers)}
    ended = set()
    updates = dropped = examples = 0
    staleness = Counter()
    core = ServerCore(w, rule, staleness=staleness)  # the outer rule's update
    live = {}  # each worker's losses and examples, for the live series
    stopped = None
    recorder.start(w)
    due = Due(recorder)
    t0 = time.perf_counter()
    positions = dict.fromkeys(range(ctx.workers), 0)  # steps done, per worker
    r = 0
    timing = JobTiming()
    shared = _shared_sums(strategy.local_rule, w)
    # the model evaluated and returned: theta, or its tail average (``--average-epochs``)
    average = TailAverage(w, ctx.average_epochs * ctx.n_examples) if ctx.average_epochs else None
    while len(ended) < ctx.workers:
        bc = share(sc, w, w.nbytes)
        jobs_k = {k: replace(ctx.job(k), start_step=positions[k]) for k in range(ctx.workers)}
        sent = _start_round(shared, strategy.local_rule, local_rules)
        rules_k, senders_k = dict(local_rules), dict(senders)

        def task(it, bc=bc, jobs_k=jobs_k, rules_k=rules_k, senders_k=senders_k):
            out = []
            for b in it:
                res = run_segment(b, strategy, jobs_k[b.index], bc.value, 0, rules_k[b.index],
                                  sender=senders_k[b.index])
                out.append((b.index, res))
            return out

        began = time.perf_counter()
        try:
            results = sorted(jobs.run(blocks, task, what=f"round {r} of {strategy.name}"),
                             key=lambda x: x[0])
        finally:
            bc.destroy(blocking=False)
        timing.add(time.perf_counter() - began, max(res["task_s"] for _, res in results))
        avg = [(k, res) for k, res in results if res["op"] == "average"]
        _end_round(shared, sent, results)
        for k, res in results:
            local_rules[k] = res["local_rule"]
            senders[k] = res["sender"]
            positions[k] += res["steps"]
            examples += res["examples"]
            dropped += res["dropped"]
            add_figures(live, k, res["loss"], res["steps"], res["examples"])
            if res["ended"]:
                ended.add(k)
        if avg:
            weighted_sum({k: receive(compression, res["drift"], w.size, w.dtype)
                          for k, res in avg}, [k for k, _ in avg],
                         [res["examples_behind"] for _, res in avg], acc, tmp)
            if core.apply_sum(acc, updates, counts=len(avg)):
                updates += 1
            else:
                dropped += 1
            if average is not None:
                average.update(w, sum(res["examples"] for _, res in results))
        r += 1
        model = w if average is None else average.params
        stopped = due.look(time.perf_counter() - t0, examples, lambda: (model, updates, dropped),
                           lambda: (examples, updates, dropped), lambda: (live, staleness))
        stopped = stopped or (due.stop_reason if due.signal() else None)  # SIGTERM/SIGINT
        if stopped:
            break
    return {"params": w if average is None else average.params,
            "wall": time.perf_counter() - t0, "examples": examples,
            "updates": updates, "dropped": dropped, "staleness": staleness, "failed": {},
            "stopped": stopped, "timing": timing, "interrupted": due.interrupted,
            "extra": {**summarize([senders[k].stats() for k in range(ctx.workers)], compression,
                                  updates),
                      **({"averaged_epochs": ctx.average_epochs} if average else {})}}


def _shared_sums(inner, w):
    """The inner rule's synchronised sums (a ``LocalRule``'s state), or None
    where it keeps none."""
    if inner is None or not inner.summed_state:
        return None
    shared = LocalRule(inner, -1)
    shared.ensure_state(w.size, w.dtype)
    return shared


def _start_round(shared, inner, local_rules: dict) -> dict:
    """Every worker's inner rule starts the round from the shared sums:
    {worker: the sums sent}."""
    if shared is None:
        return {}
    for k, local in local_rules.items():
        if local is None:
            local_rules[k] = LocalUpdate(inner, k)
    return {k: local.start_from_sums(shared.state) for k, local in local_rules.items()}


def _end_round(shared, sent: dict, results) -> None:
    """The shared sums take the example-weighted mean of what the round's
    steps added to each worker's."""
    total = sum(res["examples"] for k, res in results if k in sent)
    if shared is None or not total:
        return
    for k, res in results:
        if k in sent:
            res["local_rule"].add_sums_to(shared.state, sent[k], res["examples"] / total)

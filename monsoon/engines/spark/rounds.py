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
of squares) are synchronised each round, as on every engine (Local
AdaAlter, Xie et al. 2019; the math is ``server/summed.py``'s): every
task starts the round from the driver's sums, and the driver adds the
example-weighted mean of what the tasks' steps added (read off the inner
rules they return), unless the round's mean drift was dropped. With
``--average-epochs``, theta's tail average is evaluated and returned, as
async's server's is (``server/averaging.py``).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from functools import partial

import numpy as np

from ...compressors.messages import Sender, receive, summarize
from ...record.live import add_figures
from ...server.averaging import TailAverage
from ...server.collective import apply_mean
from ...server.core import LocalUpdate, ServerCore
from ...server.summed import SharedSums
from ...monitor.due import Due
from ...monitor.tally import RunTally
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
    tally = RunTally(ctx.workers, ctx.compression)  # the segments' examples and local steps
    staleness = Counter()
    core = ServerCore(w, rule, staleness=staleness)  # the outer rule's update (its counts)
    live = {}  # each worker's losses and examples, for the live series
    totals, figures = (lambda: (tally.examples, core.version, core.dropped),  # the live rows'
                       partial(_live_figures, live, staleness, senders))
    stopped = None
    recorder.start(w)
    due = Due(recorder, stops=True)  # SIGTERM/SIGINT: after the round under way
    t0 = time.perf_counter()
    positions = dict.fromkeys(range(ctx.workers), 0)  # steps done, per worker
    r = 0
    timing = JobTiming()
    shared = SharedSums.of(strategy.local_rule, w.size, w.dtype)
    # the model evaluated and returned: theta, or its tail average (``--average-epochs``)
    average = TailAverage(w, ctx.average_epochs * ctx.n_examples) if ctx.average_epochs else None
    while len(ended) < ctx.workers:
        bc = share(sc, w, w.nbytes)
        jobs_k = {k: replace(ctx.job(k), start_step=positions[k]) for k in range(ctx.workers)}
        _start_round(shared, strategy.local_rule, local_rules, w)
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
        for k, res in results:
            local_rules[k] = res["local_rule"]
            senders[k] = res["sender"]
            positions[k] += res["steps"]
            tally.add(k, res)
            add_figures(live, k, res["loss"], res["steps"], res["examples"])
            if res["ended"]:
                ended.add(k)
        if avg:
            apply_mean([core], {k: receive(compression, res["drift"], w.size, w.dtype)
                                for k, res in avg}, [k for k, _ in avg],
                       [res["examples_behind"] for _, res in avg], [(0, w.size)], acc, tmp,
                       core.version, sums=shared, sum_parts=_added(shared, avg, w),
                       counts=1)  # one count an update
            if average is not None:
                average.update(w, sum(res["examples"] for _, res in results))
        r += 1
        model = w if average is None else average.params
        stopped = due.look(time.perf_counter() - t0, tally.examples,
                           lambda: (model, core.version, core.dropped,
                                    tally.local_totals(strategy)),
                           totals, figures)
        if stopped:
            break
    due.live(time.perf_counter() - t0, totals, figures, final=True)  # the run's last row
    return {"params": w if average is None else average.params,
            "wall": time.perf_counter() - t0, "examples": tally.examples,
            "updates": core.version, "dropped": core.dropped,
            "local": tally.local_totals(strategy),
            "staleness": staleness, "failed": {},
            "stopped": stopped, "timing": timing, "interrupted": due.interrupted,
            "extra": {**summarize([senders[k].stats() for k in range(ctx.workers)], compression,
                                  core.version),
                      **({"averaged_epochs": ctx.average_epochs} if average else {})}}


def _live_figures(live: dict, staleness: Counter, senders: dict) -> tuple:
    """A live row's figures: the workers' losses, the staleness, the bytes sent."""
    return live, staleness, sum(s.sent_bytes for s in senders.values())


def _start_round(shared, inner, local_rules: dict, w) -> None:
    """Every worker's inner rule starts the round from the shared sums."""
    if shared is None:
        return
    for k, local in local_rules.items():
        if local is None:
            local_rules[k] = LocalUpdate(inner, k)
        shared.start(local_rules[k], w)


def _added(shared, avg: list, w) -> list | None:
    """What each averaging task's steps added to the shared sums (its
    a_k, per field, by rank), for the round's mean; None where there are
    none."""
    if shared is None:
        return None
    added = {k: shared.added(res["local_rule"], w) for k, res in avg}
    return [{k: parts[i] for k, parts in added.items()} for i in range(len(shared.sums))]

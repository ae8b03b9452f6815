"""sync (and serial) on Spark: each step, one job over every partition.

The driver holds the parameters and the rule state. For each global batch
of ``global_batches`` (the plan serial and sync use on every engine) it
broadcasts ``(w, batch ids)`` (no ids, and no permutation drawn, for a
full batch), each partition
returns the mean gradient of its rows of the batch and how many there
were, and the driver sums them weighted by examples in partition order
(``weighted_sum``, as every engine does) and applies the rule once. That
is the batch's mean gradient wherever its rows live: the run equals serial
to floating-point reduction order (a test: 1e-9 in float64 on full
batches). A failed task is retried by Spark inside the step's job, and
only the job's result is applied, so a retry never applies twice.
"""
from __future__ import annotations

import time
from collections import Counter

import numpy as np

from ...rules import UpdateInfo
from ...strategies.batches import global_batches, skip
from ..reduce import finite, weighted_sum
from .checkpointing import restore_state
from .jobs import share
from .tasks import gradient_sum


def run_sync(ctx, rule, w0, batch_size, seed, budget, recorder, ckpts):
    sc, jobs, blocks, n = ctx.sc, ctx.jobs, ctx.blocks, ctx.n_examples
    w = np.array(w0, copy=True)
    state = rule.init(w.size, w.dtype)
    acc, tmp = np.empty_like(w), np.empty_like(w)
    full = batch_size >= n
    start = updates = dropped = examples = 0
    before = 0.0  # run time before the checkpoint resumed from
    staleness = Counter()
    live = {}
    saved = ckpts.load(w0, rule)
    if saved is not None:
        w[...] = saved.arrays["params"]
        restore_state(saved, state)
        start, updates, dropped = saved.meta["step"], saved.meta["applied"], saved.meta["dropped"]
        examples, before = saved.meta["examples"], saved.meta["time_s"]
        staleness[0] = updates
    stopped = None
    recorder.start(w)
    t0 = time.perf_counter() - before
    if full:  # every step is the whole data set: no permutation to draw
        total = budget.steps if budget.steps is not None else budget.epochs
        plan = (None for _ in range(start, total))
    else:
        plan = skip(global_batches(n, batch_size, seed, budget), start)
    for step, batch in enumerate(plan, start=start):
        bc = share(sc, (w, batch), w.nbytes + (0 if batch is None else batch.nbytes))

        def task(it, bc=bc):
            w_, batch_ = bc.value
            return [gradient_sum(b, w_, batch_) for b in it]

        try:
            parts = sorted(jobs.run(blocks, task, what=f"sync step {step}"))
        finally:
            bc.destroy(blocking=False)
        counted = [p for p in parts if p[1] > 0]
        ranks = [p[0] for p in counted]
        weighted_sum({p[0]: p[3] for p in counted}, ranks, [p[1] for p in counted], acc, tmp)
        examples += sum(p[1] for p in counted)
        for k, ex, loss, _ in counted:  # each worker's figures, for the live series
            fig = live.setdefault(k, {"loss_sum": 0.0, "loss_n": 0, "examples": 0})
            fig["loss_sum"], fig["loss_n"], fig["examples"] = (
                fig["loss_sum"] + loss, fig["loss_n"] + 1, fig["examples"] + ex)
        if finite(acc):
            rule.apply(w, acc, state, UpdateInfo(step=updates))
            updates += 1
            staleness[0] += 1
        else:
            dropped += 1
        now = time.perf_counter() - t0
        if recorder.due(now, examples):
            stopped = recorder.record(now, updates, examples, w, dropped)
            if stopped:
                break
        if recorder.live_due(now):
            recorder.live(now, examples, updates, live, staleness, dropped)
        if ckpts.due(updates + dropped):
            ckpts.save(updates + dropped, now, w, state,
                       {"step": step + 1, "examples": examples, "dropped": dropped,
                        "applied": updates})
    return {"params": w, "wall": time.perf_counter() - t0, "examples": examples,
            "updates": updates, "dropped": dropped, "staleness": staleness, "failed": {},
            "stopped": stopped}

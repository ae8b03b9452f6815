"""The floor under any data-parallel step on this machine: two processes that
only compute their half-batch gradient and meet at a lock-free barrier (no
sum, no update, no bookkeeping), against one process computing the whole
batch's gradient. Whatever a framework adds comes on top of this ratio.

``bare_ratio(make_problem, batch, steps)`` returns (us/step of the pair,
us/step alone). ``make_problem`` must be a module-level function.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np


def _pair_worker(rank, make_problem, batch, steps, counters, out):
    import torch

    torch.set_num_threads(1)
    problem = make_problem()
    w = problem.initial_params(0)
    half = np.arange(rank * batch // 2, (rank + 1) * batch // 2)
    arrived = np.frombuffer(counters.get_obj(), dtype=np.int64)
    other = 1 - rank
    for _ in range(20):
        problem.gradient(w, half)
    deadline = time.monotonic() + 120
    for step in range(1, steps + 1):
        if step == 11:
            t0 = time.perf_counter()
        problem.gradient(w, half)
        arrived[rank] = step
        while arrived[other] < step:
            if time.monotonic() > deadline:
                raise TimeoutError("the other process stopped")
            os.sched_yield()
    out.put((time.perf_counter() - t0) / (steps - 10))


def bare_pair_us(make_problem, batch: int, steps: int) -> float:
    ctx = mp.get_context("spawn")
    counters = ctx.Array("q", 2)
    out = ctx.Queue()
    procs = [ctx.Process(target=_pair_worker, args=(r, make_problem, batch, steps, counters, out))
             for r in range(2)]
    for p in procs:
        p.start()
    per_step = max(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(30)
    return 1e6 * per_step


def bare_alone_us(make_problem, batch: int, steps: int) -> float:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        problem = make_problem()
        w = problem.initial_params(0)
        rows = np.arange(batch)
        for _ in range(20):
            problem.gradient(w, rows)
        t0 = time.perf_counter()
        for _ in range(steps):
            problem.gradient(w, rows)
        return 1e6 * (time.perf_counter() - t0) / steps
    finally:
        torch.set_num_threads(saved)

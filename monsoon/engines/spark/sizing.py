"""How much of a run Spark's job scheduling (or a streamed exchange) takes,
and how much work per job keeps it small.

A local-sgd round is one Spark job, and a job costs its scheduling
(``bench/spark_overhead.py`` measures it) on top of the task's own work.
An async or EASGD exchange goes over the socket of its worker's long task
(``stream.py``): it costs a round trip of what it carries
(``exchange_overhead``), measured on the driver through a local socket.
``JobTiming`` adds up, per job, the driver's wall time and the task's own
time; ``share`` is the part of the jobs' time that was scheduling,
reported as ``spark_job_share``. ``steps_per_job`` is the fewest steps per
job that keep that share at or under ``bound``: with o the job overhead
and s the step time, o / (o + n s) <= bound when n >= o (1 - bound) /
(bound s).
"""
from __future__ import annotations

import math
import socket
import threading
import time

import numpy as np


class JobTiming:
    """Per exchange: ``what`` is "job" (a Spark job each) or "exchange" (a
    round trip over a long task's socket)."""

    def __init__(self, what: str = "job"):
        self.what = what
        self._lock = threading.Lock()
        self.jobs = 0
        self.job_s = 0.0
        self.task_s = 0.0

    def add(self, job_s: float, task_s: float) -> None:
        with self._lock:
            self.jobs += 1
            self.job_s += job_s
            self.task_s += min(task_s, job_s)

    @property
    def share(self) -> float | None:
        """The jobs' time not spent in their tasks (None: no job yet)."""
        return None if self.job_s <= 0 else (self.job_s - self.task_s) / self.job_s

    def summary(self) -> dict:
        share = self.share
        return {f"spark_{self.what}s": self.jobs,
                f"spark_{self.what}_share": None if share is None else round(share, 4)}


def steps_per_job(job_overhead_s: float, step_s: float, bound: float = 0.1,
                  most: int = 4096) -> int:
    """The fewest steps per job (a power of two, at most ``most``) whose
    job overhead share is at most ``bound``."""
    if not 0 < bound < 1:
        raise ValueError(f"the overhead bound must be in (0, 1), got {bound}")
    if job_overhead_s <= 0:
        return 1
    if step_s <= 0:
        return most
    need = job_overhead_s * (1 - bound) / (bound * step_s)
    return int(min(most, 2 ** max(0, math.ceil(math.log2(max(need, 1.0))))))


def measure_jobs(ctx, w, steps: int = 8, rows: int | None = None) -> tuple[float, float]:
    """(job overhead s, step s) on partition 0: a job timing ``steps``
    gradient steps of ``rows`` rows (default: a batch) in its task, run
    twice (the first warms the worker up); the overhead is the job's wall
    time less its task's."""
    from .jobs import share

    size = min(rows or ctx.batch_size, ctx.sizes[0])
    w = np.asarray(w)
    bc = share(ctx.sc, w, w.nbytes)

    def task(it, bc=bc):
        out = []
        for block in it:
            rows = np.arange(size)
            began = time.perf_counter()
            for _ in range(steps):
                block.problem.gradient(bc.value, rows)
            out.append(time.perf_counter() - began)
        return out

    try:
        for _ in range(2):
            began = time.perf_counter()
            (task_s,) = ctx.jobs.run(ctx.blocks, task, [0], what="timing a job's overhead")
            job_s = time.perf_counter() - began
    finally:
        bc.destroy()
    return max(0.0, job_s - task_s), task_s / steps


def exchange_overhead(payload, repeats: int = 3) -> float:
    """Seconds to send ``payload`` (what a segment's message carries) over a
    local socket and back, the median of ``repeats``: a streamed
    exchange's pickling and copies, out to the task and its result back."""
    from .barrier import receive, send

    a, b = socket.socketpair()
    a.settimeout(30.0)
    b.settimeout(30.0)

    def echo():
        for _ in range(repeats):
            send(b, receive(b))

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    times = []
    try:
        for _ in range(repeats):
            began = time.perf_counter()
            send(a, payload)
            receive(a)
            times.append(time.perf_counter() - began)
    finally:
        t.join(timeout=30.0)
        a.close()
        b.close()
    return sorted(times)[len(times) // 2]

"""How much of a run Spark's job scheduling takes, and how much work per
job keeps it small.

Every exchange with the driver is one Spark job (async: a push period;
local-sgd: a round; easgd: a tau period), and a job costs its scheduling
(``bench/spark_overhead.py`` measures it) on top of the task's own work.
``JobTiming`` adds up, per job, the driver's wall time and the task's own
time; ``share`` is the part of the jobs' time that was scheduling,
reported as ``spark_job_share``. ``steps_per_job`` is the fewest steps per
job that keep that share at or under ``bound``: with o the job overhead
and s the step time, o / (o + n s) <= bound when n >= o (1 - bound) /
(bound s).
"""
from __future__ import annotations

import math
import threading


class JobTiming:
    def __init__(self):
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
        return {"spark_jobs": self.jobs,
                "spark_job_share": None if share is None else round(share, 4)}


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

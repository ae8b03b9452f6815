"""The Spark engine: training where the data lives in Spark (DeepDist's
design, seed 004, done with what Spark provides).

The driver holds the parameter server: the parameters, the rule state and
the staleness records. Executors hold the data, one ``Block`` per
partition (``blocks.py``, ``data.py``), converted and cached once; only
parameters (broadcast variables, or the task's closure when under 256 KiB:
``jobs.share``) and gradients or updates (task results) travel, never the
data. Per strategy:

- ``sync`` / ``serial`` (``sync.py``): one job per step over every
  partition, reduced in partition order: equals serial.
- ``async`` (Downpour) and ``easgd`` (``server.py``): one driver thread per
  partition runs one small job per push period on that partition alone;
  the driver applies each finished job's result once.
- ``local-sgd`` (``rounds.py``): one job per round of H local steps.
- ``hogwild`` is refused: executors share no memory. ``pipeline`` is
  refused: Spark tasks cannot pass activations to each other.

Faults: Spark retries a failed task inside its job (``spark.task.maxFailures``;
a ``local[N, F]`` master allows F attempts), and the driver applies only
what a finished job returns, so an update lands exactly once. async and
easgd name a partition whose job fails for good in ``failed_workers`` and
carry on; sync fails fast with the task's error. Every wait has the
run's ``timeout``; every job belongs to the run's job group, cancelled
before the run returns or fails. A session the engine started is stopped
after the run; a running one (spark-submit, the user's) is left running.

Checkpoints (``checkpointing.py``): the driver writes its server state
every ``checkpoint_every`` updates into the run folder; ``resume`` carries
a sync or async run on from the newest. Not yet: checkpoints of local-sgd's
and easgd's workers, backup workers (Spark's own ``spark.speculation``
re-launches slow tasks instead).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from ...options import Option
from ...strategies import Budget, WorkerJob
from ...strategies.ops import (AllReduce, Apply, Average, Elastic, Fetch, Gradient,
                               LocalApply, LocalStep, Push)
from ..base import Engine, EngineResult
from ..options import CHECKPOINT_EVERY, RESUME, TIMEOUT, checkpoint_paths
from .jobs import Jobs



@dataclass
class RunContext:
    """What the driver loops share."""
    sc: object
    jobs: Jobs
    blocks: object          # the RDD of Blocks, one per partition (= worker)
    workers: int
    n_examples: int
    sizes: list             # rows per partition
    batch_size: int
    seed: int
    budget: Budget
    local_batch: bool       # local-sgd: each worker takes its part of the batch
    timeout: float

    def job(self, k: int) -> WorkerJob:
        """Worker k's program runs on its own partition as if it were the
        whole data set (its rows 0..n_k-1), with its share of the budget."""
        from ...strategies.batches import part_bounds

        if self.local_batch:  # local SGD: B/N per worker per step, every worker every step
            a, b = part_bounds(self.batch_size, self.workers, k)
            size, budget = max(1, b - a), self.budget
        else:
            size = self.batch_size
            budget = Budget(epochs=self.budget.epochs,
                            steps=self.budget.steps_for(k, self.workers))
        return WorkerJob(0, 1, self.sizes[k], min(size, max(1, self.sizes[k])), self.seed,
                         budget)


class SparkEngine(Engine):
    """Executors share no memory (no several-worker Apply: hogwild), and
    tasks cannot pass activations to each other (no pipeline stages)."""
    name = "spark"
    ops = frozenset({Gradient, Apply, Fetch, Push, LocalStep, LocalApply, AllReduce, Average,
                     Elastic})
    virtual_time = False
    backend_used = "spark tasks"
    options = (
        Option("master", str, None, "Spark master URL (default: the running SparkSession's, "
               "else local[WORKERS], started and stopped by the run)"),
        TIMEOUT, CHECKPOINT_EVERY, RESUME,
    )

    @classmethod
    def from_options(cls, run, master=None, timeout=TIMEOUT.default,
                     checkpoint_every=CHECKPOINT_EVERY.default, resume=None):
        return cls(master=master, timeout=timeout,
                   **checkpoint_paths(run.out, checkpoint_every, resume))

    def __init__(self, master: str | None = None, timeout: float = TIMEOUT.default,
                 checkpoint_dir: str | None = None, checkpoint_every: int = 0,
                 resume_dir: str | None = None):
        self.master = master
        self.timeout = timeout
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume_dir = resume_dir
        self.shards_used = 1

    def describe(self) -> dict:
        return {"engine": self.name, "master": self.master, "timeout_s": self.timeout,
                "checkpoint_every": self.checkpoint_every, "resumed_from": self.resume_dir}

    def check(self, strategy, workers) -> None:
        super().check(strategy, workers)
        if getattr(strategy, "n_fetch", 1) != getattr(strategy, "n_push", 1):
            raise ConfigError(f"on the spark engine a worker fetches once per task and pushes "
                              f"at its end: set --n-fetch equal to --n-push (got "
                              f"{strategy.n_fetch} and {strategy.n_push})")
        if self.resume_dir and not strategy.shared_params:
            raise ConfigError(f"the spark engine keeps no checkpoints of {strategy.name}'s "
                              "private worker copies yet; resume sync or async runs, or use "
                              "--engine local")
        if AllReduce in strategy.uses and not getattr(strategy, "raw_gradients", False):
            raise ConfigError(f"the spark engine reduces each step's gradient where the data "
                              f"lives, so it cannot run {strategy.name}'s own AllReduce program "
                              "yet; use --engine local, sim, ray or torch")

    def run(self, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder):
        self.check(strategy, workers)
        from .data import SparkData
        from .session import session_for

        t_begin = time.perf_counter()
        spark_data = isinstance(problem, SparkData)
        if spark_data:
            sc, started = problem._sc, False
        else:
            sc, started = session_for(self.master, workers)
        master = sc.master
        jobs = Jobs(sc, self.timeout, strategy.name)  # names the run's job group
        blocks = None
        try:
            if spark_data:
                blocks = problem.blocks(sc, workers, seed)
            else:
                from .blocks import problem_blocks

                blocks = problem_blocks(sc, problem, workers, seed).persist()
            counts = dict(jobs.run(blocks, lambda it: [(b.index, b.n) for b in it],
                                   what="loading the data into the executors"))
            sizes = [counts[k] for k in range(workers)]
            ctx = RunContext(sc, jobs, blocks, workers, problem.n_examples, sizes, batch_size,
                             seed, budget, Average in strategy.uses, self.timeout)
            startup = time.perf_counter() - t_begin
            from .checkpointing import DriverCheckpoints

            ckpts = DriverCheckpoints(self, problem, strategy, rule, workers, batch_size, seed,
                                      recorder)
            out = self._loop(ctx, rule, strategy, w0, batch_size, seed, budget, recorder, ckpts)
        finally:
            jobs.close(workers)
            if blocks is not None and not spark_data:
                blocks.unpersist()
            if started:
                from pyspark.sql import SparkSession

                SparkSession.builder.getOrCreate().stop()
        return EngineResult(
            out["params"], startup, out["wall"], out["examples"], out["updates"],
            out["dropped"], out["staleness"],
            [{"worker": k, "error": e, "traceback": e} for k, e in sorted(out["failed"].items())],
            stopped=out["stopped"], worker_params=out.get("worker_params", {}),
            extra={"spark_master": master, "partitions": workers,
                   **({"checkpoint": str(ckpts.last_path)} if ckpts.last_path else {})})

    def _loop(self, ctx, rule, strategy, w0, batch_size, seed, budget, recorder, ckpts):
        if AllReduce in strategy.uses or Apply in strategy.uses:
            from .sync import run_sync

            return run_sync(ctx, rule, w0, batch_size, seed, budget, recorder, ckpts)
        if Average in strategy.uses:
            from .rounds import run_rounds

            return run_rounds(ctx, rule, strategy, w0, recorder)
        from .server import DriverServer

        return DriverServer(ctx, rule, strategy, w0, ckpts).run(recorder)

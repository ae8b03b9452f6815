"""The Spark engine: training where the data lives in Spark (DeepDist's
design, seed 004, done with what Spark provides).

The driver holds the parameter server: the parameters, the rule state and
the staleness records. Executors hold the data, one ``Block`` per
partition (``blocks.py``, ``data.py``), converted and cached once; only
parameters (broadcast variables, or the task's closure when under 960 KiB:
``jobs.share``) and gradients or updates (task results) travel, never the
data. The engine carries out the ops of the strategy's worker programs;
where each program runs follows from its declarations (``placement.py``):

- in one barrier stage (``barrier.py``: sync, where every partition gets a
  slot at once): the ranks all-reduce each step among themselves (gloo).
- on the driver (``driver.py``: serial, a plug-in's clipped sync, sync with
  no barrier slot): each batch of Gradient ops is one job over every
  partition, reduced on the driver in rank order. Either way sync = serial.
- in tasks, segment by segment (up to the next exchange): Push / Elastic
  programs (async, ssp, easgd: ``spark/server.py``) run ONE long job per
  partition, fed segments over a socket (``stream.py``) by a driver thread
  that applies each result once; Average programs (local-sgd:
  ``rounds.py``) run one job per round of H local steps. Refused: sync with
  ``--compress`` (tasks.py packs the others' messages), Apply on several workers
  (hogwild: executors share no memory), pipeline stages (tasks cannot pass activations).

Faults: Spark retries a failed task inside its job (``spark.task.maxFailures``;
a ``local[N, F]`` master allows F attempts), and the driver applies only
what a finished job returns, so an update lands exactly once. Programs with
no barrier (async, ssp, easgd) name a partition whose job fails for good in
``failed_workers`` and carry on; the others fail fast with the task's
error. Every wait has the run's ``timeout``; every job belongs to the run's
job group, cancelled before the run returns or fails. A session the engine
started is stopped after the run; a running one (spark-submit, the user's)
is left running.

Checkpoints: the driver writes its server state every ``checkpoint_every``
updates; only finished jobs change it, so one between them is exact (sync
and serial resume bit-identical; an async worker from its last applied
push). Not kept: delay-aware rules' read records, private worker copies
(local-sgd, easgd); no backup workers (``spark.speculation`` instead). A
stop signal ends a run where its state is exact (``SparkEngine``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from ...options import Option
from ...strategies import Budget, WorkerJob
from ...strategies.base import SHARD
from ...strategies.ops import (AllReduce, Apply, Average, Clock, Elastic, Fetch, Gradient,
                               LocalApply, LocalStep, Push)
from ...record.checkpoints import Checkpointer
from ...monitor.lifecycle import reclaim_signals
from ..base import Engine
from ..options import CHECKPOINT_EVERY, RESUME, TIMEOUT
from ...monitor.tally import EngineResult, failed_list, run_folder_extra
from .jobs import Jobs
from .placement import averages, check_fewest_rows, check_segments, in_tasks, task_job


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
    timeout: float
    strategy: object
    compression: object = None  # messages.Compression (--compress)
    target_loss: float | None = None  # the run stops once its loss is at it
    average_epochs: float = 0.0  # the server's tail average's horizon (server.py)
    fewest: int = 1  # the fewest rows a training pass takes (``placement.check_fewest_rows``)

    def job(self, k: int) -> WorkerJob:
        """What worker k's program runs on in a task: its own partition, as
        if it were the whole data set (``placement.task_job``)."""
        return task_job(self.strategy, k, self.sizes[k], self.workers, self.batch_size,
                        self.seed, self.budget)


JOB_SHARE = 0.1  # the job overhead's share of a job that sizing aims under
# Convergence bounds n_push: a worker's copy runs at most a quarter of its
# shard's pass (and an eighth of its run) away from the server before its
# delta lands, so the others' progress reaches it several times an epoch.
PUSHES_PER_EPOCH, PUSHES_PER_RUN = 4, 8


def executors_need_torch(problem, strategy, workers: int) -> bool:
    """Whether this run's tasks import torch: a torch problem's, or the
    ranks of sync's barrier stage (gloo). A session the engine starts
    imports it in its worker daemon only then (``daemon.py``)."""
    from .barrier import may_fit

    return problem.uses_torch or may_fit(strategy, workers)


def loaded_sizes(sc, blocks, workers: int, wait: float, torch: bool) -> list:
    """Rows per partition, counted by the job that loads (persists) the
    Blocks in the executors, which carries the executor check
    (``preflight.check_executors``) and so waits as long (``wait``)."""
    from .preflight import check_executors

    counts = dict(check_executors(sc, wait, torch=torch, carry=(
        blocks, lambda it: [(b.index, b.n) for b in it], "loading the data into the executors")))
    return [counts[k] for k in range(workers)]


def steps_per_exchange(strategy) -> dict:
    """The steps per job the strategy runs (its declared ``period``: n_push,
    local_steps, tau), or {} where it declares none."""
    return {} if strategy.period is None else {strategy.period: strategy.period_steps()}


class SparkEngine(Engine):
    """Executors share no memory (no several-worker Apply: hogwild), and
    tasks cannot pass activations to each other (no pipeline stages).

    SIGTERM/SIGINT: the driver stops where its state is exact, writes a
    last checkpoint there (also with ``checkpoint_every`` 0) and returns the
    result marked ``interrupted``; each loop says where (``driver.py``,
    ``barrier.py``, ``server.py``, ``rounds.py``; docs/faults.md). A new
    SparkContext installs PySpark's SIGINT handler (cancel every job, raise
    KeyboardInterrupt): the run puts its own back (``reclaim_signals``).
    Spark's JVM and Python workers ignore Ctrl-C (PySpark starts them so)."""
    name = "spark"
    ops = frozenset({Gradient, Apply, Fetch, Push, LocalStep, LocalApply, AllReduce, Average,
                     Elastic, Clock})
    virtual_time = False
    stops_on_signal = True  # SIGTERM/SIGINT: the driver stops where its state is exact
    keeps_private_copies = False  # local SGD, EASGD: none written (refuse_checkpoints)
    backend_used = "spark tasks"
    compresses = True  # tasks return packed messages (tasks.py); not sync: see below
    options = (
        Option("master", str, None, "Spark master URL (default: the running SparkSession's, "
               "else local[WORKERS], started and stopped by the run)"),
        TIMEOUT, CHECKPOINT_EVERY, RESUME,
        Option("average_epochs", float, 0.0, "async, SSP and local SGD: the run returns, and "
               "evaluates while it goes, the server's parameters averaged over about the last "
               "AVERAGE_EPOCHS epochs (tail averaging; spark: data defaults to 1); 0: the "
               "last iterate", check=lambda v: None if v >= 0 else ">= 0"),
    )
    described = ("master", "timeout", "average_epochs", "checkpoint_every", "resume_dir")

    def __init__(self, master: str | None = None, timeout: float = TIMEOUT.default,
                 checkpoint_dir: str | None = None, checkpoint_every: int = 0,
                 resume_dir: str | None = None, average_epochs: float = 0.0):
        self.average_epochs = average_epochs
        self.master = master
        self.timeout = timeout
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume_dir = resume_dir
        self.shards_used = 1

    @classmethod
    def evaluates_while_running(cls, strategy) -> bool:
        """A loss job runs between the jobs of a run in tasks or on the
        driver; a collective's barrier stage holds every slot, so none can
        run during it (its full-batch steps give their losses themselves)."""
        return AllReduce not in strategy.uses

    @classmethod
    def stops_on_loss(cls, strategy) -> bool:
        """Where a loss job can run (above); in the barrier stage only a
        full-batch step's own loss is checked (``--target-loss``)."""
        return cls.evaluates_while_running(strategy)

    @classmethod
    def stops_at_step_loss(cls, strategy) -> bool:
        """Sync's full-batch steps all-reduce the full-data loss with the
        gradient, and the run stops at the first at the target."""
        return AllReduce in strategy.uses and cls.gives_loss(strategy)

    @classmethod
    def gives_loss(cls, strategy) -> bool:
        """Sync's steps all-reduce the step's loss with its gradient (barrier
        stage, or the driver's sum); serial's is its one worker's."""
        return strategy.full_batch_steps

    def compression_refused(self, strategy) -> str | None:
        if not in_tasks(strategy):
            return (f"on the spark engine {strategy.name}'s workers send no message of their "
                    "own: each step's gradient is summed from every partition's rows of the "
                    "step's batch, the partitions' sums all-reduced among their tasks in one "
                    "barrier stage (or gathered on the driver, where the executors lack a slot "
                    "for every partition at once), so no worker message exists to compress; "
                    "use async, ssp, local-sgd or easgd on spark, or --engine ray or torch for "
                    "compressed sync")
        return None

    def check(self, strategy, workers) -> None:
        super().check(strategy, workers)
        if in_tasks(strategy):
            check_segments(strategy)

    def preflight(self, problem, strategy, workers, batch_size) -> None:
        """A given ``--average-epochs`` where the run keeps no average
        (``placement.averages``: the driver's programs, EASGD's centre)
        would change nothing yet be recorded: refused, but where compare
        gives it to every strategy."""
        super().preflight(problem, strategy, workers, batch_size)
        if (self.average_epochs and "average_epochs" in self.given - self.shared
                and not averages(strategy)):
            from ...strategies import STRATEGIES

            where = ", ".join(sorted(name for name, cls in STRATEGIES.all().items()
                                     if cls is not None and averages(cls)))
            flag = self.option("average_epochs").named(self.cli)
            raise ConfigError(f"{flag} averages the server's parameters of a run whose workers "
                              f"run in Spark tasks and push or average ({where}); "
                              f"{strategy.name} keeps no such average: drop {flag}")

    def run(self, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder):
        self.check(strategy, workers)
        from ...problems.spark_data import SparkHeld
        from .session import session_for

        t_begin = time.perf_counter()
        spark_data = isinstance(problem, SparkHeld)
        if spark_data:
            sc, started = problem._sc, False
            problem.timeout = self.timeout  # its loss jobs on the executors wait as long
        else:
            sc, started = session_for(self.master, workers,
                                      torch=executors_need_torch(problem, strategy, workers))
            reclaim_signals()  # a new SparkContext's SIGINT handler cancels every job
        master = sc.master
        # start-up, not a step: starting the executors' Python (and torch) may take
        # longer than a short --timeout allows a step
        wait = max(self.timeout, TIMEOUT.default)
        if spark_data:  # its conversion checked the executors; a session it did not, here
            from .preflight import check_executors

            check_executors(sc, wait, torch=problem.uses_torch)
        jobs = Jobs(sc, self.timeout, strategy.name)  # names the run's job group
        blocks = None
        try:
            if spark_data:
                blocks = problem.blocks(sc, workers, seed, equal=strategy.draws == SHARD)
            else:
                from .blocks import problem_blocks

                blocks = problem_blocks(sc, problem, workers, seed).persist()
            if spark_data:  # its conversion counted each partition's rows
                sizes = list(problem.counts)
            else:
                sizes = loaded_sizes(sc, blocks, workers, wait, problem.uses_torch)
            fewest = check_fewest_rows(problem, strategy, sizes, batch_size, seed, budget)
            ctx = RunContext(sc, jobs, blocks, workers, problem.n_examples, sizes, batch_size,
                             seed, budget, self.timeout, strategy, self.compression,
                             recorder.target_loss, self.average_epochs, fewest)
            sizing = self._size_jobs(ctx, strategy, rule, w0)
            startup = time.perf_counter() - t_begin
            ckpts = Checkpointer.for_engine(self, problem, strategy, rule, workers, batch_size,
                                            seed, recorder)
            out = self._loop(ctx, rule, strategy, w0, recorder, ckpts,
                             problem if spark_data else None)
        finally:
            jobs.close(workers)
            if blocks is not None and not spark_data:
                blocks.unpersist()
            if started:
                sc.stop()
        return EngineResult(
            out["params"], startup + out.get("launch_s", 0.0), out["wall"], out["examples"], out["updates"],
            out["dropped"], out["staleness"],
            failed_list(out["failed"]),
            stopped=out["stopped"], interrupted=out.get("interrupted"),
            worker_params=out.get("worker_params", {}),
            # the workers' local steps (applied, dropped), where they take any
            local_updates=out["local"][0] if out.get("local") else None,
            dropped_local_updates=out["local"][1] if out.get("local") else None,
            # the rows a step left out (``tasks.usable``), where a model's pass needs more than one
            examples_left_out=out.get("left_out") if ctx.fewest > 1 else None,
            extra={"spark_master": master, "partitions": workers,
                   **(out["timing"].summary() if "timing" in out else {}),
                   **steps_per_exchange(strategy), **sizing, **out.get("extra", {}),
                   **run_folder_extra(ckpts.last_path, ckpts.resumed_from)})

    def _size_jobs(self, ctx, strategy, rule, w0) -> dict:
        """A strategy with an exchange period (``Strategy.period``: async's
        push period, local SGD's round, EASGD's tau) none of whose options
        was given: as many steps per exchange as keep its overhead at most
        JOB_SHARE of it, from a timed job of steps (``sizing.py``), but
        at least PUSHES_PER_EPOCH exchanges per worker per epoch and
        PUSHES_PER_RUN in its run (convergence: how far a copy drifts
        before it is merged). The overhead: a round's Spark job
        (local SGD), or a push's round trip over its task's socket
        (``stream.py``: async, SSP, EASGD)."""
        if (not in_tasks(strategy) or strategy.period is None
                or set(strategy.period_options) & self.given):
            return {}
        from .sizing import exchange_overhead, measure_jobs, steps_per_job

        # what worker 0's task is given: a push period's steps take batches of
        # its shard, its share of a step budget; a round's, its part of each
        # global batch, every step (``placement.task_job``)
        job = ctx.job(0)
        job_s, step_s = measure_jobs(ctx, w0, rows=job.batch_size)
        per_epoch = max(1, min(ctx.sizes) // job.batch_size)
        per_worker = job.budget.steps or (job.budget.epochs or 1) * per_epoch
        most = max(1, min(per_epoch // PUSHES_PER_EPOCH, per_worker // PUSHES_PER_RUN))
        found = {"job_overhead_s": job_s, "step_s": step_s}
        overhead = job_s
        if Average not in strategy.uses:  # streamed: parameters and the rule's state
            # go out, the delta and the state come back
            state = rule.init(len(w0), np.asarray(w0).dtype)
            overhead = found["exchange_s"] = exchange_overhead((np.asarray(w0), state))
        n = steps_per_job(overhead, step_s, JOB_SHARE, most=most)
        strategy.set_period(n, rule.schedule.lr)
        return {f"{strategy.period}_chosen": n, f"{strategy.period}_most": most, **found}

    def _loop(self, ctx, rule, strategy, w0, recorder, ckpts, held=None):
        if not in_tasks(strategy):
            from .barrier import fits, run_barrier

            if fits(strategy, ctx.sc, ctx.workers, ctx.blocks):  # its slots are all taken: no
                # loss job can run; the target is checked on full-batch step losses alone
                recorder.check_target = False  # (``barrier.py``)
                return run_barrier(ctx, rule, strategy, w0, recorder, ckpts)
            from .driver import DriverPrograms

            recorder.check_target = True

            return DriverPrograms(ctx, rule, strategy, w0, ckpts).run(recorder)
        recorder.check_target = True  # between jobs, a loss job can run
        if Average in strategy.uses:
            from .rounds import run_rounds

            return run_rounds(ctx, rule, strategy, w0, recorder)
        from .server import DriverServer

        server = DriverServer(ctx, rule, strategy, w0, ckpts)
        if held is not None:  # its tasks hold the slots: they evaluate the loss
            held.streams = server.sums
        try:
            return server.run(recorder)
        finally:
            if held is not None:
                held.streams = None

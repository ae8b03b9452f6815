"""Where a worker's program runs on Spark: on the driver, or inside tasks.

A task runs a worker's program a segment at a time, between two exchanges
with the server on the driver, on data that one partition holds, starting
from parameters shipped with the segment (``stream.py``, ``rounds.py``). From the strategy's
declarations (never its name):

- ``in_tasks``: a program on private copies (``shared_params`` False) with
  no AllReduce or Apply runs in tasks, one segment (up to its next Push,
  Average or Elastic) per task, when its workers draw from their own shards
  (``draws == SHARD``: worker k's shard is partition k, so its batches are
  exactly those it draws on the local engine), or when it synchronises by
  Average over global batches (local SGD): worker k then draws its part of
  each batch, B/N examples, from its own partition, with the whole step
  budget (one job per round keeps the data where it lives). Every other
  program runs on the driver (``driver.py``): exact, one job per batch of
  gradients.
- ``averages``: the programs whose server's parameters ``--average-epochs``
  tail-averages: those in tasks but EASGD's (its centre is an average).
- ``task_job``: the WorkerJob a task runs: the program as a single worker
  over the partition's rows 0..n_k-1 (``Block.rows_of`` maps them back).
- ``check_fewest_rows``: a torch model that cannot train on a pass of one
  example (a BatchNorm over one value per channel: ``TorchModel.fewest_rows``)
  is refused before the run where a task's plan on its partition would
  hand it one, or, for the driver's programs, where a partition holds one
  row or the global plan has a gradient of one row in all (an epoch's
  short last batch, a batch size of 1: ``_check_driver_plan``); it failed
  in a task after Spark's retries. A batch that gives a larger partition
  one row by chance cannot be foreseen: the driver's programs leave that
  row out of the step (``tasks.usable``; the step is the mean over the
  rows it took, and only those count as its examples).
- ``check_segments``: a task reads the parameters once, at its start. A dry
  run of the program (stub gradients) refuses one that reads them again
  before its exchange, or that goes on after a Push without reading them
  (a ``Clock`` right after a Push is part of the exchange: the driver
  carries it out between the two segments).
"""
from __future__ import annotations

import numpy as np

from ...errors import ConfigError
from ...strategies.base import SHARD, Budget, WorkerJob, refuse_short_passes
from ...strategies.batches import chunk_sizes, part_bounds
from ...strategies.ops import AllReduce, Apply, Average, Clock, Elastic, Fetch, Gradient, Push

EXCHANGES = (Push, Average, Elastic)


def in_tasks(strategy) -> bool:
    if strategy.shared_params or AllReduce in strategy.uses or Apply in strategy.uses:
        return False
    return strategy.draws == SHARD or Average in strategy.uses


def averages(strategy) -> bool:
    """Whether the run's model can be the server's tail average
    (``--average-epochs``; ``server.py``, ``rounds.py``): a program in tasks
    whose server holds no elastic centre."""
    return in_tasks(strategy) and Elastic not in strategy.uses


def task_job(strategy, k: int, rows: int, workers: int, batch_size: int, seed: int,
             budget: Budget) -> WorkerJob:
    if strategy.draws == SHARD:
        size, budget = batch_size, Budget(budget.epochs, budget.steps_for(k, workers))
    else:  # its part of each global batch, from its own partition, every step
        a, b = part_bounds(batch_size, workers, k)
        size = max(1, b - a)
    return WorkerJob(0, 1, rows, min(size, max(1, rows)), seed, budget)


def check_fewest_rows(problem, strategy, sizes: list, batch_size: int, seed: int,
                      budget: Budget) -> None:
    """Refuse, in one line, a plan that would hand a torch model that needs
    two examples a training pass of one (see the module doc): in tasks,
    each partition's own plan (``task_job``), naming a batch size that
    works; on the driver, a partition of one row, and a gradient of one
    row in all (``_check_driver_plan``). Returns the fewest rows a pass
    takes (1 where there is no such limit). The driver's programs cut each
    batch among the partitions that hold its rows: a batch that gives a
    larger partition fewer rows than that by chance is not refused, its
    share is left out of the step (``tasks.usable``)."""
    if not problem.uses_torch:
        return 1
    from ...problems.torch_model import TorchModel

    need, why = TorchModel.fewest_rows(problem)
    if need < 2:
        return need
    if not in_tasks(strategy):
        small = min((rows for rows in sizes if rows), default=need)
        if small < need:
            raise ConfigError(f"the model cannot train on a forward pass of {small} example "
                              f"({why}; torch needs {need} or more in training), and partition "
                              f"{sizes.index(small)} holds {small} row: {strategy.name} on Spark "
                              "computes each partition's rows of a batch there; repartition the "
                              "data into fewer, larger partitions")
        _check_driver_plan(need, why, strategy, len(sizes), batch_size, sum(sizes), budget)
        return need

    def passes(b):  # each partition's smallest pass at batch size b
        return [min(chunk_sizes(j.n_examples, j.batch_size, j.budget.steps), default=need)
                for j in (task_job(strategy, k, rows, len(sizes), b, seed, budget)
                          for k, rows in enumerate(sizes))]

    at = passes(batch_size)
    k = at.index(min(at))
    refuse_short_passes(
        need, why, lambda b: min(passes(b)), batch_size, max(sizes),
        f"{strategy.name} on Spark at batch size {batch_size} gives the task on partition {k} "
        f"({sizes[k]} rows) one (its short last batch, or its part of each global batch)",
        "repartition the data into fewer, larger partitions")
    return need


def _check_driver_plan(need: int, why: str, strategy, workers: int, batch_size: int, n: int,
                       budget: Budget) -> None:
    """Refuse, in one line naming a batch size that works, a plan of the
    driver's programs with a gradient of fewer than ``need`` rows in all
    (an epoch's short last batch, a batch size of 1, a worker's part of a
    batch cut among the workers: ``Strategy.pass_sizes``, as ``config``
    checks the local engine's plan): every partition's share of it is
    short, so the driver would leave it out of every epoch's steps
    (``tasks.usable``). A sync step reduced where it is computed
    (``raw_gradients`` on shared parameters: ``driver.py``, ``barrier.py``)
    takes each partition's rows of the whole global batch, so there only
    the global batches count."""
    parts = 1 if strategy.shared_params and strategy.raw_gradients else workers

    def fewest(b):
        return min(strategy.pass_sizes(parts, b, n, budget.steps), default=need)

    k = fewest(batch_size)
    cause = ("an epoch's short last batch, or a batch of that size" if parts == 1 else
             "an epoch's short last batch, a batch of that size, or a worker's part of a batch "
             "cut among the workers")
    refuse_short_passes(
        need, why, fewest, batch_size, min(strategy.largest_batch(parts, n), n),
        f"{strategy.name} on Spark at batch size {batch_size} on {n} rows gives a gradient "
        f"{k} row{'s' if k > 1 else ''} in all ({cause}), which the driver would leave out of "
        "its steps",
        f"no batch size gives every pass {need} or more with {workers} workers: use fewer "
        "workers")


def check_segments(strategy, segments: int = 3, max_ops: int = 10_000) -> None:
    """Refuse a program whose segments would not start with its one read."""
    job = WorkerJob(0, 1, 64, 1, 0, Budget(steps=10_000))
    program = strategy.program(job)
    seen_gradient, after_push, reply, ops = False, False, None, 0
    try:
        while segments and ops < max_ops:
            op = program.send(reply)
            ops += 1
            reply = None
            if after_push and isinstance(op, Clock):
                reply = 0  # the clock floor, from the driver between two segments
                continue
            if after_push and not isinstance(op, Fetch):
                problem = "goes on after a push without reading the parameters"
                break
            after_push = False
            if isinstance(op, Fetch):
                if seen_gradient:
                    problem = "reads the parameters again before its next exchange"
                    break
                reply = 0
            elif isinstance(op, Gradient):
                seen_gradient, reply = True, (0.0, np.zeros(1))
            elif isinstance(op, EXCHANGES):
                seen_gradient, after_push, reply = False, isinstance(op, Push), 0
                segments -= 1
        else:
            return
    except StopIteration:
        return
    finally:
        program.close()
    raise ConfigError(f"{strategy.name}'s worker {problem}, but on the spark engine a task "
                      "reads them once, at its start, and runs to the next exchange: fetch "
                      "once per exchange (async: set --n-fetch equal to --n-push)")

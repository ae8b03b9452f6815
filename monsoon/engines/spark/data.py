"""The spark engine's transport for data held in Spark: ``SparkSource``.

The problems (``SparkData``, ``SparkTorchData``) live in
``problems/spark_data.py`` and ``problems/spark_torch_data.py``; they say
what one partition's rows become and what the model computes. This module
does the Spark work for them, installed as ``SparkHeld.transport`` on
import (so ``problems/`` never imports ``engines/``):

- reading the source (a path, a DataFrame, through Arrow where pyarrow is
  here (``arrow.py``), or an RDD) as an RDD of rows, never collected;
- one job converting each partition on its executor (the problem's
  ``_convert``) and returning its stats, the driver checking them (the
  problem's ``_builder``), then the ``Block``s rebuilt with their global
  ids (the partition's offset + the row's place in it) and persisted;
- the evaluation jobs: ``per_block(block, w)`` on every block with ``w``
  broadcast, at most ``EVAL_BYTES`` of points a job.

Partitions of equal size, where a strategy's workers each train on their
own (``draws == SHARD``: async, SSP, EASGD). Workers that step at the same
rate weight each partition's mean loss alike, and a worker with a smaller
partition ends first, leaving the others to finish alone on theirs: with
unequal partitions the run settles away from the data's minimum. Spark
splits a file by bytes, with each split's opening cost counted
(``spark.sql.files.openCostInBytes``), so ``local[2]`` cuts a 23 MB libsvm
file at about 70%/30%. Data named on the command line is then repartitioned
(round-robin: equal counts); a DataFrame or RDD given in Python keeps its
partitions, with a warning.

Every job waits at most the run's ``--timeout`` (its default before a run).
"""
from __future__ import annotations

import sys

import numpy as np

from ...errors import ConfigError
# SparkData and _rows_to_arrays: re-exported for their old import paths
from ...problems.spark_data import SparkData, SparkHeld, _rows_to_arrays  # noqa: F401
from .blocks import Block

EVAL_BYTES = 32 << 20  # the loss curve's points broadcast at once
UNEVEN = 1.02  # partitions are unequal when the largest has this many times the smallest's rows


def uneven(counts) -> bool:
    """Whether partitions of ``counts`` rows are too unequal for workers
    that each train on their own (the module doc)."""
    return len(counts) > 1 and max(counts) > UNEVEN * min(counts) + 1


class SparkSource:
    """The Spark work of a ``SparkHeld`` problem (see the module doc); it
    keeps no state of its own: what it makes is set on the problem."""

    def rdd(self, problem, partitions: int | None = None):
        """The source as an RDD of rows, or, a DataFrame where pyarrow is
        here, of chunks through Arrow (``arrow.py``); never collected.
        ``partitions``: that many (a DataFrame is repartitioned in the JVM)."""
        source = problem.source
        problem._via_arrow = False
        if isinstance(source, str):  # read as ``spark:PATH`` reads it: the same
            from ...problems import LIBSVM_SUFFIXES  # suffixes, one line if it fails

            source = self.read(source, LIBSVM_SUFFIXES, problem.fmt)
        if hasattr(source, "rdd") and hasattr(source, "columns"):  # a DataFrame
            features, label = problem.features, problem.label
            cols = [features] if isinstance(features, str) else list(features)
            missing = [c for c in cols + [label] if c not in source.columns]
            if missing:
                raise ConfigError(f"the DataFrame has no column(s) {', '.join(missing)}; its "
                                  f"columns: {', '.join(source.columns)} (set features= "
                                  "and label=)")
            if partitions is not None:
                source = source.repartition(partitions)
            selected = problem._select(source, cols)
            from . import arrow

            if arrow.usable(selected):
                problem._via_arrow = True
                return arrow.chunks(selected, len(cols), problem._dense_names())
            return selected.rdd
        if hasattr(source, "mapPartitionsWithIndex"):
            return source if partitions is None else source.repartition(partitions)
        raise ConfigError(f"{type(problem).__name__} needs a Spark DataFrame, an RDD or a path "
                          f"Spark reads, not {type(source).__name__}")

    def load(self, problem, partitions: int | None = None) -> None:
        """Convert the source once per partition and persist its blocks."""
        rdd = self.rdd(problem, partitions)
        problem._sc = rdd.context
        from ..options import TIMEOUT
        from .preflight import check_executors

        check_executors(problem._sc, TIMEOUT.default, torch=problem.uses_torch,
                        arrow=problem._via_arrow)
        convert = problem._convert()
        raw = rdd.mapPartitionsWithIndex(lambda k, rows: [(k, *convert(rows))]).persist()
        try:
            with _quiet_task_errors(problem._sc):  # a failed task: the job's one line says it
                stats = sorted(self.job(problem, raw, lambda it: [(k, s) for k, _, s in it],
                                        "converting the Spark data on the executors"),
                               key=lambda s: s[0])
            build = problem._builder([s for _, s in stats])
        except BaseException:
            raw.unpersist()
            raise
        counts = [s["rows"] for _, s in stats]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        problem.n_examples = int(offsets[-1])
        problem.partitions = len(counts)
        problem.counts = counts

        def blocks(k, parts):
            for _, payload, s in parts:
                yield Block(k, build(payload), offsets[k] + np.arange(s["rows"], dtype=np.int64))

        problem._blocks = raw.mapPartitionsWithIndex(blocks).persist()
        try:
            with _quiet_task_errors(problem._sc):
                self.job(problem, problem._blocks, lambda it: [sum(1 for _ in it)],
                         "caching the converted partitions")
        finally:
            raw.unpersist()
            problem._built()

    def blocks(self, problem, workers: int, equal: bool = False):
        """The problem's persisted blocks, repartitioned to ``workers`` where
        the problem allows it (see ``SparkHeld.blocks``); ``equal``: the
        workers each train on their own partition, which should then hold
        as many rows as the others (the module doc)."""
        unequal = equal and uneven(problem.counts)
        if problem.repartition and (workers != problem.partitions or unequal):
            self.unpersist(problem)
            self.load(problem, partitions=workers)
        if workers != problem.partitions:
            raise ConfigError(f"the Spark data has {problem.partitions} partitions and each "
                              f"worker trains on one: use --workers {problem.partitions}, or "
                              f"repartition({workers}) the data first")
        if equal and uneven(problem.counts):
            print(f"monsoon: warning: the Spark data's partitions hold "
                  f"{', '.join(f'{c:,}' for c in problem.counts)} rows; each worker trains on "
                  f"its own, and unequal ones weight the data unequally: repartition("
                  f"{workers}) the data first, or give repartition=True, for equal ones",
                  file=sys.stderr, flush=True)
        return problem._blocks

    def unpersist(self, problem) -> None:
        if problem._blocks is not None:
            problem._blocks.unpersist()

    def job(self, problem, rdd, func, what: str):
        """``sc.runJob(rdd, func)``, waited for at most the run's ``--timeout``
        (its default before a run; ``jobs.Jobs``: a failure after Spark's
        retries, or a wait that runs out, is one line naming ``what``)."""
        from ..options import TIMEOUT
        from .jobs import Jobs

        jobs = Jobs(problem._sc, problem.timeout or TIMEOUT.default, "data")
        try:
            return jobs.run(rdd, func, what=what)
        finally:
            jobs.close()

    def sums(self, problem, w, per_block):
        """``per_block(block, w)`` for every block, ``w`` broadcast: the list
        of what each returned: from the run's streaming tasks while they hold
        the slots (``SparkHeld.streams``), else a job."""
        if problem.streams is not None:
            out = problem.streams(np.asarray(w, dtype=problem.dtype), per_block)
            if out is not None:
                return out
        bc = problem._sc.broadcast(np.asarray(w, dtype=problem.dtype))
        try:
            return self.job(problem, problem._blocks,
                            lambda it: [per_block(b, bc.value) for b in it],
                            "evaluating the loss on the executors")
        finally:
            bc.unpersist()

    def read(self, path: str, suffixes: tuple, fmt: str | None = None):
        """The DataFrame of a Parquet folder, or a libsvm file (``fmt``, else
        by one of ``suffixes``), read by the running session (else one
        started on local[CPUS], left running: the run uses it, and it ends
        with the process)."""
        spark = _session()
        fmt = fmt or ("libsvm" if path.rstrip("/").lower().endswith(suffixes) else "parquet")
        try:
            with _quiet_task_errors(spark):  # the one line below says what failed
                return (spark.read.format("libsvm").load(path) if fmt == "libsvm"
                        else spark.read.parquet(path))
        except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException and friends
            from .jobs import short_error

            if "PATH_NOT_FOUND" in str(exc):  # a missing path is not a malformed file
                fix = (f"no file or folder is there: give the path of a libsvm file (ending in "
                       f"{', '.join(suffixes)}) or a Parquet folder")
            elif fmt == "libsvm":
                fix = ("fix the file: Spark's libsvm reader takes lines of 'label index:value "
                       "...' with 1-based indices, and at least one such line")
            else:
                fix = f"give a Parquet folder or a libsvm file ending in {', '.join(suffixes)}"
            raise ConfigError(f"Spark cannot read {path} as {fmt} ({short_error(exc)}); "
                              f"{fix}") from None

    def table(self, name: str):
        """The DataFrame of the Spark table ``name`` (the session as ``read``'s)."""
        spark = _session()
        try:
            return spark.table(name)
        except Exception as exc:  # noqa: BLE001
            from .jobs import short_error

            raise ConfigError(f"no Spark table {name!r} ({short_error(exc)}); tables here: "
                              f"{', '.join(t.name for t in spark.catalog.listTables()) or 'none'}"
                              ) from None

    @staticmethod
    def points_per_job(point_bytes: int) -> int:
        """How many points of ``point_bytes`` one evaluation job broadcasts."""
        return max(1, EVAL_BYTES // max(1, point_bytes))


# The loggers that print a failed task's Java stack and Python traceback (in
# local mode, in this process's terminal; the block manager's, for a task
# that was filling a persisted partition) before the driver's exception
# reaches ``read`` or ``load``; and the one that warns, with a Java stack,
# that a path to read does not exist (Spark 4's name, then Spark 3's).
TASK_ERROR_LOGGERS = ("org.apache.spark.executor.Executor",
                      "org.apache.spark.scheduler.TaskSetManager",
                      "org.apache.spark.storage.BlockManager",
                      "org.apache.spark.sql.execution.streaming.sinks.FileStreamSink",
                      "org.apache.spark.sql.execution.streaming.FileStreamSink")


class _quiet_task_errors:
    """Silence ``TASK_ERROR_LOGGERS`` (log4j 2) while reading or converting
    (``spark``: the session, or its SparkContext), and leave the
    log configuration as it was after: a logger configured on its own gets
    its level back, and the configuration made for one that was not is
    removed again (it follows its parent, as before). Best effort: where
    the JVM's logging is not log4j 2, nothing changes."""

    def __init__(self, spark):
        self.spark, self.saved = spark, []

    def __enter__(self):
        try:
            jvm = getattr(self.spark, "sparkContext", self.spark)._jvm
            log4j = jvm.org.apache.logging.log4j
            self.context = log4j.LogManager.getContext(False)
            config = self.context.getConfiguration()
            for name in TASK_ERROR_LOGGERS:
                own = config.getLoggerConfig(name).getName() == name
                self.saved.append((name, own, log4j.LogManager.getLogger(name).getLevel()))
                log4j.core.config.Configurator.setLevel(name, log4j.Level.OFF)
            self.configurator = log4j.core.config.Configurator
        except Exception:  # noqa: BLE001 - another logging backend: its output stays
            pass
        return self

    def __exit__(self, *exc):
        try:
            config = self.context.getConfiguration() if self.saved else None
            for name, own, level in self.saved:
                if own:
                    self.configurator.setLevel(name, level)
                else:
                    config.removeLogger(name)
            if self.saved:
                self.context.updateLoggers()
        except Exception:  # noqa: BLE001 - logging only
            pass
        return False


def _session():
    """The running SparkSession, else one started on local[CPUS]."""
    import os

    from .session import active_context, session_for

    if active_context() is None:
        session_for(None, os.cpu_count() or 1)
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate()


SparkHeld.transport = SparkSource()

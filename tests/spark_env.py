"""A real Spark session for the test modules, or a skip where Spark truly
cannot run here (no pyspark, no Java runtime); and a context in which
nothing can be collected to the driver."""
import atexit
import contextlib
import os
import pickle
import shutil

import pytest


_kept: dict = {}  # the session kept for the modules after: {"master": ..., "session": ...}


def stop_kept() -> None:
    if _kept:
        _kept.pop("session").stop()
        _kept.clear()


@contextlib.contextmanager
def spark_session(master: str, share: bool = True):
    """A Spark session on ``master``. Shared (the default): the session the
    module before left on the same master, if it is still running, and kept
    for the modules after, as ``local_ray`` is: a session's start and its
    first job (two Python worker daemons importing torch and monsoon) cost
    seconds. ``share=False``: a session of the module's own (other
    executors' settings), stopped at the end; only one runs at a time."""
    pytest.importorskip("pyspark")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("no Java runtime (the spark engine needs Java 17+)")
    from monsoon.engines.spark import start_session

    if _kept and (not share or _kept["master"] != master
                  or _kept["session"].sparkContext._jsc is None):  # stopped by a test
        stop_kept()
    if share and _kept:
        yield _kept["session"]
        return
    spark = start_session(master, "monsoon-tests")
    spark.sparkContext.setLogLevel("ERROR")
    if share:
        _kept.update(master=master, session=spark)
        atexit.register(stop_kept)
        yield spark
        return
    try:
        yield spark
    finally:
        spark.stop()


@pytest.fixture(scope="module")
def spark():
    """A local[2] session for the module's tests (import this fixture)."""
    with spark_session("local[2]") as session:
        yield session


def _raise(*args, **kwargs):
    raise AssertionError("the data was brought to the driver")


@contextlib.contextmanager
def nothing_collected():
    """Within: DataFrame and RDD collection raise, and each Spark job's
    result size is recorded (the list yielded)."""
    from pyspark import RDD, SparkContext
    from pyspark.sql import DataFrame

    sizes = []
    run_job = SparkContext.runJob

    def measured(self, rdd, func, partitions=None, allowLocal=False):
        out = run_job(self, rdd, func, partitions, allowLocal)
        sizes.append(len(pickle.dumps(out)))
        return out

    with pytest.MonkeyPatch.context() as m:
        for cls, names in ((DataFrame, ("collect", "toPandas", "toLocalIterator", "take",
                                        "head", "tail", "toArrow")),
                           (RDD, ("collect", "toLocalIterator", "take", "first"))):
            for name in names:
                m.setattr(cls, name, _raise)
        m.setattr(SparkContext, "runJob", measured)
        yield sizes


def first_attempt(marks: str) -> bool:
    """In a Spark task: is this partition 0's first attempt at its stage?
    A file in ``marks`` records each stage's failure, so the retry passes.
    A barrier stage (sync's) counts as one, whatever its stage id: the
    engine starts the job again whole, as a new stage."""
    from pyspark import BarrierTaskContext, TaskContext

    ctx = TaskContext.get()
    if ctx is None or ctx.partitionId() != 0:
        return False
    stage = "barrier" if isinstance(ctx, BarrierTaskContext) else ctx.stageId()
    mark = os.path.join(marks, f"stage-{stage}")
    if os.path.exists(mark):
        return False
    open(mark, "w").close()
    return True


def count_jobs(spark, monkeypatch) -> dict:
    """A count of the Spark jobs started from now on (``["jobs"]``; each
    still runs on Spark). The session's one-off executor check is done
    first, not counted."""
    from pyspark import SparkContext

    from monsoon.engines.spark.preflight import check_executors

    check_executors(spark.sparkContext, 60, torch=True)
    count = {"jobs": 0}
    real = SparkContext.runJob

    def run_job(self, *args, **kwargs):
        count["jobs"] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SparkContext, "runJob", run_job)
    return count

"""Any torch model on a Spark DataFrame (issue 35, part 2), on a real
``local[2,4]`` Spark (up to 4 attempts per task): sync equals serial on the
same rows, async converges, nothing is collected to the driver, every kind
of feature column gives the same run, every strategy the engine runs trains,
a retried task's update lands once, and bad columns are refused in one line."""
import contextlib
import pickle

import numpy as np
import pytest
import torch
from torch import nn

import monsoon
from monsoon.errors import ConfigError
from monsoon.problems.torch_problem import TorchProblem
from spark_env import spark_session

pytestmark = [pytest.mark.spark, pytest.mark.slow]

N, D, CLASSES = 800, 5, 3


@pytest.fixture(scope="module")
def spark():
    with spark_session("local[2,4]") as session:
        yield session


@pytest.fixture(scope="module")
def frame(spark):
    """N rows generated on the executors, 2 partitions: an array column x,
    a class label c (int), a float target t."""
    from pyspark.sql import functions as F

    df = spark.range(N, numPartitions=2).select(
        F.array(*[F.randn(seed=j) for j in range(D)]).alias("x"))
    score = F.col("x")[0] + 0.5 * F.col("x")[1] - 0.7 * F.col("x")[2]
    df = df.withColumn("c", F.when(score > 0.5, 2).when(score > -0.5, 1).otherwise(0))
    return df.withColumn("t", score + 0.1 * F.col("x")[3]).cache()


def net(out: int = CLASSES) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, out))


def rows_in_partition_order(df, label):
    """The reference data, brought to the driver only for the comparison."""
    rows = df.select("x", label).collect()
    return np.array([r.x for r in rows]), np.array([r[label] for r in rows])


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


KW = dict(lr=0.3, steps=6, batch_size=128, seed=0, dtype="float64", evals=0)


@pytest.mark.parametrize("label, loss", [("c", nn.CrossEntropyLoss()), ("t", nn.MSELoss())])
def test_sync_equals_serial_and_nothing_reaches_the_driver(frame, label, loss):
    """Class numbers (int64) and a float target (n, 1): sync on the
    DataFrame, with collection patched to raise and no job returning more
    than a few gradients, equals serial on its rows in partition order
    (float64, 1e-9)."""
    out = CLASSES if label == "c" else 1
    with nothing_collected() as sizes:
        data = TorchProblem.from_spark(frame, net(out), loss, features="x", label=label,
                                       dtype="float64")
        run = monsoon.train(data, strategy="sync", workers=2, engine="spark", **KW)
    data.unpersist()
    assert data.n_examples == N and data.partitions == 2 and data.n_features == D
    assert max(sizes) < 10 * data.n_params * 8 + 4096 < N * (D + 1) * 8
    assert run.summary["updates"] == 6 and run.summary["engine"] == "spark"

    X, y = rows_in_partition_order(frame, label)
    y = torch.as_tensor(y) if label == "c" else torch.as_tensor(y).reshape(-1, 1)
    ref = monsoon.train(TorchProblem(net(out), loss, X, y, dtype="float64"),
                        strategy="serial", **KW)
    np.testing.assert_allclose(run.params, ref.params, rtol=1e-9, atol=1e-12)
    assert run.summary["final_loss"] == pytest.approx(ref.summary["final_loss"], rel=1e-9)
    assert run.summary["final_loss"] < 0.8 * ref.history[0]["loss"]  # it trained
    if label == "c":
        assert run.summary["accuracy"] == pytest.approx(ref.summary["accuracy"], rel=1e-12)


def test_async_converges_without_collecting(frame):
    """Async (Downpour, the server on the driver) on the DataFrame reaches
    within 10% of serial's loss on the same rows, every push applied."""
    kw = dict(lr=0.3, epochs=4, batch_size=32, seed=0, dtype="float64", evals=0)
    with nothing_collected():
        data = TorchProblem.from_spark(frame, net(), nn.CrossEntropyLoss(), features="x",
                                       label="c", dtype="float64")
        run = monsoon.train(data, strategy="async", workers=2, engine="spark", n_fetch=5,
                            n_push=5, **kw)
    data.unpersist()
    X, y = rows_in_partition_order(frame, "c")
    ref = monsoon.train(TorchProblem(net(), nn.CrossEntropyLoss(), X, torch.as_tensor(y),
                                     dtype="float64"), strategy="serial", **kw)
    s = run.summary
    assert s["final_loss"] <= 1.1 * ref.summary["final_loss"], (s["final_loss"],
                                                                ref.summary["final_loss"])
    assert s["final_loss"] < 0.5 * ref.history[0]["loss"]
    assert s["examples"] == ref.summary["examples"] and s["failed_workers"] == []
    assert s["updates"] == sum(s["staleness_counts"].values()) > 0
    assert s["staleness"]["max"] > 0

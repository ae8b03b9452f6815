"""Any torch model on a Spark DataFrame (issue 35, part 2), on a real
``local[2,4]`` Spark (up to 4 attempts per task): sync equals serial on the
same rows, async converges, nothing is collected to the driver, every kind
of feature column gives the same run, every strategy the engine runs trains,
a retried task's update lands once, and bad columns are refused in one line."""
import functools

import numpy as np
import pytest
import torch
from torch import nn

import monsoon
from monsoon.errors import ConfigError
from monsoon.problems.torch_problem import TorchProblem
from monsoon.record import checkpoints
from spark_env import first_attempt, nothing_collected, spark_session

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


@pytest.fixture(scope="module")
def classes(frame):
    """The frame's features and class labels under net() and cross-entropy,
    converted once for the tests that train on them (a conversion costs
    Spark jobs, as a run does): the problem, and the result sizes of the
    conversion's jobs, with nothing collected to the driver."""
    with nothing_collected() as sizes:
        data = TorchProblem.from_spark(frame, net(), nn.CrossEntropyLoss(), features="x",
                                       label="c", dtype="float64")
    yield data, list(sizes)
    data.unpersist()


def net(out: int = CLASSES) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, out))


def rows_in_partition_order(df, label):
    """The reference data, brought to the driver only for the comparison."""
    rows = df.select("x", label).collect()
    return np.array([r.x for r in rows]), np.array([r[label] for r in rows])


KW = dict(lr=0.3, steps=6, batch_size=128, seed=0, dtype="float64", evals=0)


@pytest.mark.parametrize("label, loss", [("c", nn.CrossEntropyLoss()), ("t", nn.MSELoss())])
def test_sync_equals_serial_and_nothing_reaches_the_driver(frame, label, loss, request):
    """Class numbers (int64) and a float target (n, 1): sync on the
    DataFrame, with collection patched to raise and no job returning more
    than a few gradients, equals serial on its rows in partition order
    (float64, 1e-9)."""
    out = CLASSES if label == "c" else 1
    with nothing_collected() as sizes:
        if label == "c":  # the module's conversion, checked in the same way
            data, converted = request.getfixturevalue("classes")
            sizes.extend(converted)
        else:
            data = TorchProblem.from_spark(frame, net(out), loss, features="x", label=label,
                                           dtype="float64")
        run = monsoon.train(data, strategy="sync", workers=2, engine="spark", **KW)
    if label != "c":
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


def test_async_converges_without_collecting(frame, classes):
    """Async (Downpour, the server on the driver) on the DataFrame reaches
    within 10% of serial's loss on the same rows, every push applied."""
    kw = dict(lr=0.3, epochs=4, batch_size=32, seed=0, dtype="float64", evals=0)
    with nothing_collected():
        run = monsoon.train(classes[0], strategy="async", workers=2, engine="spark",
                            n_fetch=5, n_push=5, **kw)
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


def test_array_vector_and_numeric_columns_give_the_same_run(frame):
    """The same rows as an array column, a Vector column and D numeric
    columns: the same tensors on the executors, so the same parameters
    (to the last few bits)."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    cols = [f"x{j}" for j in range(D)]
    df = frame.select("x", array_to_vector("x").alias("v"), "c",
                      *[F.col("x")[j].alias(c) for j, c in enumerate(cols)])
    runs = {}
    for name, features in (("array", "x"), ("vector", "v"), ("numeric", cols)):
        data = TorchProblem.from_spark(df, net(), nn.CrossEntropyLoss(), features=features,
                                       label="c", dtype="float64")
        assert data.n_features == D, name
        runs[name] = monsoon.train(data, strategy="sync", workers=2, engine="spark",
                                   **{**KW, "steps": 2}).params
        data.unpersist()
    for name in ("vector", "numeric"):  # the same numbers (BLAS may round in another order)
        np.testing.assert_allclose(runs[name], runs["array"], rtol=1e-12, atol=1e-15)



@pytest.mark.parametrize("loss", [nn.functional.cross_entropy,
                                  functools.partial(nn.functional.cross_entropy, ignore_index=-1)],
                         ids=["function", "partial"])
def test_a_functional_cross_entropy_gets_class_numbers_and_the_modules_accuracy(
        frame, classes, loss):
    """The functional form and a partial of it take the label as int64
    class numbers and report the module's loss and accuracy (the function
    reported no accuracy; a partial's labels became floats (n, 1), which it
    cannot take)."""
    data = TorchProblem.from_spark(frame, net(), loss, features="x", label="c",
                                   dtype="float64")
    try:
        module = classes[0]
        w = module.initial_params(0)
        figures = data.evaluate(w)
        assert "accuracy" in figures and figures == module.evaluate(w)
    finally:
        data.unpersist()

def test_one_numeric_column_is_one_feature(frame):
    """features="x0" (a numeric column, not a list) is a model of one input,
    the same run as features=["x0"]."""
    from pyspark.sql import functions as F

    df = frame.select(F.col("x")[0].alias("x0"), "c")
    runs = {}
    for features in ("x0", ["x0"]):
        torch.manual_seed(0)
        data = TorchProblem.from_spark(df, nn.Linear(1, CLASSES), nn.CrossEntropyLoss(),
                                       features=features, label="c", dtype="float64")
        assert data.n_features == 1
        runs[str(features)] = monsoon.train(data, strategy="sync", workers=2, engine="spark",
                                            **{**KW, "steps": 2}).params
        data.unpersist()
    np.testing.assert_array_equal(runs["x0"], runs["['x0']"])


class FailsFirstAttempt(nn.CrossEntropyLoss):
    """A loss that fails in partition 0's first attempt of every stage
    (``spark_env.first_attempt``; the barrier stage, sync's, once in the
    folder ``marks``)."""

    def __init__(self, marks: str):
        super().__init__()
        self.marks = marks

    def forward(self, out, target):
        if first_attempt(self.marks):
            raise RuntimeError("killed on its first attempt")
        return super().forward(out, target)


@pytest.fixture(scope="module")
def failing(frame, tmp_path_factory):
    """The ``classes`` problem with a loss that fails each stage's first
    attempt on partition 0."""
    data = TorchProblem.from_spark(frame, net(), FailsFirstAttempt(str(tmp_path_factory.mktemp(
        "marks"))), features="x", label="c", dtype="float64")
    yield data
    data.unpersist()


@pytest.mark.parametrize("strategy, options, updates", [
    ("sync", {}, 6),
    ("local-sgd", {"local_steps": 3}, 2),
    ("async", {"n_fetch": 3, "n_push": 3}, 2),
    ("ssp", {"n_fetch": 3, "n_push": 3}, 2),
    ("easgd", {"easgd_tau": 3}, 2),
])
def test_every_strategy_trains_and_a_retried_task_counts_once(failing, classes, strategy,
                                                              options, updates):
    """Partition 0's first attempt of every task fails (Spark retries it):
    each strategy still applies exactly the uninterrupted run's updates and
    examples (``updates``; ``steps * batch_size``), its loss goes down, and
    where the result does not hang on which worker's push arrives first
    (sync, local-sgd) the parameters are the uninterrupted run's. Only
    those two run the uninterrupted run too: for the others it would check
    nothing the fixed counts do not. Both problems are converted once for
    the module (each stage, and sync's barrier stage, fails once)."""
    def run(data):
        return monsoon.train(data, strategy=strategy, workers=2, engine="spark",
                             **{**KW, "evals": 2}, **options)

    retried = run(failing)
    runs = [retried]
    if strategy in ("sync", "local-sgd"):
        clean = run(classes[0])
        np.testing.assert_array_equal(retried.params, clean.params)
        runs.append(clean)
    for r in runs:
        s = r.summary
        assert s["updates"] == updates and s["failed_workers"] == []
        assert s["examples"] == KW["steps"] * KW["batch_size"]
        assert sum(s["staleness_counts"].values()) == updates  # one count an update
        assert s["final_loss"] < r.history[0]["loss"]


@pytest.fixture(scope="module")
def odd(spark):
    """Columns that cannot be features or labels, and rows that break them."""
    from pyspark.sql import functions as F

    rows = [([1.0, 2.0], "a", 0, 0.5, None), ([3.0, 4.0, 5.0], "b", 1, 1.0, 1.0)]
    return spark.createDataFrame(rows, "x array<double>, s string, c int, f double, "
                                       "n double").coalesce(1).withColumn("two", F.array(
                                           F.col("f"), F.col("f")))


@pytest.mark.parametrize("features, label, says", [
    ("nope", "c", r"the DataFrame has no column\(s\) nope; its columns: x, s, c, f, n, two"),
    ("s", "c", r"the features column 's' holds string; give a column of arrays of numbers, "
               r"a Vector column, or numeric columns"),
    (["f", "s"], "c", r"feature column\(s\) 's' \(string\) are not numeric"),
    ("two", "s", r"the label column 's' holds string; it must be numeric"),
    ("x", "c", r"partition 0: the features column 'x' holds rows of 2 and 3 numbers: every "
               r"row needs the same number of features"),
    ("two", "n", r"partition 0: column 'n' holds a null: drop or fill those rows first"),
    (["f", "n"], "c", r"partition 0: column 'n' holds a null: drop or fill those rows first"),
    ("two", "f", r"partition 0: the label column 'f' holds 0.5; a class-index loss needs "
                 r"class numbers 0, 1, 2"),
])
def test_bad_columns_are_refused_in_one_line(odd, features, label, says):
    import re

    with pytest.raises(ConfigError) as info:
        TorchProblem.from_spark(odd, nn.Linear(2, 2), nn.CrossEntropyLoss(),
                                features=features, label=label)
    message = str(info.value)
    assert "\n" not in message and re.search(says, message), message


def test_a_null_in_one_of_several_feature_columns_is_named_on_the_row_path():
    """Without Arrow a partition's rows come as Rows: a null in one of
    several numeric feature columns was "the features 'f, n' hold a null
    or a non-number", the columns named as one; it names the column."""
    from monsoon.problems.spark_torch_data import partition_arrays

    said = partition_arrays([(0.5, 1.0, 0), (1.0, None, 1)], True, (["f", "n"], "c"), True,
                            np.float32)
    assert said == "column 'n' holds a null: drop or fill those rows first (df.na.drop())"
    said = partition_arrays([(0.5, None, 0), (1.0, 1.0, None)], True, (["f", "n"], "c"),
                            True, np.float32)  # a null label is named first, as before
    assert said.startswith("column 'c' holds a null"), said


def test_rows_of_different_lengths_in_different_partitions_are_refused(spark):
    rows = spark.sparkContext.parallelize([([1.0, 2.0], 0), ([1.0, 2.0, 3.0], 1)], 2)
    df = spark.createDataFrame(rows, "x array<double>, c int")
    with pytest.raises(ConfigError, match=r"the features hold rows of 2 numbers in partition "
                                          r"\d and 3 in partition \d: every row needs"):
        TorchProblem.from_spark(df, nn.Linear(2, 2), nn.CrossEntropyLoss(), features="x",
                                label="c")


class Squeezed(nn.Module):
    """nn.Linear(D, 1) whose output is squeezed to (n,): a regression model
    written for targets of shape (n,)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(D, 1)

    def forward(self, x):
        return self.linear(x).squeeze(-1)


def test_an_output_of_another_shape_than_the_label_is_refused_before_any_run(
        frame, monkeypatch, tmp_path, capsys):
    """MSELoss on a module's (n,) output against Spark's float label, (n, 1),
    trained a wrong model (torch broadcasts to (n, n), a UserWarning on the
    executors at most): the shape check TorchProblem makes when it is built
    was skipped on Spark. Refused in one line naming both shapes and the fix,
    from Python and from the CLI (a plug-in's Spark problem: exit 2); so is
    a module that does not take the rows."""
    import re

    from monsoon.cli import main
    from monsoon.problems import PROBLEMS, ProblemSpec

    says = re.escape(
        "MSELoss compares the module's output and the targets element by element, but on "
        "the first rows of the features the output has shape (2,) and the targets (2, 1), "
        "which torch broadcasts to (2, 2): a float label column reaches the loss as targets "
        "of shape (n, 1), so make the module's output (n, 1), one column")

    def build(dtype="float64"):
        return TorchProblem.from_spark(frame, Squeezed(), nn.MSELoss(), features="x",
                                       label="t", dtype=dtype)

    with pytest.raises(ConfigError) as info:
        build()
    assert "\n" not in str(info.value) and re.match(r"partition \d: " + says, str(info.value))
    with pytest.raises(ConfigError, match=r"^partition \d: the module does not take the "
                       r"features: a forward pass on 2 rows of shape \(2, 5\) fails"):
        TorchProblem.from_spark(frame, nn.Linear(D + 1, 1), nn.MSELoss(), features="x",
                                label="t")  # a module that does not fit: refused there too
    PROBLEMS._load()
    monkeypatch.setitem(PROBLEMS._plugins, "squeezed", ProblemSpec(
        "squeezed", build, "a squeezed output on Spark", defaults={"lr": 0.1, "epochs": 1},
        engine="spark"))
    capsys.readouterr()
    code = main(["train", "--problem", "squeezed", "--engine", "spark", "--strategy", "sync",
                 "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and re.match(r"monsoon: error: partition \d: " + says, err), err
    assert "\n" not in err and not (tmp_path / "run" / "summary.json").exists()


def test_an_untracked_batchnorm_evaluates_a_partition_of_one_row(spark):
    """Partitions of 4 rows and 1 under BatchNorm1d(track_running_stats=False):
    each partition is evaluated on its own executor, by its own statistics,
    and the lone row's failed the evaluation job ("Expected more than 1 value
    per channel"). Its loss is now the model's on that row alone (the layer
    gives its bias), and the figures are the partitions' weighed by rows."""
    torch.manual_seed(1)
    X, c = torch.randn(5, D, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 2])
    rows = [([float(v) for v in x], int(k)) for x, k in zip(X, c)]
    df = spark.createDataFrame(spark.sparkContext.parallelize([rows[:4], rows[4:]], 2)
                               .flatMap(lambda part: part), "x array<double>, c int")

    def bn_net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8, track_running_stats=False),
                             nn.Linear(8, CLASSES))

    data = TorchProblem.from_spark(df, bn_net(), nn.CrossEntropyLoss(), features="x",
                                   label="c", dtype="float64")
    try:
        assert data.counts == [4, 1]
        w = data.initial_params(0)
        got = data.evaluate(w)
    finally:
        data.unpersist()
    parts = [TorchProblem(bn_net(), nn.CrossEntropyLoss(), X[a:b], c[a:b], dtype="float64")
             .evaluate(w) for a, b in ((0, 4), (4, 5))]
    net = bn_net().double()
    with torch.no_grad():
        lone = float(nn.CrossEntropyLoss()(net[2](net[1].bias.reshape(1, -1)), c[4:]))
    assert parts[1]["loss"] == pytest.approx(lone, rel=1e-12)
    assert got["loss"] == pytest.approx((4 * parts[0]["loss"] + lone) / 5, rel=1e-12)
    assert got["accuracy"] == pytest.approx(
        (4 * parts[0]["accuracy"] + parts[1]["accuracy"]) / 5, rel=1e-12)


def test_a_dataframe_model_refuses_other_engines(classes):
    with pytest.raises(ConfigError, match="lives in Spark: train it with engine='spark'"):
        monsoon.train(classes[0], strategy="sync", workers=2, engine="local", steps=2, evals=0)


def test_repartition_cuts_the_data_into_the_runs_workers(frame):
    """``repartition=True``: the 2-partition frame trains serial (one
    worker, one partition) on every row, with the curve's loss job too."""
    data = TorchProblem.from_spark(frame, net(), nn.CrossEntropyLoss(), features="x",
                                   label="c", dtype="float64", repartition=True)
    try:
        run = monsoon.train(data, strategy="serial", engine="spark", lr=0.3, epochs=1,
                            batch_size=200, evals=2)
    finally:
        data.unpersist()
    assert data.partitions == 1 and data.n_examples == N
    assert run.summary["examples"] == N and run.summary["updates"] == N // 200
    assert run.summary["final_loss"] < run.history[0]["loss"]


def _rows(n, seed=1):
    """``_partitioned``'s rows: X (n, D) and the classes c."""
    torch.manual_seed(seed)
    return torch.randn(n, D, dtype=torch.float64), torch.randint(0, CLASSES, (n,))


def _partitioned(spark, sizes, seed=1):
    """A DataFrame of len(sizes) partitions of those many rows (x: D
    numbers, c: a class)."""
    X, c = _rows(sum(sizes), seed)
    rows = [([float(v) for v in x], int(k)) for x, k in zip(X, c)]
    parts = [rows[sum(sizes[:i]):sum(sizes[:i + 1])] for i in range(len(sizes))]
    return spark.createDataFrame(spark.sparkContext.parallelize(parts, len(parts))
                                 .flatMap(lambda part: part), "x array<double>, c int")


@pytest.mark.parametrize("strategy, sizes, batch, says", [
    ("async", [33, 33], 32, r"async on Spark at batch size 32 gives the task on partition 0 "
                            r"\(33 rows\) one .*; use --batch-size 33,"),
    ("local-sgd", [33, 33], 32, r"; use --batch-size 30,"),
    ("sync", [4, 1], 2, r"partition 1 holds 1 row: sync on Spark .*; repartition the data"),
    ("serial", [31], 10, r"serial on Spark at batch size 10 on 31 rows gives a gradient 1 row "
                         r"in all \(an epoch's short last batch, .*; use --batch-size 11,"),
    ("sync", [31], 1, r"sync on Spark at batch size 1 on 31 rows gives a gradient 1 row .*"
                     r"; use --batch-size 4,"),
])
def test_a_batchnorm_that_needs_two_rows_is_refused_before_a_task_gets_one(
        spark, strategy, sizes, batch, says):
    """A BatchNorm1d over one value per channel cannot train on a pass of
    one row: a partition's short last batch (async's tasks), its part of a
    global batch (local SGD's), or a partition of one row (the driver's
    sync) failed in a task after Spark's retries; the driver's programs
    left out a batch of one row (serial's epoch's short last batch: 31 rows
    at 10; sync at batch size 1). It is refused before the run in one
    line, and the batch size it names trains."""
    import re

    def bn_net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8), nn.Linear(8, CLASSES))

    data = TorchProblem.from_spark(_partitioned(spark, sizes), bn_net(), nn.CrossEntropyLoss(),
                                   features="x", label="c", dtype="float64")
    try:
        assert data.counts == sizes
        with pytest.raises(ConfigError) as info:
            monsoon.train(data, engine="spark", strategy=strategy, workers=len(sizes),
                          batch_size=batch, epochs=1, progress=False)
        message = str(info.value)
        assert "\n" not in message and re.search(
            r"^the model cannot train on a forward pass of 1 example \(its BatchNorm layer '1' "
            r"normalises one value per channel; torch needs 2 or more in training\)", message)
        assert re.search(says, message), message
        advised = re.search(r"--batch-size (\d+)", message)
        if advised:
            run = monsoon.train(data, engine="spark", strategy=strategy, workers=len(sizes),
                                batch_size=int(advised.group(1)), epochs=1, progress=False)
            assert np.isfinite(run.summary["final_loss"])
    finally:
        data.unpersist()


def test_a_batchnorm_over_more_values_per_row_trains_on_a_pass_of_one(spark):
    """A BatchNorm1d over (channels, length) inputs has two values per
    channel in one row, so a pass of one row trains: the partitions' probes
    tell the driver so, and the run is not refused."""
    def bn_net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(D, 8), nn.Unflatten(1, (4, 2)), nn.BatchNorm1d(4),
                             nn.Flatten(), nn.Linear(8, CLASSES))

    data = TorchProblem.from_spark(_partitioned(spark, [33, 33]), bn_net(),
                                   nn.CrossEntropyLoss(), features="x", label="c",
                                   dtype="float64")
    try:
        run = monsoon.train(data, engine="spark", strategy="async", workers=2, batch_size=32,
                            epochs=1, progress=False)
        assert np.isfinite(run.summary["final_loss"]) and run.summary["examples"] >= 66
    finally:
        data.unpersist()


@pytest.mark.parametrize("sizes, batch", [([8, 8, 8, 7], 9), ([20, 21], 3)],
                         ids=["driver", "barrier"])
def test_sync_leaves_out_a_partitions_lone_row_of_a_batch(spark, sizes, batch):
    """Partitions of several rows, yet a batch's draw gives some of them
    one row of it: a BatchNorm1d over one value per channel cannot train
    on that share, which failed the run in a task after Spark's retries
    (4 partitions: sync on the driver, a job per step; 2 on local[2,4]:
    the barrier stage). The share is left out of its step: the run equals
    SGD on each step's mean over the partitions' shares of 2 rows or more,
    each normalised by its own statistics, and counts only those rows as
    its examples (a step that takes none applies no update)."""
    from monsoon.strategies import Budget
    from monsoon.strategies.batches import global_batches

    def bn_net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8), nn.Linear(8, CLASSES))

    lr, n, seed = 0.1, sum(sizes), 1
    data = TorchProblem.from_spark(_partitioned(spark, sizes), bn_net(), nn.CrossEntropyLoss(),
                                   features="x", label="c", dtype="float64")
    try:
        run = monsoon.train(data, engine="spark", strategy="sync", workers=len(sizes), lr=lr,
                            batch_size=batch, epochs=1, seed=seed, evals=0, progress=False)
    finally:
        data.unpersist()
    # the same steps on the driver: partition k holds global ids offsets[k]..offsets[k+1]-1
    X, c = _rows(n)
    offsets = np.cumsum([0] + sizes)
    parts = [TorchProblem(bn_net(), nn.CrossEntropyLoss(), X[a:b], c[a:b], dtype="float64")
             for a, b in zip(offsets, offsets[1:])]
    w = parts[0].initial_params(seed)
    examples = updates = 0
    cut = set()  # how the steps that left a row out fared: some took others, some none
    for ids in global_batches(n, batch, seed, Budget(epochs=1)):
        k_of = np.searchsorted(offsets, ids, side="right") - 1
        shares = [ids[k_of == k] - offsets[k] for k in range(len(sizes))]
        taken = [(k, rows) for k, rows in enumerate(shares) if len(rows) >= 2]
        count = sum(len(rows) for _, rows in taken)
        if count < len(ids):
            cut.add(bool(count))
        if not taken:
            continue
        grad = sum(len(rows) * parts[k].gradient(w, rows)[1] for k, rows in taken) / count
        w = w - lr * grad * len(ids) / batch  # an epoch's short last batch weighs less
        examples, updates = examples + count, updates + 1
    assert cut == {True, False}  # a batch whose rows fall one to a partition takes none
    assert run.summary["examples"] == examples and run.summary["updates"] == updates
    np.testing.assert_allclose(run.params, w, rtol=1e-9, atol=1e-12)
    assert np.isfinite(run.summary["final_loss"])


def _epochs_count_the_rows_left_out(rows, summary, sizes, batch: int, seed: int) -> None:
    """metrics.csv's epochs never go back, and each row's counts the rows
    left out by the step its parameters came from (the plan's, batch by
    batch: a step boundary where as many examples were taken), so the last
    is summary.json's ``epochs`` (to the csv's precision, 6 decimals)."""
    from monsoon.strategies import Budget
    from monsoon.strategies.batches import global_batches

    n, offsets = sum(sizes), np.cumsum([0] + sizes)
    left_at, taken, left = {0: {0}}, 0, 0  # examples taken -> rows left out by then
    for ids in global_batches(n, batch, seed, Budget(epochs=2)):
        shares = np.bincount(np.searchsorted(offsets, ids, side="right") - 1)
        took = int(shares[shares >= 2].sum())
        taken, left = taken + took, left + len(ids) - took
        left_at.setdefault(taken, set()).add(left)
    epochs = [r["epoch"] for r in rows]
    assert len(rows) > 2 and epochs == sorted(epochs), epochs
    assert any(round(r["epoch"] * n) > r["examples"] for r in rows[1:-1]), rows
    for r in rows:
        assert round(r["epoch"] * n) - r["examples"] in left_at[r["examples"]], r
    assert abs(epochs[-1] - summary["epochs"]) <= 5e-7, (epochs[-1], summary["epochs"])


@pytest.mark.parametrize("sizes, batch", [([8, 8, 8, 7], 9), ([20, 21], 3)],
                         ids=["driver", "barrier"])
def test_epochs_count_the_rows_left_out_apart_from_the_examples(spark, tmp_path, sizes, batch):
    """The rows sync leaves out (a partition's one-row share of a batch,
    which a BatchNorm cannot train on) were drawn all the same: summary's
    ``epochs`` reads the passes that ran (2 of 2, not the rows taken over
    n), ``examples`` the rows the updates used (the plan's, batch by batch)
    and ``examples_left_out`` the rest; both on the driver (4 partitions)
    and in the barrier stage (2 on local[2,4]). A run resumed from the
    first epoch's checkpoints counts as the whole run does; in the barrier
    stage those checkpoints are written while the stage holds every slot
    (no loss job can run then: a short timeout fails a wait for one), and
    rewritten after it with the curve's rows evaluated. Each metrics.csv
    row's ``epoch`` counts the rows left out by its parameters too, so the
    last agrees with the summary's ``epochs`` (it read examples / n), the
    resumed run's rows from the checkpoint's included."""
    from monsoon.record.run_folder import read_metrics
    from monsoon.strategies import Budget
    from monsoon.strategies.batches import global_batches

    torch.manual_seed(0)  # no running statistics: Spark's checkpoints hold no buffers
    bn_net = nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8, track_running_stats=False),
                           nn.Linear(8, CLASSES))
    n, epochs, seed = sum(sizes), 2, 1
    data = TorchProblem.from_spark(_partitioned(spark, sizes), bn_net, nn.CrossEntropyLoss(),
                                   features="x", label="c", dtype="float64")
    kw = dict(engine="spark", strategy="sync", workers=len(sizes), lr=0.1, batch_size=batch,
              seed=seed, evals=0, progress=False, timeout=15)
    try:
        s = monsoon.train(data, epochs=epochs, **kw).summary
        first = monsoon.train(data, epochs=1, checkpoint_every=1, out=tmp_path / "a",
                              **{**kw, "evals": 20})  # a curve for the checkpoints to carry
        first_csv = read_metrics(tmp_path / "a" / "metrics.csv")
        resumed_run = monsoon.train(data, epochs=epochs, resume=str(tmp_path / "a"), **kw)
        resumed = resumed_run.summary
    finally:
        data.unpersist()
    # the resumed run writes no folder: its rows, metrics.csv's had it one
    for rows, summary in ((first_csv, first.summary), (resumed_run.history, resumed)):
        _epochs_count_the_rows_left_out(rows, summary, sizes, batch, seed)
    counts = ("examples", "examples_left_out", "epochs", "updates")
    assert {k: resumed[k] for k in counts} == {k: s[k] for k in counts}
    assert ("spark_sync" in first.summary) == (len(sizes) == 2)
    # the last checkpoint carries the curve from its start, each row with its loss: the
    # run's rows (those its time for evaluating allowed), none past it
    ckpt = checkpoints.read(checkpoints.checkpoint_files(tmp_path / "a" / "checkpoints")[0])
    kept = [r["updates"] for r in ckpt.meta["rows"]]
    assert kept and kept[0] == 0 and kept[-1] <= ckpt.meta["updates"]
    assert set(kept) <= {r["updates"] for r in first.history}
    assert all(np.isfinite(r["loss"]) for r in ckpt.meta["rows"])
    offsets = np.cumsum([0] + sizes)
    taken = 0  # the plan's rows in shares of 2 or more: those a step takes
    for ids in global_batches(n, batch, seed, Budget(epochs=epochs)):
        shares = np.bincount(np.searchsorted(offsets, ids, side="right") - 1)
        taken += int(shares[shares >= 2].sum())
    assert ("spark_sync" in s) == (len(sizes) == 2)
    assert s["examples"] == taken and s["examples_left_out"] == epochs * n - taken > 0
    assert s["epochs"] == pytest.approx(epochs)
    assert s["examples_per_s"] == pytest.approx(s["examples"] / s["wall_time_s"])


@pytest.mark.parametrize("strategy, sizes, batch, epochs, updates", [
    ("sync", [8, 8, 8, 7], 9, 1, 4), ("serial", [31], 10, 2, 8)])
def test_without_a_batchnorm_the_driver_takes_every_row_of_a_batch(
        spark, strategy, sizes, batch, epochs, updates):
    """Without the BatchNorm nothing is left out, and the run equals serial
    on the rows in partition order: sync on the same data and batches as
    the lone-row test above; serial at 10 on 31 rows, the plan refused with
    one above (its epochs' short last batches of one row), as the local
    engine takes it."""
    X, c = _rows(31)
    data = TorchProblem.from_spark(_partitioned(spark, sizes), net(), nn.CrossEntropyLoss(),
                                   features="x", label="c", dtype="float64")
    kw = dict(lr=0.1, batch_size=batch, epochs=epochs, seed=1, evals=0, progress=False)
    try:
        run = monsoon.train(data, engine="spark", strategy=strategy, workers=len(sizes), **kw)
    finally:
        data.unpersist()
    ref = monsoon.train(TorchProblem(net(), nn.CrossEntropyLoss(), X, c, dtype="float64"),
                        strategy="serial", **kw)
    assert run.summary["examples"] == ref.summary["examples"] == 31 * epochs
    assert run.summary["updates"] == ref.summary["updates"] == updates
    np.testing.assert_allclose(run.params, ref.params, rtol=1e-9, atol=1e-12)


def test_the_driver_refuses_a_workers_part_of_one_row_but_not_a_chance_share():
    """32 rows in 4 partitions at batch size 10: the epoch's last batch of 2
    gives 2 of 4 workers a part of 1 row. Sync reduced where computed takes
    each partition's rows of the whole batch, so a share of 1 row comes by
    chance and is left out then (not refused); a sync of its own program
    computes each worker's part, a gradient of 1 row: refused before the
    run, naming a batch size that works."""
    from monsoon.engines.spark.placement import check_fewest_rows
    from monsoon.strategies import Budget
    from monsoon.strategies.sync import Sync

    class Clipped(Sync):
        name = "clipped"

        def program(self, job):
            yield from super().program(job)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8), nn.Linear(8, CLASSES))
    X, c = _rows(32)
    problem = TorchProblem(model, nn.CrossEntropyLoss(), X, c, dtype="float64")
    plan = ([8, 8, 8, 8], 10, 1, Budget(epochs=1))
    assert check_fewest_rows(problem, Sync(), *plan) == 2
    with pytest.raises(ConfigError, match=r"clipped on Spark at batch size 10 on 32 rows gives a "
                                          r"gradient 1 row in all \(.*, or a worker's part of a "
                                          r"batch cut among the workers\), .*; use --batch-size"):
        check_fewest_rows(problem, Clipped(), *plan)

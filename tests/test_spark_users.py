"""What a Spark user meets first: executors that cannot run monsoon are
refused in one line before any training job (``preflight.py``)."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import monsoon
from monsoon.engines.spark.preflight import FIX, mismatch, python_version
from monsoon.errors import ConfigError
from spark_env import spark_session

DRIVER = {"monsoon": "0.1.0", "numpy": "2.1.0", "scipy": "1.14.0"}


def _report(**changes):
    return {"python": "/opt/py/bin/python", "version": python_version(), **DRIVER, **changes}


@pytest.mark.parametrize("report, says", [
    (_report(), None),
    (_report(numpy=None, error="ModuleNotFoundError: No module named 'numpy'"),
     r"executors' Python \(/opt/py/bin/python\) cannot import numpy \(ModuleNotFoundError"),
    (_report(numpy="1.26.4"), "has numpy 1.26.4 where the driver has 2.1.0"),
    (_report(version="3.9"), r"is Python 3.9, the driver's is \d\.\d+"),
])
def test_executor_reports_are_judged_against_the_driver(report, says):
    found = mismatch([_report(), report], DRIVER, "python3")
    if says is None:
        assert found is None
    else:
        assert found is not None and "\n" not in found
        import re
        assert re.search(says, found), found


def _python_without_monsoon(tmp: Path) -> tuple[str, str]:
    """A venv of the driver's Python with nothing installed, and a folder
    holding only pyspark and py4j for its PYTHONPATH."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")],
                   check=True, timeout=120)
    python = tmp / "venv" / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import numpy"], capture_output=True,
                          timeout=60).returncode != 0
    import py4j
    import pyspark

    path = tmp / "path"
    path.mkdir()
    for module in (pyspark, py4j):
        (path / module.__name__).symlink_to(Path(module.__file__).parent)
    return str(python), str(path)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_executors_without_monsoon_are_refused_in_one_line(tmp_path, monkeypatch):
    python, path = _python_without_monsoon(tmp_path)
    monkeypatch.setenv("PYSPARK_PYTHON", python)
    import monsoon.engines.spark as spark_engine

    real = spark_engine.start_session

    def start(master, app_name="monsoon", conf=None):
        return real(master, app_name, {"spark.executorEnv.PYTHONPATH": path,
                                       "spark.pyspark.python": python, **(conf or {})})

    monkeypatch.setattr(spark_engine, "start_session", start)
    with spark_session("local[2]", share=False) as spark:  # executors without monsoon
        spark.sparkContext.setLogLevel("OFF")
        with pytest.raises(ConfigError) as info:
            monsoon.train("logistic", strategy="sync", workers=2, engine="spark", steps=2,
                          evals=0)
    message = str(info.value)
    assert "\n" not in message and python in message, message
    assert FIX in message and "Py4J" not in message and "at org." not in message, message


# -- the command line names the data: spark:PATH, spark-table:NAME ----------

@pytest.fixture(scope="module")
def spark():
    with spark_session("local[2]") as session:
        yield session


@pytest.fixture(scope="module")
def clicks(tmp_path_factory):
    """A small click-like libsvm file: ±1 labels, one-based sparse rows."""
    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "clicks.libsvm"
    lines = []
    for _ in range(600):
        cols = np.unique(rng.zipf(1.5, size=6) % 300) + 1
        label = 1 if (cols % 7 == 0).any() or rng.random() < 0.2 else -1
        lines.append(f"{label} " + " ".join(f"{c}:1" for c in cols))
    path.write_text("\n".join(lines) + "\n")
    return path


FULL = dict(strategy="sync", workers=2, rule="adagrad", lr=0.5, steps=3, batch_size=600,
            dtype="float64", evals=0)


@pytest.mark.spark
@pytest.mark.slow
def test_spark_paths_and_tables_train_as_the_same_file_does_locally(spark, clicks, tmp_path):
    """spark:FILE.libsvm, spark:PARQUET and spark-table:NAME (one partition
    each, repartitioned to the workers) give the full-batch parameters of
    the local engine on libsvm:FILE, the features' variances included
    (standardized AdaGrad)."""
    import numpy as np

    full = {**FULL, "lr": 0.05, "standardize_below": 1.0}  # every feature standardized
    ref = monsoon.train(f"libsvm:{clicks}", engine="local", **full)
    parquet = str(tmp_path / "clicks.parquet")
    spark.read.format("libsvm").load(str(clicks)).coalesce(1).write.parquet(parquet)
    spark.read.parquet(parquet).createOrReplaceTempView("clicks")
    for name in (f"spark:{clicks}", f"spark:{parquet}", "spark-table:clicks"):
        run = monsoon.train(name, engine="spark", **full)
        np.testing.assert_allclose(run.params, ref.params, rtol=1e-9, atol=1e-12,
                                   err_msg=name)
        assert run.summary["updates"] == 3 and run.summary["engine"] == "spark"


@pytest.mark.spark
@pytest.mark.slow
def test_sync_on_a_spark_path_defaults_to_standardized_lbfgs(spark, clicks):
    """sync on spark:PATH at its defaults takes MLlib's road: full-batch
    L-BFGS steps with each feature's variance (over every partition) as
    H_0; it is the local engine's serial L-BFGS on the same file."""
    import numpy as np

    run = monsoon.train(f"spark:{clicks}", "sync", 2, engine="spark", dtype="float64",
                        evals=0, epochs=25)
    s = run.summary
    assert s["rule"] == "lbfgs" and s["batch_size"] == 600 and s["updates"] == 25
    local = monsoon.train(f"libsvm:{clicks}", "serial", 1, rule="lbfgs", dtype="float64",
                          evals=0, epochs=25)
    np.testing.assert_allclose(run.params, local.params, rtol=1e-6, atol=1e-9)
    from monsoon.config import resolve

    sync = resolve(f"spark:{clicks}", "sync", 2, {"engine": "spark"})
    assert len(sync.rule.metric) == sync.problem.n_params and sync.rule.metric[-1] == 1.0
    # async keeps AdaGrad mini-batches
    assert resolve(f"spark:{clicks}", "async", 2, {"engine": "spark"}).run["rule"] == "adagrad"


@pytest.mark.spark
def test_the_loss_curve_takes_a_job_per_level_not_per_point(spark, clicks, monkeypatch):
    """SparkData evaluates many points in one job, each the full-data
    objective (the local problem's on the same file); the recorder evaluates the curve a level at a
    time, so a run's curve costs a few jobs, not one per row."""
    import numpy as np

    from monsoon.engines.spark import SparkData, data as spark_data
    from monsoon.record.recorder import refinement_levels
    from spark_env import count_jobs

    from monsoon.problems.files import load_svmlight
    from monsoon.problems.sparse_linear import SparseLinear

    data = SparkData(str(clicks), dtype="float64", lam=1e-2)
    X, y, _ = load_svmlight(str(clicks), dtype="float64")
    X.resize((X.shape[0], data.n_features))
    local = SparseLinear(X, (y > 0).astype(float), lam=1e-2)  # the same objective, here
    rng = np.random.default_rng(0)
    ws = [rng.normal(size=data.n_params) for _ in range(5)]
    single = [local.loss(w) for w in ws]
    assert data.loss(ws[0]) == pytest.approx(single[0], rel=1e-12)
    monkeypatch.setattr(spark_data, "EVAL_BYTES", 2 * data.n_params * 8)  # 2 points a job
    jobs = count_jobs(spark, monkeypatch)
    many = [m["loss"] for m in data.evaluate_many(ws)]
    np.testing.assert_allclose(many, single, rtol=1e-12)
    assert jobs["jobs"] == 3
    monkeypatch.setattr(spark_data, "EVAL_BYTES", 32 << 20)
    evaluations, real = [], SparkData._sums

    def sums(self, w, per_block):
        evaluations.append(np.ndim(w))
        return real(self, w, per_block)

    monkeypatch.setattr(SparkData, "_sums", sums)
    run = monsoon.train(f"spark:{clicks}", "sync", 2, engine="spark", dtype="float64")
    rows = len(run.history)
    # sync's full-batch L-BFGS steps computed each snapshot's loss: a job for
    # the ends (which check those losses), one for the final point
    assert rows >= 10 and len(evaluations) <= 2


def test_spark_data_defaults_to_adagrad_unless_a_rule_is_given():
    """The spark problems' defaults carry their rule (AdaGrad, for sparse
    features); a --rule the user gives wins."""
    from monsoon.config import resolve
    from monsoon.problems import SPARK_DEFAULTS, problem_defaults

    assert problem_defaults("spark:x.libsvm")["rule"] == SPARK_DEFAULTS["rule"] == "adagrad"
    given = resolve("exp", "serial", 1, {"rule": "momentum"})
    assert given.run["rule"] == "momentum"
    plain = resolve("exp", "serial", 1, {})
    assert plain.run["rule"] == "sgd"  # a problem without a rule default: the run's
    from monsoon.problems import make_problem

    problem = make_problem("rcv1-like:rows=400,features=300")
    problem.defaults = dict(SPARK_DEFAULTS)  # as SparkData carries them
    own = resolve(problem, "serial", 1, {})
    assert own.run["rule"] == "adagrad" and type(own.rule).__name__ == "Adagrad"
    assert own.run["lr"] == SPARK_DEFAULTS["lr"]
    # the rare features standardized: rate j times max(1, 0.01 / sigma_j), the bias's 1
    c = SPARK_DEFAULTS["standardize_below"]
    scale = np.maximum(1.0, c * np.sqrt(problem.inverse_variance()))
    assert own.rule.standardize_below == c == 0.01 and scale[-1] == 1
    assert np.array_equal(own.rule.rate_scale, scale)
    # the problem's values hold for its rule, named or not, unless given
    assert resolve(problem, "serial", 1, {"rule": "adagrad"}).rule.standardize_below == c
    assert not resolve(problem, "serial", 1, {"standardize_below": 0.0}).rule.standardize
    assert resolve(problem, "serial", 1, {"rule": "sgd"}).run["rule"] == "sgd"
    # sync's own default: full-batch L-BFGS, unless mini-batches are asked for
    sync = resolve(problem, "sync", 2, {"engine": "spark"})
    assert sync.run["rule"] == "lbfgs" and sync.run["batch_size"] == problem.n_examples
    assert sync.run["epochs"] == 100 and sync.run["tol"] is None  # lbfgs: its step count
    # the mini-batch strategies: at most 100 epochs (MLlib's maxIter), stopping at 0.02%
    # an epoch (MLlib's tol), the server's parameters tail-averaged over about an epoch
    # (an engine option)
    own_async = resolve(problem, "async", 2, {"engine": "spark"})
    assert (own_async.run["epochs"], own_async.run["tol"]) == (100, 2e-4)
    assert own_async.engine.average_epochs == 1.0
    assert resolve(problem, "async", 2, {"engine": "spark", "average_epochs": 0.0}
                   ).engine.average_epochs == 0.0
    assert resolve(problem, "async", 2, {"engine": "spark", "tol": 0.01}).run["tol"] == 0.01
    # an engine that evaluates the curve after the run stops at a --tol given (its recorder
    # then checks rows as they are taken), but does not take the problem's default tol;
    # the sim, on virtual time, refuses it
    assert resolve(problem, "async", 2, {"tol": 0.01}).run["tol"] == 0.01
    assert resolve(problem, "async", 2, {}).run["tol"] is None
    with pytest.raises(ConfigError, match="--tol needs the loss evaluated while the run goes"):
        resolve(problem, "async", 2, {"engine": "sim", "tol": 0.01})
    # sync's barrier stage holds every slot: no loss job runs during it
    with pytest.raises(ConfigError, match="does not do for sync: drop --tol"):
        resolve(problem, "sync", 2, {"engine": "spark", "batch_size": 64, "tol": 0.01})
    assert resolve(problem, "sync", 2, {"engine": "spark", "batch_size": 64}).run["tol"] is None
    # a budget given is the user's: the default stopping rule goes with the default budget
    assert resolve(problem, "async", 2, {"engine": "spark", "epochs": 30}).run["tol"] is None
    with pytest.raises(ConfigError, match="drop --tol"):
        resolve(problem, "sync", 2, {"engine": "spark", "tol": 0.01})
    mini = resolve(problem, "sync", 2, {"engine": "spark", "batch_size": 64})
    assert mini.run["rule"] == "adagrad" and mini.run["batch_size"] == 64


@pytest.mark.spark
@pytest.mark.slow
def test_the_datas_own_jobs_wait_the_runs_timeout(spark, clicks, monkeypatch):
    """Once the run starts, the data's own Spark jobs (the loss on the
    executors) wait as long as the run's --timeout says, not its default.
    (Reading and converting the source happen when the problem is made,
    before the run, and wait the default.)"""
    from monsoon.engines.spark import jobs

    waits = []
    real = jobs.Jobs.__init__

    def init(self, sc, timeout, label):
        waits.append((label, timeout))
        real(self, sc, timeout, label)

    monkeypatch.setattr(jobs.Jobs, "__init__", init)
    monsoon.train(f"spark:{clicks}", engine="spark", timeout=7.5, **FULL)
    run = [label for label, _ in waits].index("sync")  # the run's own job group
    data_waits = [t for label, t in waits[run:] if label == "data"]
    assert data_waits and set(data_waits) == {7.5}, waits


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("name, says", [
    ("spark:/nonexistent/clicks.parquet", r"Spark cannot read /nonexistent/clicks.parquet as "
                                          r"parquet \(.*\); no file or folder is there: give"),
    ("spark:/nonexistent/clicks.libsvm", r"Spark cannot read /nonexistent/clicks.libsvm as "
                                         r"libsvm \(.*\); no file or folder is there: give"),
    ("spark-table:no_such_table", r"no Spark table 'no_such_table' \(.*\); tables here:"),
])
def test_unreadable_spark_data_is_refused_in_one_line(spark, name, says):
    """A missing path is told apart from a malformed file."""
    with pytest.raises(ConfigError) as info:
        monsoon.train(name, engine="spark", **FULL)
    message = str(info.value)
    assert "\n" not in message and re.search(says, message), message


@pytest.mark.spark
@pytest.mark.slow
def test_a_missing_spark_path_prints_no_java_stack(tmp_path):
    """``monsoon train --problem spark:MISSING`` in a process of its own (its
    own JVM, which writes to the process's stderr): its one line, exit 2,
    and none of Spark's warning about the missing path with its Java stack."""
    import os

    missing = tmp_path / "missing.libsvm"
    env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    done = subprocess.run([sys.executable, "-m", "monsoon", "train", "--problem", f"spark:{missing}",
                           "--engine", "spark", "--quiet"], capture_output=True, text=True,
                          timeout=240, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"monsoon: error: Spark cannot read {missing} as libsvm" in done.stderr, done.stderr
    assert "FileNotFoundException" not in done.stderr and "\tat org.apache" not in done.stderr, \
        done.stderr


@pytest.mark.spark
@pytest.mark.slow
def test_a_libsvm_path_is_told_by_the_same_suffixes_from_python(spark, clicks, tmp_path):
    """``SparkData(PATH)`` tells a libsvm file as ``--problem spark:PATH``
    does (.libsvm, .svm, .txt, any case): a .txt or .SVM path was read as
    Parquet and refused."""
    from monsoon.engines.spark import SparkData

    for name in ("clicks.txt", "clicks.SVM"):
        copy = tmp_path / name
        copy.write_bytes(clicks.read_bytes())
        run = monsoon.train(SparkData(str(copy), dtype="float64", repartition=True),
                            engine="spark", **FULL)
        assert run.summary["examples"] > 0 and np.isfinite(run.summary["final_loss"])


@pytest.mark.spark
@pytest.mark.slow
def test_an_empty_libsvm_file_is_told_to_be_fixed_not_renamed(spark, tmp_path):
    """A file already ending in .svm that Spark cannot read as libsvm (here
    empty) was told to be 'a libsvm file ending in .libsvm, .svm, .txt'."""
    empty = tmp_path / "empty.svm"
    empty.write_text("")
    with pytest.raises(ConfigError) as info:
        monsoon.train(f"spark:{empty}", engine="spark", **FULL)
    message = str(info.value)
    assert "\n" not in message and f"Spark cannot read {empty} as libsvm" in message, message
    assert "fix the file" in message and "ending in" not in message, message
    assert message.endswith("with 1-based indices, and at least one such line"), message


@pytest.mark.spark
@pytest.mark.slow
def test_a_libsvm_file_spark_cannot_parse_prints_no_java_stack(spark, tmp_path, capfd):
    """A qid: field failed Spark's reading task, whose Java stack (~60
    lines, from the executor's and the scheduler's loggers) came before the
    one-line error; the log configuration is the same after as before."""
    from monsoon.engines.spark.data import TASK_ERROR_LOGGERS

    log4j = spark.sparkContext._jvm.org.apache.logging.log4j

    def loggers():
        config = log4j.LogManager.getContext(False).getConfiguration()
        return [(config.getLoggerConfig(n).getName(),
                 str(log4j.LogManager.getLogger(n).getLevel())) for n in TASK_ERROR_LOGGERS]

    data = tmp_path / "ranked.svm"
    data.write_text("1 qid:0 1:0.5 2:1\n0 qid:1 1:0.25\n")
    before = loggers()
    capfd.readouterr()
    with pytest.raises(ConfigError, match="NumberFormatException"):
        monsoon.train(f"spark:{data}", engine="spark", **FULL)
    err = capfd.readouterr().err
    assert "\tat " not in err and "ERROR Executor" not in err, err
    assert loggers() == before


@pytest.mark.spark
@pytest.mark.slow
def test_a_libsvm_file_with_a_byte_order_mark_reads_as_the_file_without(spark, clicks,
                                                                        tmp_path):
    """A UTF-8 byte-order mark before the first line, as the local reader
    (encoding utf-8-sig) skips it: Spark's libsvm reader (Hadoop's line
    reader) skips it too, so the first row keeps its label and features and
    the data is the same problem. A guard: it held before it was tested."""
    from monsoon.engines.spark import SparkData

    text = clicks.read_text()
    bom = tmp_path / "bom.libsvm"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    plain, marked = SparkData(str(clicks)), SparkData(str(bom))
    try:
        w = np.random.default_rng(0).normal(size=plain.n_params)
        assert marked.n_examples == plain.n_examples == len(text.splitlines())
        assert marked.n_features == plain.n_features
        assert marked.constant_loss() == plain.constant_loss()
        assert marked.loss(w) == plain.loss(w)
    finally:
        plain.unpersist()
        marked.unpersist()


@pytest.mark.spark
@pytest.mark.slow
def test_a_label_that_is_not_a_number_is_one_line_with_no_stack(spark, tmp_path, monkeypatch):
    """spark:PATH with a string label failed the conversion job on the
    executors: ~130 lines of Python and Java stacks, then a line that did
    not name the column; a null label the same. The string is refused on
    the driver before any job, naming the column (the check
    TorchProblem.from_spark makes); the null by the conversion job, which
    runs with the loggers of a failed task's stacks silenced (as reading
    a file does), and gives them their levels back after. The null is a
    ConfigError too (exit 2, a bad input): it exited 1, as a failed run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from monsoon.engines.spark.data import TASK_ERROR_LOGGERS, SparkSource
    from monsoon.problems.spark_data import _rows_to_arrays

    log4j = spark.sparkContext._jvm.org.apache.logging.log4j

    def levels():
        return [str(log4j.LogManager.getLogger(n).getLevel()) for n in TASK_ERROR_LOGGERS]

    during, job = {}, SparkSource.job

    def watched(self, problem, rdd, func, what):
        during.setdefault(what, levels())
        return job(self, problem, rdd, func, what)

    monkeypatch.setattr(SparkSource, "job", watched)
    before = levels()
    features = [[float(i % 3), 1.0] for i in range(40)]
    cases = (("str", ["yes", "no"] * 20, ConfigError,
              "the label column 'label' holds string; it must be numeric"),
             ("null", [1.0, None] * 20, ConfigError,  # exit 2, as the string's
              "column 'label' holds a null: drop or fill those rows first"))
    for name, labels, kind, says in cases:
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"features": features, "label": labels}), path)
        with pytest.raises(kind) as info:
            monsoon.train(f"spark:{path}", engine="spark", **FULL)
        message = str(info.value)
        assert "\n" not in message and says in message, message
        assert "Traceback" not in message and "at org." not in message, message
        if name == "str":
            assert during == {}, during  # refused before any job
    converting = during["converting the Spark data on the executors"]
    assert converting == ["OFF"] * len(TASK_ERROR_LOGGERS), converting
    assert levels() == before
    with pytest.raises(ValueError, match="column 'label' holds a null"):  # without Arrow
        _rows_to_arrays([([1.0, 2.0], 1.0), ([1.0, 0.0], None)], "features", "label", None)


def _cli(*args):
    """``monsoon ARGS --quiet`` in this process: (exit code, stderr's lines)."""
    import contextlib
    import io

    from monsoon.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([*args, "--quiet"])
    return code, err.getvalue().strip().splitlines()


NAN = float("nan")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("row3, labels, says", [
    ([1.0, 1.0], [1.0, None] * 20, "column 'label' holds a null: drop or fill those rows"),
    ([None, 1.0], [1.0, 0.0] * 20, "the features 'features' hold a null inside a row: drop "
                                   "or fill those rows first"),
    ([NAN, 1.0], [1.0, 0.0] * 20, "the features 'features' row 3 holds nan; NaN and Inf "
                                  "cannot be trained on: fix or remove that row"),
    ([1.0, 1.0], [1.0, NAN] * 20, "the label column 'label' row 1 holds nan; NaN and Inf"),
])
def test_a_null_or_nan_in_spark_data_is_a_bad_input_on_the_command_line(spark, tmp_path,
                                                                         row3, labels, says):
    """A null inside an array of features, or a NaN feature, failed building
    the blocks after Spark's retries (exit 1, "caching the converted
    partitions failed ...: monsoon.errors.ConfigError: X row 3 holds nan");
    a NaN label trained as class 0. The conversion job reports each, and
    the command line refuses the data as a bad input: exit 2, one line
    naming the partition, the column and (NaN) the partition's row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = [[float(i % 3), 1.0] for i in range(40)]
    features[3] = row3
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"features": features, "label": labels}), path)
    out = tmp_path / "run"
    code, lines = _cli("train", "--problem", f"spark:{path}", "--engine", "spark",
                       "--strategy", "serial", "--steps", "1", "--out", str(out))
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("monsoon: error: partition 0: ") and says in lines[0], lines
    assert not out.exists()


@pytest.mark.spark
def test_a_nan_in_one_of_several_feature_columns_names_each_column(spark):
    """SparkData over features=["a", "b"] with a NaN in b: the line named
    the columns as one ('a, b'), a column the DataFrame does not have; it
    names each."""
    from monsoon.engines.spark import SparkData

    df = spark.createDataFrame([(1.0, 2.0, 1.0), (0.0, float("nan"), 0.0)],
                               "a double, b double, label double").coalesce(1)
    with pytest.raises(ConfigError) as info:
        SparkData(df, features=["a", "b"], label="label")
    message = str(info.value)
    assert "partition 0: the features 'a', 'b' row 1 holds nan" in message, message


# -- job overhead: measured, reported, and the work per job it asks for ------

@pytest.mark.parametrize("overhead, step, bound, expected", [
    (0.1, 0.001, 0.1, 1024),   # 0.1 s jobs, 1 ms steps: 900 steps -> 1024
    (0.1, 0.01, 0.1, 128),     # 90 steps -> 128
    (0.05, 0.05, 0.5, 1),      # a step as long as a job: one step suffices at 50%
    (0.0, 0.01, 0.1, 1),       # no overhead
    (1.0, 0.0, 0.1, 4096),     # free steps: the cap
])
def test_steps_per_job_keeps_the_overhead_share_under_the_bound(overhead, step, bound,
                                                                expected):
    from monsoon.engines.spark.sizing import steps_per_job

    n = steps_per_job(overhead, step, bound)
    assert n == expected
    if overhead and step:
        assert overhead / (overhead + n * step) <= bound + 1e-12
        assert n == 1 or overhead / (overhead + n / 2 * step) > bound  # the fewest (power of 2)
    assert n & (n - 1) == 0


def test_job_timing_share():
    from monsoon.engines.spark.sizing import JobTiming

    timing = JobTiming()
    assert timing.share is None
    timing.add(1.0, 0.75)
    timing.add(1.0, 0.25)
    assert timing.share == pytest.approx(0.5)
    assert timing.summary() == {"spark_jobs": 2, "spark_job_share": 0.5}
    streamed = JobTiming("exchange")
    streamed.add(1.0, 0.75)
    assert streamed.summary() == {"spark_exchanges": 1, "spark_exchange_share": 0.25}


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("strategy, options, field", [
    ("async", {"n_fetch": 8, "n_push": 8}, "n_push"),
    ("local-sgd", {"local_steps": 8}, "local_steps"),
    ("easgd", {"easgd_tau": 8}, "tau"),
])
def test_a_run_reports_its_job_share_and_work_per_job(spark, strategy, options, field):
    run = monsoon.train("logistic", strategy=strategy, workers=2, engine="spark", steps=64,
                        batch_size=32, lr=0.1, dtype="float64", evals=0, **options)
    s = run.summary
    assert s[field] == 8 and field + "_chosen" not in s  # set by the user: kept
    if strategy == "local-sgd":  # a job a round
        assert s["spark_jobs"] >= 64 // 8 // 2 and 0.0 < s["spark_job_share"] < 1.0, s
    else:  # one long job a worker, an exchange a period over its socket (stream.py)
        assert s["spark_jobs"] == 2 and s["spark_exchanges"] == s["updates"] >= 64 // 8 // 2
        assert 0.0 < s["spark_exchange_share"] < 1.0, s


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("strategy, field, rows, per_worker, updates_per_job", [
    ("async", "n_push", 16, 256, 2),         # batches of its shard, its share of the steps
    ("local-sgd", "local_steps", 8, 512, 1),  # its part of each global batch, every step
    ("easgd", "tau", 16, 256, 2),             # as async's: an exchange per worker a job
])
def test_a_push_period_or_round_at_its_defaults_is_sized_from_measured_jobs(
        spark, strategy, field, rows, per_worker, updates_per_job):
    """Neither --n-push nor --n-fetch given (async), no --local-steps (local
    SGD, whose round is one job), no --easgd-tau: the engine times a step of
    the worker's rows and an exchange's overhead (a job, for local SGD; a
    round trip of the parameters and rule state over a socket, for the
    streamed async and EASGD), and picks the steps per exchange that keep
    the overhead at most 10% of it, at most 1/8 of a worker's steps and 1/4
    of its steps per epoch (convergence: its copy is merged several times an
    epoch)."""
    from monsoon.engines.spark.sizing import steps_per_job

    run = monsoon.train("logistic", strategy=strategy, workers=2, engine="spark", steps=512,
                        batch_size=16, lr=0.1, dtype="float64", evals=0)
    s = run.summary
    n, per_epoch = s[field + "_chosen"], s["n_examples"] // 2 // rows
    assert s[field + "_most"] == min(per_worker // 8, per_epoch // 4)
    assert s[field] == n and 1 <= n <= s[field + "_most"]
    overhead = s["job_overhead_s"] if strategy == "local-sgd" else s["exchange_s"]
    assert n == steps_per_job(overhead, s["step_s"], 0.1, most=s[field + "_most"])
    assert s["job_overhead_s"] > 0 and s["step_s"] > 0 and overhead > 0
    assert s["examples"] == 512 * 16 and s["updates"] == -(-per_worker // n) * updates_per_job


@pytest.mark.spark
@pytest.mark.slow
def test_a_spark_run_that_ends_above_its_start_says_so(spark, clicks, capsys):
    """The same check as the local engine's (``api``), on Spark data: a
    rate far too high ends above the starting loss and is warned of; the
    constant predictor's loss comes from the conversion's label sums."""
    from monsoon.problems import make_problem
    from monsoon.problems.sparse_linear import SparseLinear

    run = monsoon.train(f"spark:{clicks}", engine="spark", progress=False,
                        **{**FULL, "rule": "sgd", "lr": 300.0})
    warning = run.summary["warning"]
    assert run.summary["final_loss"] > run.history[0]["loss"]
    assert "above its starting loss" in warning and "lower the learning rate" in warning
    assert warning in capsys.readouterr().err
    local = make_problem(f"libsvm:{clicks}", dtype="float64")
    assert isinstance(local, SparseLinear)
    assert run.problem.constant_loss() == pytest.approx(local.constant_loss(), rel=1e-9)


@pytest.mark.spark
@pytest.mark.slow
def test_a_spark_run_given_a_target_loss_stops_there(spark, clicks):
    """Sync's full-batch steps (barrier stage) stop on the all-reduced step
    loss, async's on the loss the recorder evaluates between its jobs: both
    end at the target, well before their budget, and are not diverged."""
    whole = monsoon.train(f"libsvm:{clicks}", "serial", 1, rule="lbfgs", dtype="float64",
                          epochs=25, progress=False)  # = sync on spark (a test above)
    start, end = whole.history[0]["loss"], whole.summary["final_loss"]
    target = end + 0.2 * (start - end)
    # async's 300 rows a worker are one push an epoch, and its checks come every few
    # epochs of so short a run (each spaced by 10x its own cost): a budget well past them
    for strategy, epochs in (("sync", 25), ("async", 200)):
        run = monsoon.train(f"spark:{clicks}", strategy, 2, engine="spark", dtype="float64",
                            epochs=epochs, target_loss=target, progress=False)
        s = run.summary
        assert s["status"] == "reached target" and "stopped" not in s, (strategy, s)
        assert "reached the target loss" in s["stopped_at_target"]
        assert s["final_loss"] <= target and s["time_to_target_s"] is not None, strategy
        assert s["epochs"] < epochs, (strategy, s["epochs"])


@pytest.mark.spark
@pytest.mark.slow
def test_async_tasks_evaluate_the_in_run_loss_while_they_hold_the_slots(spark, clicks,
                                                                        monkeypatch):
    """Async's long tasks hold both of local[2]'s slots, so a Spark job
    evaluating the loss would wait for the run's end: the checks of
    --target-loss are computed by the tasks between their pushes
    (``DriverServer.sums``), and the run stops at the target."""
    from monsoon.engines.spark.server import DriverServer

    answered = []
    sums = DriverServer.sums

    def counted(self, W, per_block):
        out = sums(self, W, per_block)
        answered.append(out is not None and len(out) == 2)
        return out

    monkeypatch.setattr(DriverServer, "sums", counted)
    first = monsoon.train(f"spark:{clicks}", "async", 2, engine="spark", dtype="float64",
                          epochs=1, progress=False).history[0]["loss"]
    run = monsoon.train(f"spark:{clicks}", "async", 2, engine="spark", dtype="float64",
                        epochs=400, target_loss=0.7 * first, progress=False)
    s = run.summary
    assert s["status"] == "reached target" and s["epochs"] < 400, s
    assert s["spark_jobs"] == 2 and answered and all(answered), answered
    assert s["averaged_epochs"] == 1.0  # spark data's default: the tail average is evaluated


@pytest.mark.spark
@pytest.mark.slow
def test_async_returns_the_tail_average_not_the_last_iterate(spark, clicks, monkeypatch):
    """Spark data's async returns the server's parameters averaged over
    about the last epoch (``--average-epochs 1``), not its last iterate; with
    ``average_epochs=0`` it returns the iterate."""
    from monsoon.engines.spark.server import DriverServer

    ends = []
    run_server = DriverServer.run

    def kept(self, recorder, *args, **kwargs):
        out = run_server(self, recorder, *args, **kwargs)
        ends.append((self.w.copy(), None if self.average is None else self.average.params.copy()))
        return out

    monkeypatch.setattr(DriverServer, "run", kept)
    # batches of 32: a push carries less than the epoch (600 rows) averaged over
    kw = dict(engine="spark", dtype="float64", epochs=4, batch_size=32, evals=0, progress=False)
    averaged = monsoon.train(f"spark:{clicks}", "async", 2, **kw)
    last, average = ends[-1]
    assert averaged.summary["averaged_epochs"] == 1.0
    np.testing.assert_array_equal(averaged.params, average)
    assert not np.allclose(average, last)
    plain = monsoon.train(f"spark:{clicks}", "async", 2, average_epochs=0.0, **kw)
    last, average = ends[-1]
    assert average is None and "averaged_epochs" not in plain.summary
    np.testing.assert_array_equal(plain.params, last)


@pytest.mark.spark
@pytest.mark.slow
def test_local_sgd_returns_the_tail_average_of_theta(spark, clicks, monkeypatch):
    """Spark data's local SGD returns theta averaged over about the last
    epoch (``spark/rounds.py``), as async does, not the last round's theta;
    with ``average_epochs=0`` it returns theta."""
    from monsoon.engines.spark import rounds
    from monsoon.server.averaging import TailAverage

    made = []

    class Kept(TailAverage):
        def __init__(self, w, horizon):
            super().__init__(w, horizon)
            made.append(self)

        def update(self, w, examples):
            super().update(w, examples)
            self.last = np.array(w, copy=True)

    monkeypatch.setattr(rounds, "TailAverage", Kept)
    # a job a round, about 10 rounds an epoch: 2 epochs, the second averaged
    kw = dict(engine="spark", dtype="float64", epochs=2, batch_size=32, local_steps=2,
              evals=0, progress=False)
    averaged = monsoon.train(f"spark:{clicks}", "local-sgd", 2, **kw)
    assert averaged.summary["averaged_epochs"] == 1.0 and len(made) == 1
    np.testing.assert_array_equal(averaged.params, made[0].params)
    assert not np.allclose(made[0].params, made[0].last)
    plain = monsoon.train(f"spark:{clicks}", "local-sgd", 2, average_epochs=0.0, **kw)
    assert len(made) == 1 and "averaged_epochs" not in plain.summary


@pytest.mark.spark
@pytest.mark.slow
def test_a_run_stopped_at_its_target_returns_what_the_check_found(spark, clicks, monkeypatch):
    """``monsoon.train`` returns the parameters the in-run check found at the
    target, not the server's after pushes that landed between the check and
    the stop (here a shift the engine adds to what it returns)."""
    from monsoon.engines.spark.engine import SparkEngine

    run_engine = SparkEngine.run

    def run_then_move(self, *args, **kwargs):
        res = run_engine(self, *args, **kwargs)
        res.params = res.params + 1.0
        return res

    monkeypatch.setattr(SparkEngine, "run", run_then_move)
    first = monsoon.train(f"spark:{clicks}", "async", 2, engine="spark", dtype="float64",
                          epochs=1, progress=False).history[0]["loss"]
    target = 0.8 * first
    # the in-run checks come every few seconds, many epochs of this small
    # file apart on a loaded machine (40 epochs once ran out before one found it)
    run = monsoon.train(f"spark:{clicks}", "async", 2, engine="spark", dtype="float64",
                        epochs=200, target_loss=target, progress=False)
    s = run.summary
    assert s["status"] == "reached target" and s["epochs"] < 200, s
    assert s["final_loss"] <= target, (s["final_loss"], target)


@pytest.mark.spark
@pytest.mark.slow
def test_a_spark_run_given_tol_stops_once_an_epoch_gains_less(spark, clicks):
    """--tol: async stops, not diverged, once the best loss the recorder
    evaluated between its jobs fell by less than tol of itself over an epoch,
    well before its budget (the loss is evaluated every few seconds: this
    small file's plateau comes within tens of epochs, and on a loaded machine
    within about a hundred: the checks come by the clock, not by epoch)."""
    tol, epochs = 0.05, 800
    run = monsoon.train(f"spark:{clicks}", "async", 2, engine="spark", dtype="float64",
                        epochs=epochs, tol=tol, progress=False)
    s = run.summary
    assert s["status"] == "converged" and "stopped" not in s, s
    assert s["stopped_converged"].startswith("converged: the loss fell by less than 0.05")
    assert 1 < s["epochs"] < epochs / 4, s["epochs"]
    start = run.history[0]["loss"]
    assert s["final_loss"] < 0.8 * start  # it trained before it stopped
    before, after = (float(x) for x in re.search(r"\(([\d.]+) to ([\d.]+)",
                                                  s["stopped_converged"]).groups())
    assert after <= before and before - after < tol * after

"""The spark engine carries out the strategy's program (issue 30), on a real
local Spark: every strategy goes through the ops it declares, and which way
it runs (on the driver, or in tasks) follows from declarations."""
import numpy as np
import pytest

import monsoon
from monsoon.engines.spark.placement import in_tasks
from monsoon.strategies import STRATEGIES
from spark_env import count_jobs


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    from spark_env import spark_session

    with spark_session("local[2]") as session:
        yield session


@pytest.fixture
def jobs(spark, monkeypatch):
    return count_jobs(spark, monkeypatch)


@pytest.mark.spark
def test_sync_reduces_where_computed_and_equals_serial(spark):
    # on the driver each step is one Spark job: 6 steps compare the ways
    # as an epoch's 22 would
    kw = dict(lr=0.5, steps=6, batch_size=64, seed=0, dtype="float64", evals=0)
    serial = monsoon.train("digits", strategy="serial", **kw)
    sync = monsoon.train("digits", strategy="sync", workers=3, engine="spark", **kw)
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)
    one = monsoon.train("digits", strategy="serial", engine="spark", **kw)
    np.testing.assert_array_equal(one.params, serial.params)


@pytest.mark.spark
def test_local_sgd_takes_one_job_per_round(jobs):
    kw = dict(lr=0.5, steps=16, batch_size=64, seed=0, dtype="float64", evals=0)
    run = monsoon.train("digits", strategy="local-sgd", workers=2, engine="spark",
                        local_steps=4, **kw)
    assert run.summary["updates"] == 4
    assert jobs["jobs"] == 1 + 4  # the data's load, then one job per round
    assert run.summary["examples"] == 16 * 64


@pytest.mark.spark
def test_local_sgd_counts_its_local_steps_apart_and_stops_when_most_are_dropped(spark):
    """local-sgd on Spark: a task's NaN local gradients (every third after
    the second, on every worker) are counted in dropped_local_updates, apart
    from the rounds, all applied, and the run finishes; at lr 1e6 every
    local gradient overflows after the first steps, and the recorder stops
    the run on its dropped local steps."""
    from pathlib import Path

    from faulty import FaultyProblem
    from monsoon.problems import make_problem
    from monsoon.record.recorder import DROPPED_LOCAL

    spark.sparkContext.addPyFile(str(Path(__file__).parent / "faulty.py"))  # for the executors
    kw = dict(steps=400, batch_size=16, local_steps=8, seed=0, evals=20, engine="spark")
    problem = FaultyProblem(make_problem("exp"), "nan", rank=None, after=2, every=3)
    s = monsoon.train(problem, "local-sgd", 2, **kw).summary
    assert (s["updates"], s["dropped_updates"]) == (400 // 8, 0)
    assert s["local_updates"] + s["dropped_local_updates"] == 2 * 400
    assert 100 < s["dropped_local_updates"] < s["local_updates"]
    assert s["status"] == "finished"
    s = monsoon.train("exp", "local-sgd", 2, **{**kw, "steps": 20_000}, lr=1e6,
                      raise_on_divergence=False).summary
    assert s["status"] == "diverged" and s["dropped_local_updates"] > 100
    assert s["stopped"] == DROPPED_LOCAL.format(dropped=s["dropped_local_updates"],
                                                updates=s["local_updates"])
    assert s["examples"] < 20_000 * 16


@pytest.mark.parametrize("name, where", [("serial", "driver"), ("sync", "driver"),
                                          ("async", "tasks"), ("easgd", "tasks"),
                                          ("local-sgd", "tasks")])
def test_where_a_program_runs_follows_its_declarations(name, where):
    assert in_tasks(STRATEGIES.get(name)()) == (where == "tasks")


@pytest.mark.parametrize("options", [dict(n_fetch=2, n_push=4), dict(n_fetch=4, n_push=2)])
def test_a_program_that_reads_twice_per_task_is_refused(options):
    with pytest.raises(monsoon.ConfigError, match="--n-fetch equal to --n-push"):
        monsoon.train("logistic", strategy="async", workers=2, engine="spark", steps=2,
                      evals=0, **options)


def test_no_strategy_name_is_compared_in_the_engines():
    import pathlib
    import re

    root = pathlib.Path(monsoon.__file__).parent / "engines"
    names = "|".join(re.escape(n) for n in STRATEGIES.names())
    compared = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({names})["']|["']({names})["']\s*(==|!=)""")
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if compared.search(line)]
    assert hits == []

"""The spark engine carries out the strategy's program (issue 30): its
driver loop and task code, run on an in-process stand-in for Spark
(``fake_spark.py``; the real thing: test_spark*.py). Every strategy goes
through the ops it declares; which way it runs follows from declarations."""
import numpy as np
import pytest

import monsoon
from fake_spark import install
from monsoon.engines.spark.placement import in_tasks
from monsoon.strategies import STRATEGIES


@pytest.fixture
def fake_spark(monkeypatch):
    return install(monkeypatch)


def clipped_runs(engine, clip_norm, **extra):
    return monsoon.train("noisy-line", "clipped-sync", 2, engine=engine, dtype="float64",
                         epochs=1, lr=0.05, batch_size=32, noise=0.2, rows=1024, clip_norm=clip_norm,
                         evals=0, **extra)


def test_plugin_clipped_sync_gives_the_local_engines_loss(plugin, fake_spark):
    """Each worker's gradient is over exactly its part of the batch, though
    its rows live in both partitions: the clip (which bites) sees it."""
    local = clipped_runs("local", 0.05)
    spark = clipped_runs("spark", 0.05)
    unclipped = clipped_runs("local", 1e9)
    assert np.abs(local.params - unclipped.params).max() > 1e-2  # clipping happened
    assert spark.summary["final_loss"] == pytest.approx(local.summary["final_loss"], rel=1e-9)
    np.testing.assert_allclose(spark.params, local.params, rtol=1e-9, atol=1e-12)
    assert spark.summary["updates"] == local.summary["updates"]
    assert fake_spark.jobs > spark.summary["updates"]  # a gradient job per step


def test_sync_reduces_where_computed_and_equals_serial(fake_spark):
    kw = dict(lr=0.5, epochs=1, batch_size=64, seed=0, dtype="float64", evals=0)
    serial = monsoon.train("digits", strategy="serial", **kw)
    sync = monsoon.train("digits", strategy="sync", workers=3, engine="spark", **kw)
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)
    one = monsoon.train("digits", strategy="serial", engine="spark", **kw)
    np.testing.assert_array_equal(one.params, serial.params)


def test_local_sgd_takes_one_job_per_round(fake_spark):
    kw = dict(lr=0.5, steps=16, batch_size=64, seed=0, dtype="float64", evals=0)
    run = monsoon.train("digits", strategy="local-sgd", workers=2, engine="spark",
                        local_steps=4, **kw)
    assert run.summary["updates"] == 4
    assert fake_spark.jobs == 1 + 4  # the data's load, then one job per round
    assert run.summary["examples"] == 16 * 64


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

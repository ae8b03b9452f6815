"""EASGD's exchange keeps the centre finite on every engine that runs it.

A worker whose private copy turns non-finite (here worker 1's gradients,
finite, overflow its copy within a few steps of lr 0.5: ``faulty.py``'s
"overflow") would pull the centre to -inf at its next exchange and, through
the centre, every other worker. Its exchange is dropped instead, counted in
dropped_updates as a dropped gradient is, and the worker restarts from the
centre (``server/elastic.py``). The sim's virtual workers compute on one
problem, and Spark's tasks on the whole problem shipped to each (none is
told its worker): there every worker's copy overflows, every exchange is
dropped, and the centre stays where it started.

A worker whose copy overflowed only for a while (its first gradients)
recovers: restarted from the centre with fresh inner-rule state (momentum's
velocity, which overflowed with the copy, is not kept), its later exchanges
are applied, and the counts are exact: every exchange is applied or dropped.
Ray, Spark and torch runs are a few seconds of training."""
from pathlib import Path

import numpy as np
import pytest

import monsoon
from monsoon.problems import make_problem

from faulty import FaultyProblem

# tau 8: the copy is -inf by its fifth overflowing step, so each of worker 1's
# exchanges finds it non-finite
OPTIONS = dict(lr=0.5, easgd_tau=8, steps=128, seed=0, evals=4, progress=False,
               raise_on_divergence=False)


def overflowing(rank=1):
    return FaultyProblem(make_problem("exp"), "overflow", rank=rank, after=0)


def check(run, healthy: bool = True):
    s = run.summary
    assert np.isfinite(run.params).all()
    assert s["dropped_updates"] > 0, s
    start = make_problem("exp")
    if healthy:  # worker 0's exchanges were applied, and the centre trained
        assert s["updates"] > 0 and np.isfinite(s["final_loss"]), s
        assert s["final_loss"] < start.loss(start.initial_params(0))
    else:  # every worker's copy overflowed: no exchange was applied
        assert s["updates"] == 0, s
        np.testing.assert_array_equal(run.params, start.initial_params(0))


@pytest.mark.parametrize("compress", [None, "topk:0.5"])
def test_a_worker_gone_non_finite_never_reaches_the_centre_local(compress):
    check(monsoon.train(overflowing(), "easgd", 2, compress=compress, **OPTIONS))


@pytest.mark.parametrize("compress", [None, "topk:0.5"])
def test_a_worker_gone_non_finite_never_reaches_the_centre_sim(compress):
    run = monsoon.train(overflowing(None), "easgd", 2, engine="sim", compress=compress,
                        **OPTIONS)
    check(run, healthy=False)


@pytest.mark.ray
@pytest.mark.usefixtures("local_ray")
def test_a_worker_gone_non_finite_never_reaches_the_centre_ray():
    pytest.importorskip("ray")
    check(monsoon.train(overflowing(), "easgd", 2, engine="ray", shards=1, **OPTIONS))


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    from spark_env import spark_session

    with spark_session("local[2]") as session:
        session.sparkContext.addPyFile(str(Path(__file__).parent / "faulty.py"))
        yield session


@pytest.mark.spark
def test_a_worker_gone_non_finite_never_reaches_the_centre_spark(spark):
    check(monsoon.train(overflowing(None), "easgd", 2, engine="spark", **OPTIONS),
          healthy=False)


@pytest.mark.torchrun
@pytest.mark.parametrize("compress", [None, "topk:0.5"])
def test_a_worker_gone_non_finite_never_reaches_the_centre_torch(compress):
    pytest.importorskip("torch")
    check(monsoon.train(overflowing(), "easgd", 2, engine="torch", timeout=30,
                        compress=compress, **OPTIONS))


# Recovery: worker 1's first 6 gradients overflow its copy (by its fifth step at
# lr 0.5; momentum's velocity, at lr 0.05, by its third), the rest are healthy.
# Its first exchange is dropped, it restarts from the centre with fresh inner-rule
# state, and each of its later exchanges is applied: 128 steps of tau 8 are 16
# exchanges, 15 applied and 1 dropped. Kept, an overflowed velocity would make
# every later copy non-finite, every later exchange dropped.
RULES = {"sgd": dict(rule="sgd", lr=0.5), "momentum": dict(rule="momentum", lr=0.05)}
EXCHANGES = OPTIONS["steps"] // OPTIONS["easgd_tau"]


def recovering(rank=1, until=6):
    return FaultyProblem(make_problem("exp"), "overflow", rank=rank, after=0, until=until)


def check_recovered(run, dropped: int):
    s = run.summary
    assert np.isfinite(run.params).all()
    assert s["dropped_updates"] == dropped, s
    assert s["updates"] + s["dropped_updates"] == EXCHANGES, s
    start = make_problem("exp")
    assert s["final_loss"] < start.loss(start.initial_params(0)), s


def train_recovering(problem, rule, engine, **options):
    return monsoon.train(problem, "easgd", 2, engine=engine, **{**OPTIONS, **RULES[rule],
                                                                 **options})


@pytest.mark.parametrize("compress", [None, "topk:0.5"])
@pytest.mark.parametrize("rule", RULES)
def test_a_worker_restarted_from_the_centre_recovers_local(rule, compress):
    check_recovered(train_recovering(recovering(), rule, "local", compress=compress), 1)


@pytest.mark.parametrize("compress", [None, "topk:0.5"])
@pytest.mark.parametrize("rule", RULES)
def test_a_worker_restarted_from_the_centre_recovers_sim(rule, compress):
    # the sim's two workers share one problem and take turns: its first 16
    # gradients are each worker's first 8, and each drops its first exchange
    check_recovered(train_recovering(recovering(None, 16), rule, "sim", compress=compress), 2)


@pytest.mark.ray
@pytest.mark.usefixtures("local_ray")
@pytest.mark.parametrize("compress", [None, "topk:0.5"])
@pytest.mark.parametrize("rule", RULES)
def test_a_worker_restarted_from_the_centre_recovers_ray(rule, compress):
    pytest.importorskip("ray")
    check_recovered(train_recovering(recovering(), rule, "ray", shards=1, compress=compress), 1)


@pytest.mark.spark
@pytest.mark.parametrize("compress", [None, "topk:0.5"])
@pytest.mark.parametrize("rule", RULES)
def test_a_worker_restarted_from_the_centre_recovers_spark(spark, rule, compress):
    # each worker's task counts its own gradients: each drops its first exchange
    check_recovered(train_recovering(recovering(None), rule, "spark", compress=compress), 2)


@pytest.mark.spark
def test_a_dropped_exchange_restarts_from_the_current_centre_spark(spark, monkeypatch):
    """Spark: the worker restarts from the centre as it is when its dropped
    exchange is applied, not as its segment read it at launch (here moved
    meanwhile, as another worker's exchange would move it); the drop is
    counted once, by the server's core (none in the tally's ``dropped``,
    a report's dropped gradients)."""
    from monsoon.engines.spark.server import DriverServer

    apply, restarts = DriverServer._apply, []

    def moved(self, k, res, *args, **kwargs):
        skipped = res["op"] == "elastic" and res.get("skipped")
        if skipped:
            with self.cond:
                self.w += 1.0
        apply(self, k, res, *args, **kwargs)
        if skipped:  # one worker: no other exchange moves the centre meanwhile
            restarts.append((np.array_equal(self.own[k], self.w), self.tally.dropped))

    monkeypatch.setattr(DriverServer, "_apply", moved)
    run = monsoon.train(recovering(None), "easgd", 1, engine="spark", **OPTIONS)
    assert restarts == [(True, 0)], restarts
    assert run.summary["dropped_updates"] == 1 and np.isfinite(run.params).all(), run.summary


@pytest.mark.torchrun
@pytest.mark.parametrize("compress", [None, "topk:0.5"])
@pytest.mark.parametrize("rule", RULES)
def test_a_worker_restarted_from_the_centre_recovers_torch(rule, compress):
    pytest.importorskip("torch")
    check_recovered(train_recovering(recovering(), rule, "torch", timeout=30,
                                     compress=compress), 1)

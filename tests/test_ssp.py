"""SSP (strategies/ssp.py): the bound holds on every engine that runs it,
S = 0 is bulk-synchronous in clocks, S = infinity is async, and a dead
worker does not freeze the run."""
import threading
import time

import numpy as np
import pytest

import monsoon
from monsoon.problems import make_problem
from monsoon.problems.linear import DenseLinear, synthetic
from monsoon.strategies import STRATEGIES
from monsoon.strategies.downpour import Downpour
from monsoon.strategies.ops import Clock, Fetch, Gradient
from monsoon.strategies.ssp import SSP

from faulty import FaultyProblem

STRAGGLING = dict(sim_compute_sigma=0.5, sim_straggler_p=0.1, sim_straggler_factor=8.0)


def _ops(strategy, workers=3, steps=20):
    """The op kinds worker 1's program yields, driven with dummy replies."""
    from monsoon.strategies import Budget, WorkerJob

    job = WorkerJob(1, workers, 300, 8, 0, Budget(steps=steps))
    program, reply, kinds = strategy.program(job), None, []
    grad = np.ones(3)
    try:
        while True:
            op = program.send(reply)
            kinds.append(type(op).__name__)
            reply = {Fetch: np.zeros(1, dtype=np.int64), Gradient: (0.0, grad),
                     Clock: 0}.get(type(op))
    except StopIteration:
        return kinds


@pytest.mark.parametrize("n_fetch, n_push", [(1, 1), (3, 2), (2, 4)])
def test_a_bound_never_reached_yields_asyncs_ops_plus_ticks(n_fetch, n_push):
    ssp = [k for k in _ops(SSP(10 ** 9, n_fetch, n_push, local_lr=0.1)) if k != "Clock"]
    assert ssp == _ops(Downpour(n_fetch, n_push, local_lr=0.1))
    kinds = _ops(SSP(10 ** 9, n_fetch, n_push))
    assert kinds.count("Clock") == kinds.count("Gradient") // n_push > 0


def test_a_tight_bound_refetches_when_the_copy_held_is_too_old():
    # n_fetch 4, bound 0: every clock must start from a fresh read (the
    # dummy driver's floor stays 0, so every clock after the first refetches)
    kinds = _ops(SSP(0, n_fetch=4, n_push=1), steps=60)
    assert kinds.count("Fetch") == kinds.count("Clock") == kinds.count("Gradient") == 20
    kinds = _ops(SSP(10 ** 9, n_fetch=4, n_push=1), steps=60)
    assert kinds.count("Fetch") == 5


def test_the_bound_is_checked_and_described():
    with pytest.raises(Exception, match="staleness bound"):
        SSP(-1)
    assert STRATEGIES.get("ssp") is SSP
    assert SSP(2).describe()["staleness_bound"] == 2


def _run(engine, S, workers=4, **opts):
    extra = STRAGGLING if engine == "sim" else {"timeout": 30}
    return monsoon.train("exp", "ssp", workers, engine=engine, epochs=3, seed=1,
                         staleness_bound=S, evals=0, progress=False, **{**extra, **opts}).summary


def _check_clocks(s, S, workers):
    counts = {int(k): v for k, v in s["clock_staleness_counts"].items()}
    assert max(counts) <= S and min(counts) >= 0
    assert sum(counts.values()) == s["updates"]  # one push per gradient (n_push = 1)
    assert s["clock_staleness"]["max"] == max(counts)
    assert s["staleness_bound"] == S
    assert len(s["clock_wait_s"]) == workers and all(w >= 0 for w in s["clock_wait_s"])
    assert all(c > 0 for c in s["clocks"])


# processes start slowly: one bound there (S = 0 runs in the fault test below)
CASES = [(e, b, S) for e, b in [("sim", None), ("local", "threads")] for S in (0, 1, 3)] + [
    ("local", "processes", 1)]


@pytest.mark.parametrize("engine, backend, S", CASES)
def test_no_gradient_is_more_clocks_stale_than_the_bound(engine, backend, S):
    opts = {"backend": backend} if backend else {}
    workers = 3 if backend == "processes" else 4
    s = _run(engine, S, workers=workers, **opts)
    _check_clocks(s, S, workers)
    assert s["status"] == "finished" and np.isfinite(s["final_loss"])
    if S == 0:
        assert set(s["clock_staleness_counts"]) == {0}


def test_the_sim_reaches_the_bound_and_waits_only_when_it_binds():
    # with stragglers a loose bound is used up to the hilt; a tight one waits more
    tight, loose = _run("sim", 0, workers=8), _run("sim", 4, workers=8)
    assert loose["clock_staleness"]["max"] == 4
    assert sum(tight["clock_wait_s"]) > sum(loose["clock_wait_s"]) > 0
    assert tight["wall_time_s"] > loose["wall_time_s"]
    free = _run("sim", 10 ** 6, workers=8)
    assert sum(free["clock_wait_s"]) == 0 and free["clock_staleness"]["max"] > 4


@pytest.mark.parametrize("rule", ["sgd", "adarevision", "dcasgd"])
@pytest.mark.parametrize("n_fetch, n_push", [(1, 1), (2, 3)])
def test_a_bound_beyond_the_run_is_async_bit_for_bit_on_the_sim(rule, n_fetch, n_push):
    opts = dict(engine="sim", epochs=3, seed=4, rule=rule, n_fetch=n_fetch, n_push=n_push,
                evals=0, progress=False, **STRAGGLING)
    ssp = monsoon.train("exp", "ssp", 6, staleness_bound=10 ** 6, **opts)
    ref = monsoon.train("exp", "async", 6, **opts)
    assert np.array_equal(ssp.params, ref.params)
    assert ssp.summary["wall_time_s"] == ref.summary["wall_time_s"]
    assert ssp.summary["staleness_counts"] == ref.summary["staleness_counts"]


def test_staleness_lr_composes_with_the_bound():
    s = _run("sim", 1, staleness_lr=True)
    assert s["staleness_lr"] is True and s["clock_staleness"]["max"] <= 1


@pytest.mark.parametrize("engine", ["local", "sim"])
@pytest.mark.parametrize("strategy", ["async", "ssp"])
@pytest.mark.parametrize("shards", [1, 3])
def test_the_staleness_histogram_counts_each_update_once_on_any_shards(engine, strategy,
                                                                        shards):
    """Issue: with several shards each shard counted its slice of a push
    (ssp, 4 workers, digits: 480 updates, 1920 counts), where sync and
    hogwild count each update once. A push now counts once, at its stalest
    slice's staleness, so staleness_counts sums to the updates and the
    staleness figures are the histogram's."""
    from collections import Counter

    from monsoon.api import staleness_stats

    extra = {"backend": "threads"} if engine == "local" else {}
    if strategy == "ssp":
        extra["staleness_bound"] = 1
    s = monsoon.train("logistic", strategy, 3, engine=engine, shards=shards, steps=60, evals=0,
                      seed=0, progress=False, **extra).summary
    counts = Counter({int(k): v for k, v in s["staleness_counts"].items()})
    assert s["shards"] == shards and s["dropped_updates"] == 0
    assert sum(counts.values()) == s["updates"] == 60
    assert s["staleness"] == staleness_stats(counts)


@pytest.mark.parametrize("backend, mode", [("processes", "exit"), ("threads", "raise")])
def test_a_dead_worker_stops_counting_toward_the_bound_on_local(backend, mode):
    # bound 0: a barrier every clock; worker 1 dies early and the others go on
    problem = FaultyProblem(make_problem("exp"), mode, rank=1, after=3)
    run = monsoon.train(problem, "ssp", 3, backend=backend, epochs=6, seed=0, timeout=20,
                        staleness_bound=0, evals=0, progress=False)
    s = run.summary
    assert [f["worker"] for f in s["failed_workers"]] == [1]
    assert s["status"] == "finished"
    assert s["examples"] > 0.6 * 6 * 256   # the two live workers did all their share
    assert set(s["clock_staleness_counts"]) == {0}


# -- ray -------------------------------------------------------------------------

# On Ray: the NumPy problem (the actors import no torch) and one shard; the
# claims are the clock server's (S = 0: a barrier every clock; S = 2: slack).
RAY = dict(engine="ray", shards=1, batch_size=16, seed=1, evals=0, progress=False)


@pytest.mark.ray
@pytest.mark.parametrize("S", [0, 2])
def test_no_gradient_is_more_clocks_stale_than_the_bound_on_ray(local_ray, S):
    # two workers (an actor fewer than three): a bound holds between two as between more;
    # the fault test below runs three
    s = monsoon.train("logistic", "ssp", 2, steps=48, staleness_bound=S, timeout=30,
                      **RAY).summary
    _check_clocks(s, S, 2)
    assert s["status"] == "finished" and np.isfinite(s["final_loss"])
    if S == 0:
        assert set(s["clock_staleness_counts"]) == {0}


@pytest.mark.ray
def test_a_killed_worker_stops_counting_toward_the_bound_on_ray(local_ray):
    ray, box = local_ray, {}

    def train():
        try:
            box["result"] = monsoon.train("logistic", "ssp", 3, steps=640, run_name="killssp",
                                          staleness_bound=0, timeout=20,
                                          **{**RAY, "seed": 0})
        except Exception as exc:  # noqa: BLE001 - the test reports it
            box["error"] = exc

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    deadline = time.monotonic() + 180   # actors start slowly on a busy 2-core machine
    while time.monotonic() < deadline:
        try:
            actor = ray.get_actor("monsoon-killssp-worker-1")
            ray.get(actor.ask.remote("ready"), timeout=120)
            break
        except ValueError:
            time.sleep(0.2)
    while time.monotonic() < deadline and ray.get(actor.ask.remote("progress"))["examples"] < 512:
        time.sleep(0.1)
    ray.kill(actor)
    thread.join(180)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    s = box["result"].summary
    assert [f["worker"] for f in s["failed_workers"]] == [1]
    assert s["status"] == "finished"
    assert set(s["clock_staleness_counts"]) == {0}
    assert s["examples"] > 0.6 * 640 * 16   # the two live workers did all their share


# -- spark: the driver gates the next job of a partition that is ahead ------------

@pytest.fixture(scope="module")
def spark():
    from spark_env import spark_session

    with spark_session("local[2]") as session:
        yield session


class _Partition1Fails(DenseLinear):
    def gradient(self, w, indices, out=None, accumulate=False):
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:
            raise RuntimeError("partition 1 is lost")
        return super().gradient(w, indices, out, accumulate)


def _spark_run(S, problem=None, steps=60):
    problem = problem or synthetic("logistic", n=1200, features=10, dtype="float64")
    return monsoon.train(problem, "ssp", 3, engine="spark", steps=steps, batch_size=16,
                         n_fetch=2, n_push=2, staleness_bound=S, lr=0.5, seed=0,
                         dtype="float64", evals=0, progress=False, timeout=30).summary


@pytest.mark.spark
@pytest.mark.parametrize("S", [0, 1])
def test_no_gradient_is_more_clocks_stale_than_the_bound_on_spark(spark, S):
    s = _spark_run(S)
    counts = {int(k): v for k, v in s["clock_staleness_counts"].items()}
    assert max(counts) <= S and min(counts) >= 0
    assert sum(counts.values()) == 60   # every gradient, a clock of 2 steps each
    assert s["clocks"] == [10, 10, 10] and s["updates"] == 30
    assert s["staleness_bound"] == S and len(s["clock_wait_s"]) == 3
    assert s["status"] == "finished" and np.isfinite(s["final_loss"])
    if S == 0:
        assert set(counts) == {0}


@pytest.mark.spark
def test_the_last_short_period_counts_its_gradients_on_spark(spark):
    """21 steps a worker, pushes every 2: its last period has one step.
    clock_staleness_counts (one count a gradient, docs/ssp.md) summed to 60,
    the last periods' gradients left out (no clock ticks after them); the
    local engine and the sim count all 63."""
    s = _spark_run(1, steps=63)
    counts = {int(k): v for k, v in s["clock_staleness_counts"].items()}
    assert sum(counts.values()) == 63 and max(counts) <= 1
    assert s["clocks"] == [10, 10, 10] and s["updates"] == 33


@pytest.mark.spark
def test_a_lost_partition_stops_counting_toward_the_bound_on_spark(spark):
    problem = synthetic("logistic", n=1200, features=10, dtype="float64")
    problem.__class__ = _Partition1Fails
    s = _spark_run(0, problem)
    assert [f["worker"] for f in s["failed_workers"]] == [1]
    assert "partition 1 is lost" in s["failed_workers"][0]["error"]
    assert s["status"] == "finished"
    assert s["clocks"][0] == s["clocks"][2] == 10 and s["updates"] == 20  # the others' share
    assert set(s["clock_staleness_counts"]) == {0}


@pytest.mark.png
def test_compare_writes_the_staleness_histograms_into_the_report(tmp_path):
    import csv

    monsoon.compare("exp", "sync,ssp,async", workers=4, out=tmp_path, engine="sim", epochs=2,
                    staleness_bound=1, evals=4, **STRAGGLING)
    report = (tmp_path / "report.md").read_text()
    assert "## Staleness" in report and "![staleness histograms](staleness.png)" in report
    assert (tmp_path / "staleness.png").read_bytes()[:4] == b"\x89PNG"
    with open(tmp_path / "comparison.csv") as f:
        rows = {r["strategy"]: r for r in csv.DictReader(f)}
    assert rows["ssp"]["staleness_bound"] == "1" and rows["async"]["staleness_bound"] == ""
    assert int(rows["ssp"]["clock_staleness_max"]) <= 1
    assert float(rows["ssp"]["clock_wait_s_total"]) > 0
    ssp_line = next(line for line in report.splitlines() if line.startswith("| ssp | 1 |"))
    assert ssp_line.count("/") >= 7   # the distributions in updates and in clocks, the waits


def test_a_bound_wait_past_its_timeout_names_the_workers_that_held_it_back():
    from monsoon.server.clocks import ClockTable

    table = ClockTable(4)
    for rank in (0, 0, 0, 1, 1, 1, 3):  # clocks finished: 3, 3, 0, 1
        table.tick(rank)
    table.retire(2)  # ended: it no longer holds anyone back
    assert not table.allows(3, 1)  # clock 3 at bound 1 needs every live worker past clock 1
    message = table.too_long(0, 3, 1, 30.0)
    assert message.startswith("worker 0 waited 30 s for workers [3] to finish clock 1 ")
    assert "(staleness bound 1); raise --timeout" in message

"""The engine contract (engines/base.py): an engine takes a strategy by what
it can carry out, never by the strategy's name, and a third-party strategy
is treated like a built-in one.

``TABLE`` is every built-in strategy against every built-in engine: "run",
or the op or need whose lack the engine's one-line refusal names. Adding a
strategy or an engine adds a row or a column here, nothing else.
"""
import os
import sys

import numpy as np
import pytest

import monsoon
from monsoon.config import resolve
from monsoon.engines import ENGINES
from monsoon.errors import ConfigError
from monsoon.strategies import STRATEGIES

TABLE = """
strategy   local  sim  ray    spark          torch
serial     run    run  Apply  run            Apply
sync       run    run  run    run            run
async      run    run  run    run            Push
hogwild    run    run  Apply  shared-memory  Apply
local-sgd  run    run  run    run            run
easgd      run    run  run    run            run
ssp        run    run  run    run            Push
pipeline   run    run  run    stages         stages
"""
ROWS = [line.split() for line in TABLE.strip().splitlines()]
ENGINE_NAMES = ROWS[0][1:]
CELLS = {(row[0], engine): cell for row in ROWS[1:] for engine, cell in zip(ENGINE_NAMES, row[1:])}
# What a refusal's line must say, for each op or need in the table.
SAYS = {"Apply": "cannot carry out Apply", "Push": "cannot carry out Push",
        "shared-memory": "has no shared memory", "stages": "has no pipeline stages"}
WORKERS = 2
PROBLEM = {"pipeline": "digits"}   # pipeline cuts a torch Sequential into stages
MARKS = {"ray": pytest.mark.ray, "spark": pytest.mark.spark, "torch": pytest.mark.torchrun}
# Ray runs on one parameter-server shard: an actor (a process) fewer a run; the
# claims here are the strategy's, not the server's split
RAY_ONE_SHARD = {"ray": {"shards": 1}}


def test_the_table_covers_every_built_in_strategy_and_engine():
    assert [row[0] for row in ROWS[1:]] == list(STRATEGIES.builtins)
    assert ENGINE_NAMES == list(ENGINES.builtins)


@pytest.mark.parametrize("strategy, engine", sorted(CELLS))
def test_each_pair_is_taken_or_refused_in_one_line(strategy, engine):
    """Checked when the run is resolved, before any worker (or server) starts."""
    workers = 1 if STRATEGIES.get(strategy).single_worker else WORKERS
    given = {"engine": engine, "steps": 2, "evals": 0}
    cell = CELLS[strategy, engine]
    if cell == "run":
        resolved = resolve(PROBLEM.get(strategy, "exp"), strategy, workers, given)
        assert resolved.engine.name == engine
        return
    with pytest.raises(ConfigError) as caught:
        resolve(PROBLEM.get(strategy, "exp"), strategy, workers, given)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"the {engine} engine ")
    assert SAYS[cell] in line and strategy in line
    # ... and it names the engines that do run the strategy, from the same table
    others = [e for e in ENGINE_NAMES if CELLS[strategy, e] == "run"]
    assert line.endswith(f"engines that run {strategy}: {', '.join(others)}")


def _runs(engines):
    return [pytest.param(s, e, marks=MARKS[e]) if e in MARKS else (s, e)
            for (s, e), cell in sorted(CELLS.items()) if cell == "run" and e in engines]


@pytest.mark.parametrize("strategy, engine", _runs({"local", "sim"}))
def test_each_pair_that_is_taken_trains(strategy, engine):
    _train_and_check(strategy, engine)


@pytest.fixture(scope="module")
def spark_with_plugin(plugin_site, tmp_path_factory):
    """The Spark session the spark modules share (``spark_env``), with the
    plug-in shipped to its executors as a zip of its site (``addPyFile``):
    the plug-in's tests run on it, and this module starts no session of its
    own (a start, with the executors' Python importing torch, costs seconds)."""
    import shutil

    from conftest import _reload
    from spark_env import spark_session

    zipped = shutil.make_archive(str(tmp_path_factory.mktemp("plugin-zip") / "site"), "zip",
                                 root_dir=plugin_site)
    with spark_session("local[2]") as spark:
        before = list(sys.path)
        spark.sparkContext.addPyFile(zipped)
        # addPyFile puts the zip on this process's path too: the plug-in's
        # components would then stay registered here for every later test
        # (a test that needs them here asks for ``plugin``)
        sys.path[:] = [p for p in sys.path if p in before]
        _reload()
        yield spark


@pytest.mark.slow
@pytest.mark.parametrize("strategy, engine", _runs({"ray", "spark", "torch"}))
def test_each_pair_that_is_taken_trains_on_the_cluster_engines(strategy, engine, request):
    if engine == "ray":
        request.getfixturevalue("local_ray")
    if engine == "spark":
        request.getfixturevalue("spark_with_plugin")
    # a NumPy problem: the cluster's worker processes need not import torch
    _train_and_check(strategy, engine, problem="logistic")


def _train_and_check(strategy, engine, problem="exp"):
    workers = 1 if STRATEGIES.get(strategy).single_worker else WORKERS
    # the pipeline's stages have no server to split: ray refuses its --shards, as local does
    shards = {} if strategy == "pipeline" else RAY_ONE_SHARD.get(engine, {})
    extra = {} if engine == "sim" else {"timeout": 60, **shards}
    run = monsoon.train(PROBLEM.get(strategy, problem), strategy, workers, engine=engine,
                        steps=8, evals=0, progress=False, **extra)
    assert run.summary["status"] == "finished" and run.summary["engine"] == engine
    assert run.summary["updates"] > 0 and np.isfinite(run.summary["final_loss"])


# -- a third-party strategy: the example plug-in's clipped-sync ------------------------

CLIPPED = dict(noise=0.2, clip_norm=1e-3, dtype="float64", steps=40, lr=0.05, seed=1,
               evals=0, progress=False)


@pytest.fixture
def plugin_everywhere(plugin, monkeypatch):
    """The plug-in importable in every worker process the engines start."""
    paths = [str(plugin), os.path.dirname(os.path.dirname(monsoon.__file__))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]))
    return plugin


@pytest.fixture(scope="module")
def clipped_on_local(plugin_site):
    import sys

    from conftest import _reload

    sys.path.insert(0, str(plugin_site))
    _reload()
    try:
        unclipped = monsoon.train("noisy-line", "sync", 2, backend="threads",
                                  **{k: v for k, v in CLIPPED.items() if k != "clip_norm"})
        clipped = monsoon.train("noisy-line", "clipped-sync", 2, backend="threads", **CLIPPED)
    finally:
        sys.path.remove(str(plugin_site))
        sys.modules.pop("monsoon_example_plugin", None)
        _reload()
    # the clip bites: a plain sync run ends elsewhere
    assert abs(clipped.summary["final_loss"] - unclipped.summary["final_loss"]) > 1e-3
    return clipped


def _with_plugin(engine, request):
    """The engine's cluster, where it has one, with the plug-in on its
    workers' path: a context to run in."""
    import contextlib

    if engine == "ray":  # its workers' path has the plug-in (conftest.py)
        request.getfixturevalue("local_ray")
    if engine == "spark":
        request.getfixturevalue("spark_with_plugin")
    return contextlib.nullcontext()


@pytest.mark.parametrize("engine", [
    "sim",
    pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow]),
    pytest.param("torch", marks=[pytest.mark.torchrun, pytest.mark.slow]),
    pytest.param("spark", marks=[pytest.mark.spark, pytest.mark.slow]),
])
def test_the_plug_in_strategy_trains_on_every_engine_to_the_same_loss(
        engine, clipped_on_local, plugin_everywhere, request):
    with _with_plugin(engine, request):
        run = monsoon.train("noisy-line", "clipped-sync", 2, engine=engine,
                            **RAY_ONE_SHARD.get(engine, {}), **CLIPPED)
    assert run.summary["engine"] == engine and run.summary["clip_norm"] == CLIPPED["clip_norm"]
    assert run.summary["final_loss"] == pytest.approx(clipped_on_local.summary["final_loss"],
                                                      rel=1e-9)
    np.testing.assert_allclose(run.params, clipped_on_local.params, rtol=1e-9, atol=1e-12)


# -- a third-party compressor: the example plug-in's fp16 ---------------------------

HALF = dict(dtype="float64", steps=24, lr=0.05, seed=1, evals=0, progress=False)


@pytest.mark.parametrize("engine", [
    "local", "sim",
    pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow]),
    pytest.param("torch", marks=[pytest.mark.torchrun, pytest.mark.slow]),
    pytest.param("spark", marks=[pytest.mark.spark, pytest.mark.slow]),
])
def test_the_plug_in_compressor_runs_on_every_engine_that_compresses(
        engine, plugin_everywhere, request):
    """Every message goes through the plug-in's encoding (2 bytes a float64
    coordinate: a ratio of exactly 4), and the run trains."""
    extra = {"sim": {}, "local": {"backend": "threads"}}.get(engine, {"timeout": 60})
    extra.update(RAY_ONE_SHARD.get(engine, {}))
    with _with_plugin(engine, request):
        run = monsoon.train("linear", "local-sgd", 2, engine=engine, compress="fp16", **extra,
                            **HALF)
    summary = run.summary
    assert summary["engine"] == engine and summary["compress"] == "fp16"
    assert summary["compression_ratio"] == 4.0 and summary["bytes_sent"] > 0
    assert summary["updates"] > 0 and summary["final_loss"] < run.history[0]["loss"] / 2
    with pytest.raises(ConfigError, match="fp16 takes no argument"):
        monsoon.train("linear", "local-sgd", 2, compress="fp16:2", **HALF)


# -- an epoch's short last batch ------------------------------------------------------

TAIL = dict(epochs=2, batch_size=100, dtype="float64", seed=1, lr=0.05, evals=0,
            progress=False)


def _sgd_by_hand(weigh_tail: bool) -> np.ndarray:
    """Plain SGD on exp's 256 rows in batches of 100, 100 and 56, the 56-row
    batch's mean gradient times 56/100 (``ops.Gradient.weight``) or not."""
    from monsoon.problems import make_problem
    from monsoon.strategies.batches import epoch_permutation

    problem = make_problem("exp", "float64")
    w = problem.initial_params(TAIL["seed"]).copy()
    n, size = problem.n_examples, TAIL["batch_size"]
    for epoch in range(TAIL["epochs"]):
        order = epoch_permutation(n, TAIL["seed"], epoch)
        for start in range(0, n, size):
            batch = order[start:start + size]
            _, grad = problem.gradient(w, batch)
            w = w - TAIL["lr"] * (len(batch) / size if weigh_tail else 1.0) * grad
    return w


@pytest.mark.parametrize("strategy, workers, engine", [
    ("serial", 1, "local"), ("sync", 3, "local"), ("async", 1, "local"), ("sync", 2, "sim"),
    ("async", 1, "sim"),
    # Ray's worker weighs in the one ``gradient`` both strategies call; an async
    # worker's push there runs in the background while it fetches, so one
    # async worker is not serial to the bit on Ray, and only sync is compared
    pytest.param("sync", 2, "ray", marks=[pytest.mark.ray, pytest.mark.slow]),
    pytest.param("sync", 2, "torch", marks=[pytest.mark.torchrun, pytest.mark.slow]),
    pytest.param("sync", 2, "spark", marks=[pytest.mark.spark, pytest.mark.slow]),
    pytest.param("async", 1, "spark", marks=[pytest.mark.spark, pytest.mark.slow]),
])
def test_every_engine_weighs_a_short_last_batch_by_its_size(strategy, workers, engine,
                                                            request):
    """Each example of an epoch weighs the same: the 56-row batch that ends
    each epoch steps 0.56 times its mean gradient, on every engine."""
    weighed, unweighed = _sgd_by_hand(True), _sgd_by_hand(False)
    assert np.abs(weighed - unweighed).max() > 1e-3  # the weight shows in the result
    extra = {} if engine in ("local", "sim") else {"timeout": 60, **RAY_ONE_SHARD.get(engine, {})}
    with _with_plugin(engine, request):
        run = monsoon.train("exp", strategy, workers, engine=engine, **extra, **TAIL)
    assert run.summary["engine"] == engine
    np.testing.assert_allclose(run.params, weighed, rtol=1e-9, atol=1e-12)
    assert run.summary["examples"] == TAIL["epochs"] * 256  # no example added or dropped


# -- the counts mean the same on every engine --------------------------------------------

COUNTS = ("updates", "local_updates", "examples", "staleness_counts")
CLUSTER = {"timeout": 60, "shards": 1}  # Ray on one shard, as above; Spark takes no shards


def _cluster(engine) -> dict:
    return {} if engine in ("local", "sim") else \
        {k: v for k, v in CLUSTER.items() if k != "shards" or engine == "ray"}


@pytest.mark.parametrize("engine", [
    "sim",
    pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow]),
    pytest.param("spark", marks=[pytest.mark.spark, pytest.mark.slow]),
])
def test_a_local_sgd_run_counts_what_the_local_engines_counts(engine, request):
    """An update is an averaging round (docs/strategies.md): 40 steps of 8
    local steps are 5 rounds, each worker's local step on every step counted
    in local_updates, on every engine. Spark left to size its round (no
    local_steps: docs/engines/spark.md) runs another run, whose summary
    names the round it chose, and counts that run's rounds: 40 steps of 5
    are 8, not the local engine's 5 rounds of its default 8."""
    kw = dict(steps=40, evals=0, progress=False, seed=0)
    local = monsoon.train("logistic", "local-sgd", 2, local_steps=8, **kw).summary
    assert local["updates"] == 5 and local["local_updates"] == 2 * 40
    with _with_plugin(engine, request):
        run = monsoon.train("logistic", "local-sgd", 2, engine=engine, local_steps=8,
                            **_cluster(engine), **kw).summary
        assert {k: run[k] for k in COUNTS} == {k: local[k] for k in COUNTS}
        if engine == "spark":
            sized = monsoon.train("logistic", "local-sgd", 2, engine=engine, **_cluster(engine),
                                  **kw).summary
            assert sized["local_steps_chosen"] == sized["local_steps"]
            assert sized["updates"] == -(-40 // sized["local_steps"])
            assert sized["local_updates"] == local["local_updates"]


@pytest.mark.parametrize("engine", [
    "local", "sim",
    pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow]),
    pytest.param("spark", marks=[pytest.mark.spark, pytest.mark.slow]),
])
def test_an_easgd_exchange_counts_the_others_exchanges_since_its_copy_met_the_centre(
        engine, request):
    """An exchange is an update, at async's staleness (server/elastic.py):
    the other workers' exchanges since this worker's copy last met the
    centre (its last exchange, or its start), at its stalest shard's. One
    count an exchange, so the histogram sums to updates. Two workers, 50
    exchanges each; what holds however they interleave: an exchange is stale
    by at most the other's 50 exchanges; on a shard, a worker's staleness
    adds up to at most the other's 50 exchanges there, and counted at the
    stalest shard's, to at most 50 a shard (an exchange of the other's that
    overtakes one of its exchanges between shards counts in two of them). No
    lower bound holds: a worker that starts after the other's last exchange
    is never stale (the local engine's counts under such schedules:
    ``test_a_local_exchange_counts_the_others_exchanges_turn_by_turn``).
    The sim's workers take turns: every exchange but the first follows one
    of the other's. One worker is never stale. (Spark counted every exchange
    at 0; local, sim and Ray kept no histogram.)"""
    kw = dict(easgd_tau=4, steps=400, evals=0, progress=False, seed=0)
    with _with_plugin(engine, request):
        s = monsoon.train("logistic", "easgd", 2, engine=engine, **_cluster(engine),
                          **kw).summary
    counts = {int(k): n for k, n in s["staleness_counts"].items()}
    assert s["updates"] == 100 == sum(counts.values()), counts
    assert max(counts) <= 50, counts
    assert sum(tau * n for tau, n in counts.items()) <= 2 * 50 * s["shards"], (counts, s["shards"])
    if engine == "sim":
        assert counts == {0: 1, 1: 99}
    if engine in ("local", "sim"):
        one = monsoon.train("logistic", "easgd", 1, engine=engine, **kw).summary
        assert one["staleness_counts"] == {0: one["updates"]}


def _local_exchanges(turns: str):
    """Two local-engine workers of EASGD on a store of 2 shards, driven in
    one thread through ``turns``, in order: "f0" rank 0 fetches (its start),
    "e1" rank 1 exchanges, "e0+5" rank 0 exchanges and is overtaken between
    its shards by 5 exchanges of rank 1. The staleness counts of rank 0 and
    rank 1."""
    from monsoon.engines.local.runtime import WorkerRuntime
    from monsoon.engines.local.store import ParameterStore
    from monsoon.problems import make_problem
    from monsoon.rules import make_rule
    from monsoon.strategies.easgd import EASGD
    from monsoon.strategies.ops import Elastic, Fetch

    problem = make_problem("logistic", dtype="float64")
    store = ParameterStore(np.zeros(problem.n_params), make_rule("sgd", 1.0), 2, 2,
                           sync_slots=False, backend="threads")
    try:
        strategy = EASGD(make_rule("sgd", 0.1), alpha=0.45)
        workers = [WorkerRuntime(r, 2, store, problem, make_rule("sgd", 1.0), strategy,
                                 timeout=10, live=False) for r in (0, 1)]
        holding, overtaking = store.holding, {}  # rank: the other's exchanges to let by

        def overtaken(s, rank):  # they land before the overtaken exchange takes shard 1
            for _ in range(overtaking.pop(rank) if s == 1 and rank in overtaking else 0):
                workers[1 - rank].elastic(Elastic(0.45))
            return holding(s, rank)

        store.holding = overtaken
        for op in turns.split():
            worker = workers[int(op[1])]
            if op[0] == "f":
                worker.fetch(Fetch())
                continue
            if "+" in op:
                overtaking[worker.rank] = int(op.split("+")[1])
            worker.elastic(Elastic(0.45))
        return [dict(w.staleness) for w in workers]
    finally:
        store.close()


def test_a_local_exchange_counts_the_others_exchanges_turn_by_turn():
    """The local engine's exchanges counted under schedules a run cannot
    force (``test_an_easgd_exchange_counts_...``): workers that take turns
    count as the sim's do, every exchange but the first one of the other's;
    a worker that exchanges only after the other's last is never stale; and
    an exchange overtaken between its shards by 5 of the other's is stale
    by 5 at shard 1, its next at shard 0 (the 5 landed there after it), so
    rank 0's 2 exchanges add up to 10."""
    assert _local_exchanges("f0 f1" + " e0 e1" * 50) == [{0: 1, 1: 49}, {1: 50}]
    assert _local_exchanges("f0" + " e0" * 50 + " f1" + " e1" * 50) == [{0: 50}, {0: 50}]
    assert _local_exchanges("f0 f1 e0+5 e0") == [{5: 2}, {1: 1, 0: 4}]


@pytest.mark.parametrize("engine", [
    "local", "sim",
    pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow]),
])
def test_a_pipeline_step_counts_once_at_staleness_0(engine, request):
    """A pipeline step is an update whose gradient is of the weights it
    updates: GPipe and 1F1B (PipeDream-Flush) both flush before the step's
    one update (strategies/pipeline/runner.py), so staleness_counts is
    {0: updates}, on each schedule and with 2 replicas of 2 stages. A step
    some stage dropped is no update and is not counted. (Local, sim and Ray
    kept no histogram.)"""
    kw = dict(steps=6, batch_size=64, evals=0, progress=False, seed=0, **_cluster(engine))
    kw.pop("shards", None)  # the stages hold their own slices: no server shards
    with _with_plugin(engine, request):
        for workers, stages, schedule in ((2, 2, "gpipe"), (4, 2, "1f1b")):
            s = monsoon.train("digits", "pipeline", workers, engine=engine,
                              pipeline_stages=stages, schedule=schedule, micro_batches=2,
                              **kw).summary
            assert s["updates"] == 6 and s["staleness_counts"] == {0: 6}, (schedule, s)
        s = monsoon.train("exp", "pipeline", 2, engine=engine, lr=1e6, epochs=2, batch_size=16,
                          seed=0, evals=0, progress=False, raise_on_divergence=False,
                          **{k: v for k, v in kw.items() if k == "timeout"}).summary
        assert s["dropped_updates"] > 0 and s["staleness_counts"] == {0: s["updates"]}, s


@pytest.mark.torchrun
@pytest.mark.slow
def test_the_torch_engines_buckets_weigh_a_short_last_batch():
    """Sync on a torch model all-reduces in buckets while backward runs; the
    438-row batch that ends digits' epoch is scaled there, and the run ends
    where serial does."""
    opts = dict(epochs=1, batch_size=500, dtype="float64", seed=1, lr=0.05, evals=0,
                progress=False)
    serial = monsoon.train("digits", "serial", **opts)
    run = monsoon.train("digits", "sync", 2, engine="torch", timeout=60, reduce_via="backend",
                        **opts)
    assert run.summary["bucket_count"] >= 1
    np.testing.assert_allclose(run.params, serial.params, rtol=1e-9, atol=1e-12)


# -- run options with a problem the user built --------------------------------------

def _built(dtype="float32"):
    from monsoon.problems import make_problem

    return make_problem("exp", dtype)


def test_a_built_problem_trains_in_its_own_precision_and_says_so(tmp_path):
    import json

    run = monsoon.train(_built("float32"), "serial", steps=3, evals=0, out=tmp_path / "r")
    assert run.params.dtype == np.float32 and run.summary["dtype"] == "float32"
    assert json.loads((tmp_path / "r" / "config.json").read_text())["dtype"] == "float32"
    same = monsoon.train(_built("float32"), "serial", steps=3, evals=0, dtype="float32")
    np.testing.assert_array_equal(same.params, run.params)
    with pytest.raises(ConfigError, match="dtype float64 was given, but the problem was built "
                                          "in float32"):
        monsoon.train(_built("float32"), "serial", steps=3, dtype="float64")


@pytest.mark.parametrize("option, value, check", [
    ("lr", 0.123, lambda r: r.summary["lr"] == 0.123),
    ("epochs", 2, lambda r: r.summary["epochs"] == pytest.approx(2)),
    ("steps", 5, lambda r: r.summary["updates"] == 5),
    ("batch_size", 7, lambda r: r.summary["batch_size"] == 7),
    ("seed", 3, lambda r: r.summary["seed"] == 3),
    ("target_loss", 10.0, lambda r: r.summary["target_loss"] == 10.0
     and r.summary["time_to_target_s"] is not None),
    ("evals", 4, lambda r: len(r.history) <= 6),
    ("eval_share", 0.25, lambda r: r.summary["status"] == "finished"),
    ("progress", False, lambda r: r.summary["status"] == "finished"),
])
def test_every_run_option_applies_to_a_built_problem(option, value, check):
    options = {"steps": 3, "evals": 0} if option not in ("steps", "epochs", "evals") else {}
    if option == "evals":
        options["steps"] = 20
    if option == "target_loss":  # checked on the curve's rows: --evals 0 (none) is refused
        options["evals"] = 1
    run = monsoon.train(_built("float64"), "serial", **{**options, option: value})
    assert check(run), (option, run.summary)


def test_a_shard_process_holds_at_least_its_minimum_of_parameters():
    """Shards default to one a worker, at most 8; where a shard is a process
    (ray), none holds fewer than MIN_PROCESS_SHARD parameters; asked for, as asked."""
    from monsoon.server.shards import MIN_PROCESS_SHARD, shard_count

    assert shard_count(None, 4, 4810) == 4  # local, sim: threads or simulated
    assert shard_count(None, 4, 4810, MIN_PROCESS_SHARD) == 1
    assert shard_count(None, 4, 3 * MIN_PROCESS_SHARD - 1, MIN_PROCESS_SHARD) == 3
    assert shard_count(None, 16, 100 * MIN_PROCESS_SHARD, MIN_PROCESS_SHARD) == 8
    assert shard_count(3, 4, 4810, MIN_PROCESS_SHARD) == 3
    assert shard_count(None, 2, 1, MIN_PROCESS_SHARD) == 1


def test_an_engine_is_built_and_described_from_its_declared_options(tmp_path):
    """An engine that writes neither ``from_options`` nor ``describe`` gets
    each option at its default unless given, its checkpoint options as
    folders, and the attributes it names in ``described`` in config.json."""
    from types import SimpleNamespace

    from monsoon.engines import Engine
    from monsoon.engines.options import CHECKPOINT_EVERY, RESUME, TIMEOUT
    from monsoon.options import Option

    class Declared(Engine):
        name = "declared"
        options = (Option("lanes", int, 2, "lanes"), TIMEOUT, CHECKPOINT_EVERY, RESUME)
        described = ("lanes", "timeout", "checkpoint_every", "resume_dir")

        def __init__(self, lanes=1, timeout=1.0, checkpoint_dir=None, checkpoint_every=0,
                     resume_dir=None):
            self.lanes, self.timeout = lanes, timeout
            self.checkpoint_dir, self.checkpoint_every = checkpoint_dir, checkpoint_every
            self.resume_dir = resume_dir

    (tmp_path / "before" / "checkpoints").mkdir(parents=True)
    run = SimpleNamespace(out=str(tmp_path / "now"), workers=2)
    engine = Declared.from_options(run, timeout=5.0, resume=str(tmp_path / "before"))
    assert (engine.lanes, engine.checkpoint_dir) == (2, str(tmp_path / "now" / "checkpoints"))
    assert engine.describe() == {"engine": "declared", "lanes": 2, "timeout_s": 5.0,
                                 "checkpoint_every": CHECKPOINT_EVERY.default,
                                 "resumed_from": str(tmp_path / "before" / "checkpoints")}
    sync = SimpleNamespace(name="sync", uses=(), needs=lambda workers: set())
    with pytest.raises(ConfigError, match="no checkpoints folder"):  # before anything starts
        Declared.from_options(run, resume=str(tmp_path / "now")).preflight(None, sync, 2, 1)

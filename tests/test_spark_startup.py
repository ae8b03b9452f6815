"""A spark run's start-up: the session the engine starts imports torch in
its Python worker daemon only where the run needs it (``daemon.py``), and
a run on a session whose daemon did without still trains a torch model;
the executor check rides in the job that loads the data (``preflight.py``)."""
import numpy as np
import pytest

import monsoon
import spark_env
from monsoon.engines.spark.engine import SparkEngine
from monsoon.errors import ConfigError, WorkerError
from monsoon.problems.linear import DenseLinear, synthetic

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# Run in each Python worker after the training: is torch imported there, and
# has its parent (the daemon that forked it) torch's library mapped? Made
# from source, so cloudpickle sends it by value and the worker imports
# nothing for it (not this module, which imports torch).
_PROBE = '''
def probe(_):
    import os, sys
    with open("/proc/%d/maps" % os.getppid()) as maps:
        return [("torch" in sys.modules, "libtorch" in maps.read())]
'''


def _probe():
    namespace = {"__name__": "monsoon_test_probe"}  # not importable: pickled by value
    exec(_PROBE, namespace)
    return namespace["probe"]


@pytest.fixture
def workers_seen(monkeypatch):
    """What the probe finds in the run's Python workers after its training,
    before the engine stops the session (one report per partition)."""
    seen = []
    loop = SparkEngine._loop

    def probed(self, ctx, *args, **kwargs):
        out = loop(self, ctx, *args, **kwargs)
        seen.extend(ctx.sc.parallelize(range(2), 2).mapPartitions(_probe()).collect())
        return out

    monkeypatch.setattr(SparkEngine, "_loop", probed)
    return seen


@pytest.fixture
def jobs_before_sizing(monkeypatch):
    """The Spark jobs a run starts before it times its jobs (``_size_jobs``):
    its start-up's checks and data loading."""
    from pyspark import SparkContext

    count, seen = {"jobs": 0}, []
    run_job, size_jobs = SparkContext.runJob, SparkEngine._size_jobs

    def counted(self, *args, **kwargs):
        count["jobs"] += 1
        return run_job(self, *args, **kwargs)

    def sized(self, *args, **kwargs):
        seen.append(count["jobs"])
        return size_jobs(self, *args, **kwargs)

    monkeypatch.setattr(SparkContext, "runJob", counted)
    monkeypatch.setattr(SparkEngine, "_size_jobs", sized)
    return seen


def _torch_problem():
    import torch
    from torch import nn

    from monsoon.problems.torch_problem import TorchProblem

    torch.manual_seed(0)
    X = torch.randn(64, 4)
    return TorchProblem(nn.Linear(4, 2), nn.CrossEntropyLoss(), X, (X[:, 0] > 0).long())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("problem, strategy, torch_in_daemon", [
    ("logistic", "async", False),  # a NumPy problem: no torch on the executors
    ("logistic", "sync", True),  # its barrier stage's ranks all-reduce with gloo
    ("torch", "async", True),
])
def test_the_engines_session_imports_torch_in_its_daemon_only_where_the_run_needs_it(
        workers_seen, jobs_before_sizing, problem, strategy, torch_in_daemon):
    spark_env.stop_kept()  # the engine starts (and stops) a session of its own
    data = _torch_problem() if problem == "torch" else problem
    run = monsoon.train(data, strategy=strategy, workers=2, engine="spark", steps=8, evals=0,
                        master="local[2]")
    assert np.isfinite(run.summary["final_loss"])
    if strategy == "sync":
        assert "barrier_stage_s" in run.summary, run.summary  # it ran in the stage
    assert workers_seen and all(daemon == torch_in_daemon for _, daemon in workers_seen)
    assert all(torch == torch_in_daemon for torch, _ in workers_seen), workers_seen
    # the executor check rode in the job that loaded the data: one job, not two
    assert jobs_before_sizing == [1], jobs_before_sizing


@pytest.mark.timeout(300)
def test_a_torch_run_on_a_session_whose_daemon_has_no_torch_imports_it_in_its_workers(
        workers_seen):
    from monsoon.engines.spark import start_session

    spark_env.stop_kept()
    spark = start_session("local[2]", "monsoon-tests", torch=False)  # a user's session
    try:
        run = monsoon.train(_torch_problem(), strategy="async", workers=2, engine="spark",
                            steps=8, evals=0)
    finally:
        spark.stop()
    assert np.isfinite(run.summary["final_loss"])
    assert workers_seen and not any(daemon for _, daemon in workers_seen), workers_seen
    assert any(torch for torch, _ in workers_seen), workers_seen  # its tasks imported it


class LoadsOnlyOnTheDriver(DenseLinear):
    """A problem that cannot be unpickled in a Spark task."""

    def __setstate__(self, state):
        from pyspark import TaskContext

        if TaskContext.get() is not None:
            raise ValueError("this problem cannot load on an executor")
        self.__dict__.update(state)


@pytest.mark.timeout(300)
def test_a_data_load_that_fails_in_the_checks_job_keeps_its_own_error():
    """The executors' Python is fine (the probe's own job says so): the
    run fails with the loading job's error, not the check's line."""
    spark_env.stop_kept()
    problem = synthetic("logistic", n=400, features=4, dtype="float64")
    problem.__class__ = LoadsOnlyOnTheDriver
    with pytest.raises(WorkerError) as info:
        monsoon.train(problem, strategy="async", workers=2, engine="spark", steps=8, evals=0,
                      master="local[2]")
    message = str(info.value)
    assert not isinstance(info.value, ConfigError) and "\n" not in message, message
    assert "loading the data into the executors" in message, message
    assert "cannot load on an executor" in message, message

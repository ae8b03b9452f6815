"""The local engine's two synchronous steps (engines/local/synchronous.py):
replicated (small models, one barrier) and sharded (three barriers) compute
the same update; replicas that drift apart fail the run."""
import numpy as np
import pytest

import monsoon
from monsoon.engines.local import synchronous
from monsoon.errors import WorkerError
from monsoon.problems import make_problem
from monsoon.rules.sgd import SGD

from faulty import FaultyProblem


@pytest.fixture(params=["replicated", "sharded"])
def sync_step(request, monkeypatch):
    if request.param == "sharded":  # every model counts as large
        monkeypatch.setattr(synchronous, "REPLICATE_MAX_BYTES", 0)
    return request.param


@pytest.mark.parametrize("rule", ["sgd", "momentum", "adam"])
def test_both_steps_equal_serial(sync_step, rule):
    opts = dict(steps=15, batch_size=256, dtype="float64", seed=2, lr=0.05, rule=rule)
    serial = monsoon.train("exp", "serial", **opts)
    sync = monsoon.train("exp", "sync", 3, **opts)
    assert sync.summary["sync_step"] == sync_step
    assert sync.summary["updates"] == 15
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)


def test_replicated_step_matches_the_simulator_bit_for_bit():
    opts = dict(steps=20, batch_size=64, dtype="float64", seed=4, lr=0.05, rule="momentum")
    local = monsoon.train("exp", "sync", 2, **opts)
    sim = monsoon.train("exp", "sync", 2, engine="sim", **opts)
    assert local.summary["sync_step"] == "replicated"
    assert np.array_equal(local.params, sim.params)


def test_large_models_and_backup_workers_use_the_sharded_step():
    big = monsoon.train("quadratic", "sync", 2, steps=3, evals=0)
    assert big.summary["sync_step"] == "sharded"
    backup = monsoon.train("exp", "sync", 3, backup_workers=1, steps=5, evals=0)
    assert backup.summary["sync_step"] == "sharded"


def test_nan_gradient_is_dropped_by_both_steps(sync_step):
    problem = FaultyProblem(make_problem("exp"), "nan", rank=1, after=3, every=5)
    run = monsoon.train(problem, "sync", 2, epochs=3, batch_size=16, seed=0)
    assert run.summary["sync_step"] == sync_step
    assert run.summary["dropped_updates"] > 0
    assert run.summary["updates"] + run.summary["dropped_updates"] == 3 * 256 // 16
    assert np.isfinite(run.params).all()


def test_a_failing_worker_fails_both_steps_fast(sync_step):
    problem = FaultyProblem(make_problem("exp"), "raise", rank=1, after=5)
    with pytest.raises(WorkerError, match="injected failure on worker 1"):
        monsoon.train(problem, "sync", 2, epochs=50, timeout=20)


def test_replicas_that_drift_apart_fail_the_run(monkeypatch):
    """A rule whose result depends on the worker breaks replication: the
    run must say so, not return worker 0's replica as if all agreed."""
    plain = SGD.apply

    def worker_dependent(self, w, g, state, info):
        plain(self, w, g, state, info)
        if info.worker == 1:
            w[0] += 1e-6

    monkeypatch.setattr(SGD, "apply", worker_dependent)
    with pytest.raises(WorkerError, match="replica of the parameters differs"):
        monsoon.train("exp", "sync", 2, steps=5, evals=0, backend="threads", timeout=20)

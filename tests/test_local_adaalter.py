"""Local SGD with an inner rule that keeps sums over its gradients
(AdaGrad's sums of squares) synchronises them each round on every engine,
as Local AdaAlter does (Xie et al. 2019; ``server/summed.py``): every worker
starts a round from the same sums S, and S then takes the example-weighted
mean of what the workers' steps added.

- Every worker starts each round from the same sums, the mean of those the
  workers ended the last round with (local threads, sim: each worker's
  AdaGrad steps recorded).
- Local (threads, processes) and sim end bit-identical, and equal a NumPy
  reference of Local AdaAlter to rounding; so do they with a compressed
  drift (the sums travel dense, and count alike); ray ends bit-identical to
  the local engine, torch within rounding (its all-reduce sums the drifts
  in its own order).
- Workers whose data differ in scale (``scaled_shards.py``): with one sum
  per worker, each scales its steps by its own statistics and the averaged
  copies settle away from the minimum; with synchronised sums the run
  reaches it (local threads and processes; the sim hands every worker the
  same problem, so it has no such workers; Spark's partitions differ by
  nature: ``test_spark.py``).
- A resumed sim run of local-sgd with AdaGrad ends bit-identical:
  ``test_resume_matrix.py``.
"""
import threading

import numpy as np
import pytest

import monsoon
from monsoon.problems import make_problem
from monsoon.rules.adagrad import Adagrad
from monsoon.strategies.batches import Budget, global_batches, split

from scaled_shards import ScaledShards

# 12 rounds of 4 local steps, each step 32 examples a worker
RUN = dict(rule="adagrad", lr=0.1, batch_size=64, steps=48, local_steps=4, seed=0, evals=0,
           dtype="float64", progress=False)


def reference(problem, workers: int, lr: float, batch_size: int, steps: int, local_steps: int,
              seed: int) -> np.ndarray:
    """Local AdaAlter in plain NumPy: H AdaGrad steps a worker from theta
    and the shared sums S, then theta -= the mean drift and S += the mean
    of what each worker added (equal examples: plain means)."""
    theta = problem.initial_params(seed).astype(np.float64)
    shared = np.zeros_like(theta)
    batches = list(global_batches(problem.n_examples, batch_size, seed, Budget(steps=steps)))
    for start in range(0, len(batches), local_steps):
        drifts, added = [], []
        for k in range(workers):
            x, s = theta.copy(), shared.copy()
            for batch in batches[start:start + local_steps]:
                _, g = problem.gradient(x, split(batch, workers, k))
                s += g * g
                x -= lr * g / (np.sqrt(s) + 1e-10)
            drifts.append(theta - x)
            added.append(s - shared)
        theta = theta - np.mean(drifts, axis=0)
        shared = shared + np.mean(added, axis=0)
    return theta


def test_every_worker_starts_each_round_from_the_mean_of_the_sums_all_ended_the_last_with(
        monkeypatch):
    seen = []
    lock = threading.Lock()
    apply = Adagrad.apply

    def recording(self, w, g, state, info):
        before = state.sum_sq.copy()
        apply(self, w, g, state, info)
        with lock:
            seen.append((info.worker, info.step, before, state.sum_sq.copy()))

    monkeypatch.setattr(Adagrad, "apply", recording)
    H, rounds = RUN["local_steps"], RUN["steps"] // RUN["local_steps"]
    for engine, extra in (("local", dict(backend="threads")), ("sim", {})):
        seen.clear()
        monsoon.train("linear", "local-sgd", 2, engine=engine, **extra, **RUN)
        steps = {(k, t): (before, after) for k, t, before, after in seen}
        assert len(steps) == 2 * RUN["steps"], engine
        for r in range(1, rounds):
            ended = [steps[k, r * H - 1][1] for k in (0, 1)]  # each worker's sums at the end
            started = [steps[k, r * H][0] for k in (0, 1)]
            assert np.array_equal(started[0], started[1]), (engine, r)
            np.testing.assert_allclose(started[0], (ended[0] + ended[1]) / 2, rtol=1e-13)
            assert not np.array_equal(ended[0], ended[1])  # the workers' steps differ


def test_local_threads_processes_and_sim_end_bit_identical_and_as_the_reference():
    runs = {name: monsoon.train("linear", "local-sgd", 2, engine=engine, **extra, **RUN).params
            for name, engine, extra in (("threads", "local", dict(backend="threads")),
                                        ("processes", "local", dict(backend="processes")),
                                        ("sim", "sim", {}))}
    assert np.array_equal(runs["threads"], runs["processes"])
    assert np.array_equal(runs["threads"], runs["sim"])
    expected = reference(make_problem("linear", dtype="float64"), 2, RUN["lr"],
                         RUN["batch_size"], RUN["steps"], RUN["local_steps"], RUN["seed"])
    np.testing.assert_allclose(runs["sim"], expected, rtol=1e-12, atol=1e-14)


def test_a_compressed_drift_leaves_the_sums_dense_and_counted_alike_on_local_and_sim():
    opts = dict(RUN, compress="topk:0.1")
    local = monsoon.train("linear", "local-sgd", 2, backend="threads", **opts)
    sim = monsoon.train("linear", "local-sgd", 2, engine="sim", **opts)
    assert np.array_equal(local.params, sim.params)
    # 12 rounds a worker, each a top-10% message and the sums (8 bytes a parameter) dense
    plain = monsoon.train("linear", "local-sgd", 2, backend="threads", **dict(opts, rule="sgd"))
    assert local.summary["bytes_sent"] == sim.summary["bytes_sent"] \
        == plain.summary["bytes_sent"] + 2 * 12 * local.params.nbytes


HETERO = dict(rule="adagrad", lr=0.2, batch_size=32, epochs=30, local_steps=4, seed=0,
              evals=0, progress=False)


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_workers_whose_data_differ_in_scale_reach_the_minimum_with_shared_sums(
        backend, monkeypatch):
    """The two fixed points lie 0.78 apart in each coordinate; synchronised,
    the run ends within 0.015 of the minimum (0.05 allowed), with a sum per
    worker 0.79 from it."""
    problem = ScaledShards()
    best = problem.minimum()
    run = monsoon.train(problem, "local-sgd", 2, backend=backend, **HETERO)
    off = float(np.abs(run.params - best).max())
    assert off < 0.05, off
    if backend == "threads":  # the same run with a sum per worker settles elsewhere
        monkeypatch.setattr(Adagrad, "summed_state", ())
        own = monsoon.train(problem, "local-sgd", 2, backend=backend, **HETERO)
        assert float(np.abs(own.params - best).max()) > 0.5


@pytest.mark.ray
@pytest.mark.usefixtures("local_ray")
def test_ray_ends_as_the_local_engine():
    pytest.importorskip("ray")
    local = monsoon.train("linear", "local-sgd", 2, backend="threads", **RUN)
    run = monsoon.train("linear", "local-sgd", 2, engine="ray", shards=2, **RUN)
    assert np.array_equal(run.params, local.params)  # the same mean, in the same order


@pytest.mark.torchrun
def test_torch_ends_as_the_local_engine():
    pytest.importorskip("torch")
    opts = dict(RUN, batch_size=32, steps=24)
    local = monsoon.train("exp", "local-sgd", 2, backend="threads", **opts)
    run = monsoon.train("exp", "local-sgd", 2, engine="torch", timeout=60, **opts)
    np.testing.assert_allclose(run.params, local.params, rtol=1e-9, atol=1e-12)

"""The invariants of DESIGN.md, one test each, on the local engine."""
import numpy as np
import pytest

import monsoon
from monsoon.problems import make_problem

FULL_BATCH = {"digits": 1438, "exp": 256, "parabola": 50}


@pytest.mark.parametrize("problem,workers", [("digits", 3), ("exp", 2)])
def test_sync_equals_serial_on_the_full_batch(problem, workers):
    opts = dict(steps=20, batch_size=FULL_BATCH[problem], dtype="float64", seed=3, lr=0.05)
    serial = monsoon.train(problem, "serial", **opts)
    sync = monsoon.train(problem, "sync", workers, **opts)
    assert not np.array_equal(serial.params, make_problem(problem, "float64").initial_params(3))
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)
    assert sync.summary["updates"] == serial.summary["updates"] == 20
    assert sync.summary["examples"] == serial.summary["examples"] == 20 * FULL_BATCH[problem]


def test_sync_equals_serial_with_uneven_minibatches():
    # 256 examples, batch 100: batches of 100, 100, 56 split 3 ways unevenly.
    opts = dict(epochs=2, batch_size=100, dtype="float64", seed=1, lr=0.05)
    serial = monsoon.train("exp", "serial", **opts)
    sync = monsoon.train("exp", "sync", 3, **opts)
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("strategy", ["sync", "async", "hogwild"])
def test_one_worker_is_bit_identical_to_serial(strategy):
    opts = dict(epochs=3, dtype="float64", seed=5)
    serial = monsoon.train("exp", "serial", **opts)
    one = monsoon.train("exp", strategy, 1, **opts)
    assert np.array_equal(one.params, serial.params)


@pytest.mark.slow
def test_parabola_seed_script_sync_matches_serial():
    """Seed 000: 2000 full-batch steps at lr 0.01 reach a loss near the seed's 0.02-0.04."""
    opts = dict(lr=0.01, steps=2000, seed=0)
    serial = monsoon.train("parabola", "serial", **opts)
    sync = monsoon.train("parabola", "sync", 2, **opts)
    assert sync.summary["final_loss"] < 0.05
    assert sync.summary["final_loss"] == pytest.approx(serial.summary["final_loss"], rel=1e-5)


def test_sync_and_serial_are_bit_reproducible():
    opts = dict(epochs=1, seed=11)
    a = monsoon.train("digits", "sync", 2, **opts)
    b = monsoon.train("digits", "sync", 2, **opts)
    assert np.array_equal(a.params, b.params)
    c = monsoon.train("digits", "serial", **opts)
    d = monsoon.train("digits", "serial", **opts)
    assert np.array_equal(c.params, d.params)
    e = monsoon.train("digits", "serial", epochs=1, seed=12)
    assert not np.array_equal(c.params, e.params)


@pytest.mark.parametrize("problem", ["exp", "digits"])
def test_async_and_hogwild_reach_serial_loss_for_the_same_examples(problem):
    # exp at 40 epochs, not its default 200: still mid-descent (loss 0.020, the
    # floor is 0.0005), where a lagging strategy would show
    budget = {"epochs": 40} if problem == "exp" else {}
    serial = monsoon.train(problem, "serial", seed=0, **budget)
    for strategy in ("async", "hogwild"):
        run = monsoon.train(problem, strategy, 2, seed=0, **budget)
        assert run.summary["examples"] == serial.summary["examples"]
        assert run.summary["final_loss"] <= 1.10 * serial.summary["final_loss"], strategy


def test_async_records_staleness_with_two_workers():
    run = monsoon.train("digits", "async", 2, seed=0)
    st = run.summary["staleness"]
    assert st["mean"] > 0 and st["max"] >= 1
    assert st["p50"] <= st["p99"] <= st["max"]
    assert run.summary["updates"] == run.summary["examples"] // 32 + (
        run.summary["examples"] % 32 > 0) or run.summary["updates"] > 0


def test_async_pushes_every_n_push_steps():
    run = monsoon.train("exp", "async", 2, steps=40, n_push=4, n_fetch=2, seed=0)
    assert run.summary["examples"] == 40 * 16
    assert run.summary["updates"] == 10  # 20 steps per worker, one push per 4 steps
    assert np.isfinite(run.summary["final_loss"])


@pytest.mark.parametrize("strategy", ["sync", "async", "hogwild"])
def test_threads_backend(strategy):
    opts = dict(epochs=3, seed=2, dtype="float64")
    run = monsoon.train("exp", strategy, 2, backend="threads", **opts)
    serial = monsoon.train("exp", "serial", **opts)
    assert run.summary["examples"] == serial.summary["examples"]
    if strategy == "sync":
        np.testing.assert_allclose(run.params, serial.params, rtol=1e-9, atol=1e-12)
    else:
        assert run.summary["final_loss"] < 1.5 * serial.summary["final_loss"]


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def _blas_during(monkeypatch, train) -> tuple[list, list, list]:
    """(BLAS threads before, at the first two rule updates of ``train()``,
    after it), the caller's BLAS given two threads first (conftest's
    OMP_NUM_THREADS=1 gave OpenBLAS one; a user's process on two cores has
    two); skips where threadpoolctl sees no BLAS."""
    import scipy.linalg.blas  # noqa: F401 - the rules' BLAS, loaded
    from threadpoolctl import threadpool_limits

    from monsoon.rules.sgd import SGD

    limits = threadpool_limits(limits=2, user_api="blas")
    before = _blas_threads()
    if not before:
        limits.restore_original_limits()
        pytest.skip("no BLAS library that threadpoolctl can see is loaded")
    seen = []
    original = SGD.apply

    def apply(self, w, g, state, info):
        if len(seen) < 2:
            seen.append(_blas_threads())
        return original(self, w, g, state, info)

    monkeypatch.setattr(SGD, "apply", apply)
    try:
        train()
        after = _blas_threads()
    finally:
        limits.restore_original_limits()
    return before, seen, after


@pytest.mark.parametrize("strategy", ["sync", "hogwild"])
def test_worker_threads_use_one_blas_thread_each(strategy, monkeypatch):
    """OpenBLAS splits a long axpy over its own threads, which then spin on
    the cores the worker threads need: during a threads run every BLAS pool
    has one thread, and afterwards the caller's setting is back."""
    before, seen, after = _blas_during(monkeypatch, lambda: monsoon.train(
        "exp", strategy, 2, backend="threads", epochs=1, evals=0))
    assert before == [2] * len(before)
    assert seen and all(threads == [1] * len(before) for threads in seen)
    assert after == before


@pytest.mark.parametrize("problem,engine,threads", [("exp", "local", 1), ("exp", "sim", 1),
                                                     ("logistic", "local", 2)])
def test_a_torch_problems_steps_in_this_process_use_one_blas_thread(problem, engine, threads,
                                                                    monkeypatch):
    """A torch problem stepped in the calling process (serial, the sim) puts
    torch's intra-op threads beside OpenBLAS's, which the rule's axpy and
    the finiteness check wake: they would spin on the same cores, so the
    run has one BLAS thread, and the caller's setting is back afterwards. A
    NumPy problem's BLAS is its compute: it keeps the caller's threads."""
    strategy, workers = ("serial", 1) if engine == "local" else ("sync", 2)
    before, seen, after = _blas_during(monkeypatch, lambda: monsoon.train(
        problem, strategy, workers, engine=engine, rule="sgd", epochs=1, evals=0))
    assert seen and all(t == [threads] * len(before) for t in seen), seen
    assert after == before


class ThreadsSeen(monsoon.TorchProblem):
    """Writes, once per process, the torch and BLAS thread counts its first
    backward pass ran with (workers run in processes of their own)."""
    log = None

    def _backward(self, w, indices, fresh, on_loss=None):  # under gradient() and backward()
        import os
        from pathlib import Path

        import torch

        path = None if self.log is None else Path(self.log) / f"{os.getpid()}.txt"
        if path is not None and not path.exists():
            path.write_text(" ".join(map(str, [torch.get_num_threads(), *_blas_threads()])))
        return super()._backward(w, indices, fresh, on_loss)


@pytest.mark.parametrize("strategy,engine", [
    ("async", "local"), ("sync", "local"),
    pytest.param("sync", "torch", marks=pytest.mark.torchrun)])
def test_a_torch_problems_worker_processes_give_torch_their_cores_and_blas_one_thread(
        strategy, engine, tmp_path, monkeypatch):
    """A worker process (the local engine's, a torchrun rank) gets its share
    of the cores for torch, and one BLAS thread beside it: OpenBLAS's threads, woken by the rule's axpy and the
    finiteness check, would spin beside torch's (one worker with two torch
    and two BLAS threads on two cores ran 10x slower than serial)."""
    import torch

    from monsoon.monitor.processes import torch_threads_per_worker

    torch.manual_seed(0)
    X = torch.randn(256, 8)
    problem = ThreadsSeen(torch.nn.Linear(8, 1), torch.nn.MSELoss(), X, X[:, :1] * 2,
                          name="seen")
    problem.log = str(tmp_path)
    # torchrun gives its ranks OMP_NUM_THREADS (conftest's 1): a user's share here
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch_threads_per_worker(1)))
    backend = {"backend": "processes"} if engine == "local" else {}
    monsoon.train(problem, strategy, 1, engine=engine, epochs=1, evals=0, progress=False,
                  **backend)
    files = list(tmp_path.glob("*.txt"))
    assert files, "no worker process ran a backward pass"
    for f in files:
        torch_threads, *blas = map(int, f.read_text().split())
        assert torch_threads == torch_threads_per_worker(1)
        assert blas and set(blas) == {1}, f.read_text()


def test_user_torch_module_trains_and_returns_model():
    import torch

    torch.manual_seed(0)
    X = torch.randn(200, 3)
    y = X @ torch.tensor([[1.0], [-2.0], [0.5]])
    problem = monsoon.TorchProblem(torch.nn.Linear(3, 1), torch.nn.MSELoss(), X, y, name="linear")
    run = monsoon.train(problem, "sync", 2, lr=0.1, epochs=30, batch_size=20)
    assert run.summary["problem"] == "linear"
    assert run.summary["final_loss"] < 1e-3
    model = run.model
    np.testing.assert_allclose(model.weight.detach().numpy(), [[1.0, -2.0, 0.5]], atol=0.02)


@pytest.mark.parametrize("n,batch,workers", [(100, 16, 3), (64, 16, 2), (10, 16, 3),
                                               (97, 8, 8)])
def test_a_local_sgd_workers_position_is_the_batches_its_examples_fill(n, batch, workers):
    """A snapshot places each local SGD worker from its own examples: the
    fewest batches of the global plan whose parts hold them (an epoch's
    short last batch has smaller parts, some empty), as walking the plan
    finds; and the local steps it records are those positions' non-empty
    parts."""
    from monsoon.record.progress import part_batches_in, snapshot_local
    from monsoon.strategies.batches import Budget, global_batches, split
    from monsoon.strategies.local_sgd import LocalSGD

    plan = list(global_batches(n, batch, 0, Budget(epochs=3)))
    for rank in range(workers):
        done, steps = 0, 0
        for k, b in enumerate(plan + [None]):
            if b is None or len(split(b, workers, rank)):  # the fewest batches holding done
                assert part_batches_in(done, n, batch, workers, rank) == k, (rank, k)
            if b is not None:
                done += len(split(b, workers, rank))
    positions = [min(p, len(plan)) for p in [len(plan) - 1, 5, 3][:workers]] + [0] * (workers - 3)
    taken = sum(sum(1 for b in plan[:p] if len(split(b, workers, r)))
                for r, p in enumerate(positions))
    assert snapshot_local(LocalSGD(), (99, 2), positions, n, batch) == (taken - 2, 2)


@pytest.mark.parametrize("local_steps", [3, 4])
def test_a_local_sgd_worker_resumed_before_a_rounds_average_makes_it_first(local_steps):
    """A checkpoint at a round's end whose average it lacks (the workers
    stopped between the round's last local step and its average, the run's
    last, shorter round's too): the resumed program makes that average
    first, with the uninterrupted program's weight, then its ops."""
    from monsoon.strategies.base import WorkerJob
    from monsoon.strategies.batches import Budget
    from monsoon.strategies.local_sgd import LocalSGD
    from monsoon.strategies.ops import Average, Gradient

    def ops(job):
        program, out = LocalSGD(local_steps=local_steps).program(job), []
        try:
            op = next(program)
            while True:
                out.append(("A", op.examples) if isinstance(op, Average) else
                           ("G", len(op.indices)) if isinstance(op, Gradient) else None)
                op = program.send((0.0, None) if isinstance(op, Gradient) else
                                  0 if isinstance(op, Average) else None)
        except StopIteration:
            return [o for o in out if o is not None]

    n, batch, workers, budget = 100, 16, 3, Budget(epochs=2)  # 14 batches, the last of 4 rows
    for rank in range(workers):
        whole = ops(WorkerJob(rank, workers, n, batch, 0, budget))
        ends = [i for i, o in enumerate(whole) if o[0] == "A"]
        for k, end in enumerate(ends):  # stopped before average k + 1
            at = min((k + 1) * local_steps, 14)
            resumed = ops(WorkerJob(rank, workers, n, batch, 0, budget, start_step=at, synced=k))
            assert resumed == whole[end:], (rank, k)


@pytest.mark.parametrize("rows, line", [
    (1, "2 workers but only 1 training example; use at most 1 worker"),
    (2, "3 workers but only 2 training examples; use at most 2 workers")])
def test_more_workers_than_examples_is_refused_in_a_grammatical_line(rows, line):
    """It said "only 1 training examples; use at most 1 workers"."""
    import scipy.sparse as sp

    from monsoon.problems.sparse_linear import SparseLinear

    problem = SparseLinear(sp.csr_matrix(np.ones((rows, 2))), np.arange(rows) % 2)
    with pytest.raises(monsoon.ConfigError) as info:
        monsoon.train(problem, "async", rows + 1, epochs=1, progress=False)
    assert str(info.value) == line

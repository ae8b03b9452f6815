"""The local engine's curve rows of a model with buffers (BatchNorm) are
evaluated with the workers' buffers as they were when the row was taken,
combined by the strategy's rule, not with the starting ones."""
import numpy as np
import pytest
import torch
from torch import nn

import monsoon
from monsoon.problems import TorchProblem
from monsoon.record.recorder import Recorder


def _module():
    # BatchNorm right after the input, a cumulative average (momentum None):
    # after one forward its statistics are the data's
    torch.manual_seed(0)
    return nn.Sequential(nn.BatchNorm1d(4, momentum=None), nn.Linear(4, 16), nn.Tanh(),
                         nn.Linear(16, 1))


def _data(n=2048):
    """Inputs of mean 50 and scale 10: the starting statistics (mean 0,
    variance 1) saturate the tanh, whatever the weights, and the loss at
    any parameters stays near the targets' variance (13)."""
    g = torch.Generator().manual_seed(1)
    Z = torch.randn(n, 4, generator=g)
    return Z * 10 + 50, 3 * Z[:, :1] - 2 * Z[:, 1:2]


@pytest.mark.slow
@pytest.mark.parametrize("strategy,backend,epochs", [
    ("sync", "processes", 3),  # rows from worker 0's snapshot ring, "rank0"
    ("hogwild", "processes", 10),  # rows from the shared parameters, "average"; a run
    # long enough for the monitor's rows to start before it ends
    ("local-sgd", "threads", 3)])
def test_mid_rows_are_evaluated_with_the_workers_buffers(strategy, backend, epochs):
    X, y = _data()
    problem = TorchProblem(_module(), nn.MSELoss(), X, y)
    start = problem.state()
    result = monsoon.train(problem, strategy, 2, lr=0.02, epochs=epochs, batch_size=16, seed=0,
                           evals=8, backend=backend)
    rows, spread = result.history, float(y.var())
    total = rows[-1]["examples"]
    later = [r for r in rows[1:-1] if r["examples"] >= total / 4]
    assert later, rows
    # with the starting buffers these rows would read about the targets'
    # variance; with the workers' they read well below it
    for row in later + [rows[-1]]:
        assert row["loss"] < spread / 3, (strategy, rows)
    # the monitor's model keeps its own buffers: the final ones, as before
    assert not np.allclose(problem.state()["0.running_mean"], start["0.running_mean"])
    assert result.summary["final_loss"] == pytest.approx(problem.evaluate(result.params)["loss"])


def test_the_recorder_evaluates_each_snapshot_with_its_buffers_then_restores_the_problems():
    X, y = _data(64)
    problem = TorchProblem(_module(), nn.MSELoss(), X, y)
    w = problem.initial_params(0)
    held = problem.state()
    trained = {k: v.copy() for k, v in held.items()}
    trained["0.running_mean"] = X.mean(0).numpy()
    trained["0.running_var"] = X.var(0).numpy()
    recorder = Recorder(problem, total_examples=None, evals=10, progress=False,
                        cost_aware=False)
    recorder.start(w, buffers=trained)
    recorder.record(1.0, 1, 16, w)  # no buffers: those the problem holds
    rows = recorder.settled_rows()
    problem.load_state(trained)
    with_trained = problem.evaluate(w)["loss"]
    problem.load_state(held)
    with_held = problem.evaluate(w)["loss"]
    assert abs(with_held - with_trained) > 0.1
    assert [r["loss"] for r in rows] == [with_trained, with_held]
    assert all(np.array_equal(v, held[k]) for k, v in problem.state().items())


def test_the_snapshot_ring_counts_the_buffers_in_its_bound():
    """A small model with a large buffer (a positional table): the ring of
    sync snapshots keeps within its bound with the buffers it holds."""
    from monsoon.engines.local.store import SNAP_RING_BYTES, ParameterStore
    from monsoon.rules import make_rule

    store = ParameterStore(np.zeros(50_000, np.float32), make_rule("sgd", 0.1), 4, 1,
                           sync_slots=True, backend="threads", replicated=True,
                           snapshot_ring=True, buffers=np.zeros(160_000))
    try:
        ring = store.snap_params.nbytes + store.snap_buffers.nbytes
        assert ring <= SNAP_RING_BYTES + store.snap_params[0].nbytes + store.snap_buffers[0].nbytes
    finally:
        store.close()

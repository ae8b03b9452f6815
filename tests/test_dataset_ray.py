"""A user's lazy Dataset under every strategy the ray engine runs (a real
local Ray instance); sync equals serial on it."""
import numpy as np
import pytest

import monsoon
from monsoon.engines import RayEngine
from monsoon.engines.base import refusal
from monsoon.strategies import make_strategy

from test_dataset_problem import STRATEGIES, lazy_problem
from lazy_dataset import write_files

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("local_ray")]


def test_the_server_and_the_allreduce_strategies_train_on_a_lazy_dataset_on_ray(tmp_path):
    """sync (checked equal to serial) and async: a lazy Dataset read by Ray
    actors. Every pair of strategy and engine trains in test_engine_contract;
    every strategy on a lazy Dataset in test_dataset_problem."""
    folder = write_files(tmp_path / "npy")
    start = lazy_problem(folder)
    first = start.loss(start.initial_params(0))
    # 3 epochs (36 steps) end near 0.03 of the first loss, far under the bound
    opts = dict(lr=0.2, epochs=3, batch_size=8, seed=0, evals=0)
    taken = [(s, w) for s, w in STRATEGIES if refusal(RayEngine, make_strategy(s), w) is None
             and s in ("sync", "async")]
    assert {"sync", "async"} == {s for s, _ in taken}
    for strategy, workers in taken:
        result = monsoon.train(lazy_problem(folder), strategy, workers, engine="ray", shards=1,
                               **opts)  # one shard: the claim is the workers' reads
        assert result.summary["final_loss"] < 0.8 * first, strategy
        if strategy == "sync":  # each Ray run starts its actors: this one checks equality too
            serial = monsoon.train(lazy_problem(folder), "serial", **opts)
            np.testing.assert_allclose(result.params, serial.params, rtol=1e-9, atol=1e-12)


def test_batchnorm_buffers_come_back_from_ray_workers():
    import torch
    from torch import nn

    from monsoon.problems import TorchProblem
    from test_user_model import _bn, _regression

    X, y = _regression()

    def problem():
        torch.manual_seed(7)
        return TorchProblem(_bn(), nn.MSELoss(), X, y, dtype="float64")

    opts = dict(lr=0.1, steps=5, batch_size=len(X), seed=0)
    on_ray = monsoon.train(problem(), "sync", 2, engine="ray", shards=1,
                           **opts).model.state_dict()
    local = monsoon.train(problem(), "sync", 2, backend="threads", **opts).model.state_dict()
    assert int(on_ray["1.num_batches_tracked"]) == 5
    for name, value in local.items():
        np.testing.assert_allclose(on_ray[name].numpy(), value.numpy(), rtol=1e-9, atol=1e-12)

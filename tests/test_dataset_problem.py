"""TorchProblem.from_dataset: a user's lazy Dataset trains under every
strategy on the local engine (processes and threads); sync equals serial."""
import numpy as np
import pytest
import torch
from torch import nn

import monsoon
from monsoon.problems import TorchProblem

from lazy_dataset import NpyFolder, Standardise, write_files

STRATEGIES = [("serial", 1), ("sync", 2), ("async", 2), ("hogwild", 2), ("local-sgd", 2),
              ("easgd", 2)]


def lazy_problem(folder, **options):
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    return TorchProblem.from_dataset(NpyFolder(folder, Standardise(0.5)), net, nn.MSELoss(),
                                     dtype="float64", **options)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("npy"))


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_every_strategy_trains_on_a_lazy_dataset(folder, backend):
    start = lazy_problem(folder)
    first = start.loss(start.initial_params(0))
    # threads run every strategy; processes the three ways a worker holds its
    # parameters (shared and synchronous, fetched and pushed, a private copy)
    chosen = STRATEGIES if backend == "threads" else [
        (s, w) for s, w in STRATEGIES if s in ("sync", "async", "local-sgd")]
    for strategy, workers in chosen:
        result = monsoon.train(lazy_problem(folder), strategy, workers, lr=0.2, epochs=6,
                               batch_size=8, seed=0, backend=backend, evals=0)
        assert result.summary["final_loss"] < 0.8 * first, strategy


def test_sync_equals_serial_on_a_lazy_dataset(folder):
    opts = dict(lr=0.2, epochs=3, batch_size=16, seed=1)
    serial = monsoon.train(lazy_problem(folder), "serial", **opts)
    sync = monsoon.train(lazy_problem(folder), "sync", 2, backend="processes", **opts)
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)


def test_the_next_batch_is_prefetched_and_gives_the_same_result(folder):
    problem = lazy_problem(folder)
    w = problem.initial_params(0)
    a, b = np.arange(8), np.arange(8, 16)
    problem.prefetch(b)
    loss_a, _ = problem.gradient(w, a)
    assert len(problem._pending) == 1          # b is loading (or loaded) meanwhile
    loss_b, g_b = problem.gradient(w, b)
    assert not problem._pending
    plain = lazy_problem(folder, prefetch=False)
    loss_b2, g_b2 = plain.gradient(w, b)
    assert loss_b == loss_b2 and np.array_equal(g_b, g_b2)


def test_validation_split_of_a_dataset(folder):
    problem = lazy_problem(folder, val_fraction=0.25)
    assert problem.n_examples == 72
    figures = problem.evaluate(problem.initial_params(0))
    assert set(figures) == {"loss", "val_loss"}


def test_where_threads_race_in_ast_parse_a_process_reads_items_one_thread_at_a_time(
        folder, monkeypatch):
    """On the CPython versions whose ``ast.parse`` is not thread-safe
    (gh-106905; ``np.load`` parses each .npy header), the prefetch thread and
    the thread that evaluates never read items at the same time; the guard
    is on exactly there. Forced on here, it is checked on any version."""
    import sys
    import threading
    import time

    from monsoon.problems import dataset_problem

    v = sys.version_info[:3]
    assert dataset_problem.AST_RACE == ((3, 11) <= v < (3, 11, 8) or (3, 12) <= v < (3, 12, 2))
    monkeypatch.setattr(dataset_problem, "_READS", threading.Lock())
    inside, most = [0], [0]

    class Counted(NpyFolder):
        def __getitem__(self, i):
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.002)  # a read long enough for the other thread to try one
            inside[0] -= 1
            return super().__getitem__(i)

    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    problem = TorchProblem.from_dataset(Counted(folder, Standardise(0.5)), net, nn.MSELoss(),
                                        dtype="float64")
    w = problem.initial_params(0)
    problem.prefetch(np.arange(16, 48))  # the prefetch thread reads 32 items...
    problem.loss(w)  # ...while this thread reads them all to evaluate
    problem.gradient(w, np.arange(16, 48))
    assert most[0] == 1


class _Items(torch.utils.data.Dataset):
    """Ten items of the form ``make(i)``."""

    def __init__(self, make):
        self.make = make

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return self.make(i)


@pytest.mark.parametrize("make, got", [
    (lambda i: {"x": torch.ones(6), "label": i % 2}, "a dict with keys 'x', 'label'"),
    (lambda i: torch.ones(6), r"one tensor of shape \(2, 6\)"),  # the first two, collated
], ids=["dict", "tensor"])
def test_items_that_do_not_collate_into_inputs_and_targets_are_refused_in_one_line(make, got):
    with pytest.raises(monsoon.ConfigError, match=f"items collate into {got}, not "
                       r"\(inputs, targets\).*pass collate_fn=") as info:
        TorchProblem.from_dataset(_Items(make), nn.Linear(6, 2), nn.CrossEntropyLoss())
    assert "\n" not in str(info.value)

    def pairs(items):  # what the message asks for
        return torch.ones(len(items), 6), torch.zeros(len(items), dtype=torch.long)

    problem = TorchProblem.from_dataset(_Items(make), nn.Linear(6, 2), nn.CrossEntropyLoss(),
                                        collate_fn=pairs)
    assert set(problem.evaluate(problem.initial_params(0))) == {"loss", "accuracy"}


def test_a_module_that_does_not_fit_the_items_is_refused_when_built():
    """It failed inside a worker, after the run had started, with a traceback."""
    items = _Items(lambda i: (torch.ones(7), torch.zeros(1)))
    with pytest.raises(monsoon.ConfigError) as info:
        TorchProblem.from_dataset(items, nn.Linear(5, 1), nn.MSELoss())
    line = str(info.value)
    assert "\n" not in line and "2x7 and 5x1" in line
    assert "fit rows of shape (7,), or reshape the dataset's inputs" in line
    with pytest.raises(monsoon.ConfigError, match=r"loss_fn does not take the module's output "
                                                  r"of shape \(2, 3\)"):
        TorchProblem.from_dataset(items, nn.Linear(7, 3), nn.CrossEntropyLoss())
    with pytest.raises(monsoon.ConfigError, match="the validation set's inputs"):
        TorchProblem.from_dataset(items, nn.Linear(7, 1), nn.MSELoss(),
                                  val=_Items(lambda i: (torch.ones(5), torch.zeros(1))))
    TorchProblem.from_dataset(items, nn.Linear(7, 1), nn.MSELoss(), val=items)  # fits


class _Growing(torch.utils.data.Dataset):
    """Item i is a sequence of length 4 + i: no two collate into one batch."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.ones(1, 4 + i), torch.tensor([float(i)])


def test_items_of_different_sizes_still_build_and_train_one_at_a_time():
    """The build-time probe reads the first two items; where they do not
    collate (a sequence, an image of its own size) it probes the first one
    alone, and such a set still trains with batch_size=1 (it was refused
    with the collate's traceback)."""
    module = nn.Sequential(nn.Conv1d(1, 2, 3), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                           nn.Linear(2, 1))
    problem = TorchProblem.from_dataset(_Growing(), module, nn.MSELoss(), eval_batch=1)
    run = monsoon.train(problem, "serial", steps=4, batch_size=1, progress=False)
    assert run.summary["status"] == "finished" and run.summary["updates"] == 4


class _Stream(torch.utils.data.IterableDataset):
    def __len__(self):
        return 10

    def __iter__(self):
        return iter([(torch.ones(7), torch.zeros(1))] * 10)


def test_a_dataloader_or_an_iterable_dataset_is_refused_naming_what_to_pass():
    """Both failed with a raw TypeError from len() or an item's index."""
    items = _Items(lambda i: (torch.ones(7), torch.zeros(1)))
    loader = torch.utils.data.DataLoader(items, batch_size=4)
    with pytest.raises(monsoon.ConfigError, match="dataset is a DataLoader; pass its Dataset, "
                                                  "loader.dataset"):
        TorchProblem.from_dataset(loader, nn.Linear(7, 1), nn.MSELoss())
    with pytest.raises(monsoon.ConfigError, match="val is a DataLoader"):
        TorchProblem.from_dataset(items, nn.Linear(7, 1), nn.MSELoss(), val=loader)
    with pytest.raises(monsoon.ConfigError, match="dataset must be a map-style torch Dataset "
                                                  r".*not an IterableDataset _Stream; .*"
                                                  r"TorchProblem\(module, loss_fn, X, y\)"):
        TorchProblem.from_dataset(_Stream(), nn.Linear(7, 1), nn.MSELoss())
    TorchProblem.from_dataset(loader.dataset, nn.Linear(7, 1), nn.MSELoss())  # as told

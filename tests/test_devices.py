"""``--device``: the device map, the checks, and placement, on the CPU.

Placement is exercised through the same code a GPU takes: a problem placed
on ``cpu:0`` is not on ``cpu``, so it keeps its module in its own flat
device buffer, uploads the parameters before each gradient and brings the
flat gradient back, exactly as on ``cuda:N`` (tests/test_gpu.py runs the
same runs on a real GPU where there is one).
"""
from __future__ import annotations

import contextlib
import io
import json
import pickle

import numpy as np
import pytest
import torch
from torch import nn

import monsoon
from monsoon import devices
from monsoon.cli import main
from monsoon.errors import ConfigError
from monsoon.problems import TorchProblem
from monsoon.strategies import STRATEGIES

NO_CUDA = not torch.cuda.is_available()


def _data():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(120, 8, generator=g, dtype=torch.float64)
    y = (X[:, :1] * 2 - X[:, 1:2]).sin()
    return X, y


X, Y = _data()


def _problem(cls=TorchProblem):
    torch.manual_seed(1)
    module = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    return cls(module, nn.MSELoss(), X, Y, dtype="float64")


class Recording(TorchProblem):
    """Records the device of every gradient (threads share the class list)."""
    seen: list = []

    def gradient(self, w, indices, out=None, accumulate=False):
        result = super().gradient(w, indices, out, accumulate)
        Recording.seen.append(self.device)
        return result


@contextlib.contextmanager
def planned(device: str):
    """Every worker's copy computes on ``device`` (``cpu:0``: the device path)."""
    saved = devices.plan
    devices.plan = lambda spec, engine, workers, gpus=None: [device] * workers
    try:
        yield
    finally:
        devices.plan = saved


# -- the device map and the checks ------------------------------------------------

def test_worker_k_gets_gpu_k_mod_gpus():
    assert devices.device_map("cuda", 5, 2) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1",
                                                "cuda:0"]
    assert devices.device_map("cuda", 3, 4) == ["cuda:0", "cuda:1", "cuda:2"]
    assert devices.device_map("cuda:1", 3, 2) == ["cuda:1"] * 3
    assert devices.device_map("cpu", 2, 0) == ["cpu", "cpu"]
    assert devices.summary_devices(["cpu", "cpu"]) == ["cpu"]
    assert devices.summary_devices(["cuda:0", "cuda:1", "cuda:0"]) == ["cuda:0", "cuda:1",
                                                                        "cuda:0"]


def _engine(name):
    from monsoon.engines import ENGINES

    return ENGINES.get(name)


def test_auto_picks_cuda_only_where_the_run_can_use_it():
    problem, sync, hogwild = _problem(), STRATEGIES.get("sync")(), STRATEGIES.get("hogwild")()
    local = _engine("local")
    assert devices.choose("auto", problem, sync, local, 2, gpus=0) == "cpu"
    assert devices.choose("auto", problem, sync, local, 2, gpus=2) == "cuda"
    assert devices.choose("auto", problem, hogwild, local, 2, gpus=2) == "cpu"
    assert devices.choose("auto", problem, STRATEGIES.get("pipeline")(), local, 2,
                          gpus=2) == "cpu"
    assert devices.choose("auto", problem, sync, _engine("sim"), 2, gpus=2) == "cpu"
    assert devices.choose("cpu", problem, sync, local, 2, gpus=2) == "cpu"
    assert devices.choose("cuda:1", problem, sync, local, 2, gpus=2) == "cuda:1"
    assert devices.plan("cuda", local, 5, gpus=2) == ["cuda:0", "cuda:1"] * 2 + ["cuda:0"]
    # Hogwild! threads share one device tensor (seed 002); processes cannot
    from monsoon.engines import ENGINES
    threads = ENGINES.get("local")(backend="threads")
    processes = ENGINES.get("local")(backend="processes")
    assert devices.choose("auto", problem, hogwild, threads, 2, gpus=1) == "cuda"
    assert devices.choose("cuda", problem, hogwild, threads, 2, gpus=1) == "cuda"
    assert devices.choose("auto", problem, hogwild, processes, 2, gpus=1) == "cpu"
    assert devices.plan("cuda", _engine("ray"), 2, gpus=2) == ["cuda", "cuda"]


@pytest.mark.parametrize("spec,strategy,engine,gpus,problem,message", [
    ("cuda", "sync", "local", 0, "torch", "--device cuda needs a CUDA GPU, and torch sees none"),
    ("cuda:2", "sync", "local", 2, "torch", "--device cuda:2, but this machine has 2 GPU(s)"),
    ("cuda", "sync", "local", 1, "numpy", "applies to torch problems; problem 'linear' is "
     "computed by NumPy"),
    ("cuda", "hogwild", "local", 1, "torch", "hogwild has every worker update one parameter "
     "array in place, which GPU workers share only as threads of one process"),
    ("cuda", "sync", "sim", 1, "torch", "the sim engine runs its workers on the CPU only"),
    ("cuda", "pipeline", "local", 1, "torch", "pipeline runs its stages on the CPU only"),
])
def test_a_device_the_run_cannot_use_is_refused_in_one_line(spec, strategy, engine, gpus,
                                                            problem, message):
    from monsoon.problems import make_problem

    built = _problem() if problem == "torch" else make_problem("linear")
    with pytest.raises(ConfigError) as err:
        devices.choose(spec, built, STRATEGIES.get(strategy)(), _engine(engine), 2, gpus=gpus)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_ray_shares_gpus_so_that_every_worker_fits():
    problem = _problem()
    assert devices.ray_gpus_per_worker(problem, 2, 4) == 0  # on the CPU: no GPU asked
    problem.use_devices(["cuda"] * 5)
    assert devices.ray_gpus_per_worker(problem, 2, 4) == 1
    assert devices.ray_gpus_per_worker(problem, 5, 2) == pytest.approx(1 / 3)
    with pytest.raises(ConfigError, match="the Ray cluster has no GPU"):
        devices.ray_gpus_per_worker(problem, 2, 0)


def test_a_torch_rank_computes_on_its_groups_gpu_or_its_local_ranks():
    problem = _problem()
    assert devices.rank_device(problem, 1) is None  # no GPU given
    problem.use_devices(["cuda:0", "cuda:1"])
    assert devices.rank_device(problem, 1, "cuda:1") == "cuda:1"
    problem.use_devices(["cuda:1", "cuda:1"])
    assert devices.rank_device(problem, 0) == "cuda:1"


# -- refused before any worker starts ---------------------------------------------

def test_bad_device_spelling_is_refused_naming_the_keyword():
    with pytest.raises(ConfigError, match="device must be auto, cpu, cuda or cuda:N, "
                                          "got 'gpu'; fix device="):
        monsoon.train(_problem(), "serial", steps=1, device="gpu", progress=False)


@pytest.mark.skipif(not NO_CUDA, reason="holds on a machine without CUDA; this one has it")
def test_cuda_without_cuda_is_refused_before_any_worker_starts(tmp_path):
    with pytest.raises(ConfigError) as err:
        monsoon.train(_problem(), "sync", 2, steps=2, device="cuda", out=tmp_path / "py",
                      progress=False)
    assert "torch sees none on this machine" in str(err.value)
    assert not (tmp_path / "py").exists()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(["train", "--problem", "digits", "--strategy", "sync", "--workers", "2",
                     "--steps", "2", "--device", "cuda", "--out", str(tmp_path / "cli")])
    lines = stderr.getvalue().strip().splitlines()
    assert code != 0 and len(lines) == 1, lines
    assert lines[0].startswith("monsoon: error: --device cuda needs a CUDA GPU")
    assert not (tmp_path / "cli").exists()


# -- placement: the device path, on the CPU --------------------------------------------

def test_a_placed_problem_computes_the_same_and_moves_back():
    plain, placed = _problem(), _problem()
    w = plain.initial_params(0)
    rows = np.arange(0, 40)
    placed.place("cpu:0")
    assert placed.device == "cpu:0" and placed._dev_flat.data_ptr() != w.ctypes.data
    for _ in range(3):  # the module's buffers move along, and are trained alike
        la, ga = plain.gradient(w, rows)
        lb, gb = placed.gradient(w, rows)
        assert la == lb and np.array_equal(ga, gb)
        assert isinstance(gb, np.ndarray)
        w = w - 0.1 * ga
    out = np.ones_like(w)
    placed.gradient(w, rows, out=out, accumulate=True)  # added to out
    assert np.allclose(out - 1, plain.gradient(w, rows)[1], rtol=0, atol=1e-15)
    assert plain.evaluate(w) == placed.evaluate(w)
    assert all(np.array_equal(plain.state()[k], v) for k, v in placed.state().items())
    model = placed.model_at(w)
    assert all(t.device.type == "cpu" for t in model.state_dict().values())
    # a copy for a worker (a pickle) is a CPU problem that keeps its target
    placed.use_devices(["cpu:0", "cpu:0"])
    clone = pickle.loads(pickle.dumps(placed.for_worker(1, 2)))
    assert clone.device == "cpu" and clone.target_device() == "cpu:0"
    assert np.array_equal(clone.gradient(w, rows)[1], plain.gradient(w, rows)[1])
    assert clone.device == "cpu:0"  # placed at its first computation
    placed.place("cpu")
    assert placed.device == "cpu" and placed.X is X
    assert not [k for k in vars(placed) if k.startswith("_dev")]
    assert np.array_equal(placed.gradient(w, rows)[1], plain.gradient(w, rows)[1])


def test_dataset_batches_reach_the_device_through_the_prefetcher():
    from torch.utils.data import TensorDataset

    def build(prefetch):
        torch.manual_seed(1)
        module = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
        return TorchProblem.from_dataset(TensorDataset(X, Y), module, nn.MSELoss(),
                                         dtype="float64", prefetch=prefetch)

    plain, placed = build(False), build(True)
    placed.use_devices(["cpu:0"])
    w = plain.initial_params(0)
    batches = [np.arange(k, k + 30) for k in range(0, 90, 30)]
    for now, nxt in zip(batches, batches[1:] + [None]):
        if nxt is not None:
            placed.prefetch(nxt)
        assert np.array_equal(placed.gradient(w, now)[1], plain.gradient(w, now)[1])
    assert placed.device == "cpu:0"
    assert plain.evaluate(w) == placed.evaluate(w)
    placed.place("cpu")
    assert placed._pending == {}


@pytest.mark.slow
@pytest.mark.parametrize("strategy,workers,backend", [
    ("serial", 1, "processes"), ("sync", 2, "processes"), ("sync", 2, "threads"),
    ("local-sgd", 2, "threads")])
def test_runs_on_placed_workers_equal_runs_on_the_cpu(strategy, workers, backend, tmp_path):
    """Every worker computes through the device path (``cpu:0``); params,
    buffers, model.pt and summary.json equal the run without --device, and
    the problem is back on the CPU afterwards."""
    common = dict(steps=12, batch_size=24, seed=0, evals=3, progress=False, backend=backend,
                  lr=0.05)
    plain = monsoon.train(_problem(), strategy, workers, out=tmp_path / "plain", **common)
    explicit = monsoon.train(_problem(), strategy, workers, out=tmp_path / "cpu",
                             device="cpu", **common)
    Recording.seen = []
    problem = _problem(Recording)
    with planned("cpu:0"):
        placed = monsoon.train(problem, strategy, workers, out=tmp_path / "placed", **common)
    if backend == "threads" or workers == 1:  # processes record in their own memory
        assert Recording.seen and set(Recording.seen) == {"cpu:0"}
    assert problem.device == "cpu" and problem.worker_devices is None
    assert all(t.device.type == "cpu" for t in problem.module.state_dict().values())
    assert placed.summary["devices"] == ["cpu:0"]
    for run, name in ((explicit, "cpu"), (placed, "placed")):
        assert np.array_equal(run.params, plain.params)
        for k, v in plain.state.items():
            assert np.array_equal(run.state[k], v), k
        saved = torch.load(tmp_path / name / "model.pt", weights_only=True)
        reference = torch.load(tmp_path / "plain" / "model.pt", weights_only=True)
        assert all(torch.equal(saved[k], reference[k]) for k in reference)
        ours = json.loads((tmp_path / name / "summary.json").read_text())
        theirs = json.loads((tmp_path / "plain" / "summary.json").read_text())
        assert ours.keys() == theirs.keys()
        for key in ("final_loss", "updates", "examples", "n_params", "dtype", "status"):
            assert ours[key] == theirs[key], key
    assert explicit.summary["devices"] == plain.summary["devices"] == ["cpu"]


def test_numpy_problems_record_the_cpu():
    result = monsoon.train("linear", "serial", steps=3, progress=False, evals=0)
    assert result.summary["devices"] == ["cpu"]

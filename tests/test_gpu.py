"""GPU workers (``--device cuda``), where a CUDA device exists.

Every test is marked ``gpu`` and skipped, with the reason, on a machine
without CUDA; tests/test_devices.py runs the same code path on the CPU.
In float64, a GPU run equals its reference to 1e-9:

- sync with 2 workers (towers) on one GPU equals serial on that GPU
  (a model without batch statistics), and with BatchNorm equals sync on the
  CPU, parameters and buffers;
- serial on the GPU equals serial on the CPU, buffers included;
- the torch engine on NCCL with one rank (its arrays on the GPU, in buckets
  and without) equals serial on the GPU;
- hogwild and async threads on one GPU (one shared device tensor, updated
  in place: seed 002's first program) with one worker equal serial, and
  with two train;
- a float64 module trains in float64; bf16 autocast keeps float32 weights
  and lands near the float32 run.
- a BatchNorm sync run cut after a checkpoint resumes bit-identical, and
  the user's module ends holding the run's weights.

The parameters of in-process runs live on the GPU for the whole run
(checked: the store's tensor is the one the module computes on).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import monsoon
from monsoon.errors import ConfigError
from monsoon.problems import TorchProblem

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA device; torch sees none here")]


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _problem(batchnorm: bool) -> TorchProblem:
    g = torch.Generator().manual_seed(3)
    X = torch.randn(256, 8, generator=g, dtype=torch.float64)
    y = (X[:, :1] * 2 - X[:, 1:2]).sin()
    torch.manual_seed(1)
    layers = [nn.Linear(8, 32)] + ([nn.BatchNorm1d(32)] if batchnorm else []) + \
        [nn.Tanh(), nn.Linear(32, 1)]
    return TorchProblem(nn.Sequential(*layers), nn.MSELoss(), X, y, dtype="float64")


COMMON = dict(lr=0.1, steps=12, batch_size=64, seed=0, progress=False, evals=3)


def _same(run, reference, buffers=True):
    assert _rel(run.params, reference.params) < 1e-9
    if buffers:
        for name, value in reference.state.items():
            assert _rel(run.state[name], value) < 1e-9, name
    assert isinstance(run.params, np.ndarray)
    assert all(t.device.type == "cpu" for t in run.model.state_dict().values())


def test_two_towers_on_one_gpu_equal_serial_on_it(tmp_path):
    serial = monsoon.train(_problem(False), "serial", device="cuda:0", **COMMON)
    sync = monsoon.train(_problem(False), "sync", 2, device="cuda:0", out=tmp_path / "s",
                         **COMMON)
    assert serial.summary["devices"] == sync.summary["devices"] == ["cuda:0"]
    _same(sync, serial, buffers=False)
    assert (tmp_path / "s" / "model.pt").exists()


def test_buffers_on_the_gpu_equal_the_cpus():
    for strategy, workers in (("serial", 1), ("sync", 2)):
        cpu = monsoon.train(_problem(True), strategy, workers, **COMMON)
        gpu = monsoon.train(_problem(True), strategy, workers, device="cuda", **COMMON)
        _same(gpu, cpu)
        assert gpu.summary["final_loss"] == pytest.approx(cpu.summary["final_loss"], rel=1e-9)


def test_workers_share_the_gpus_round_robin():
    gpus = torch.cuda.device_count()
    run = monsoon.train(_problem(False), "async", 3, device="cuda", backend="threads",
                        **COMMON)
    expected = [f"cuda:{k % gpus}" for k in range(3)]
    assert run.summary["devices"] == (expected[:1] if gpus == 1 else expected)


def test_async_workers_on_gpus_train():
    run = monsoon.train(_problem(True), "async", 2, device="cuda", **COMMON)
    first = run.history[0]["loss"]
    assert run.summary["final_loss"] < first


def test_dataset_problem_on_the_gpu_equals_the_cpu():
    from torch.utils.data import TensorDataset

    def build():
        base = _problem(True)
        torch.manual_seed(1)
        module = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 1))
        return TorchProblem.from_dataset(TensorDataset(base.X, base.y), module, nn.MSELoss(),
                                         dtype="float64")

    cpu = monsoon.train(build(), "sync", 2, **COMMON)
    gpu = monsoon.train(build(), "sync", 2, device="cuda", **COMMON)
    _same(gpu, cpu)


def test_hogwild_on_processes_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="GPU workers share only as threads of one process"):
        monsoon.train(_problem(False), "hogwild", 2, device="cuda", backend="processes",
                      **COMMON)


@pytest.mark.parametrize("strategy", ["hogwild", "async"])
def test_threads_on_one_gpu_share_one_device_tensor(strategy):
    serial = monsoon.train(_problem(False), "serial", device="cuda:0", **COMMON)
    one = monsoon.train(_problem(False), strategy, 1, device="cuda:0", **COMMON)
    assert one.summary["backend"] == "threads"  # the default on a GPU
    _same(one, serial, buffers=False)
    two = monsoon.train(_problem(False), strategy, 2, device="cuda:0", **COMMON)
    assert two.summary["final_loss"] < two.history[0]["loss"]


class Seen(TorchProblem):
    devices: list = []

    def gradient(self, w, indices, out=None, accumulate=False):
        Seen.devices.append(str(w.device) if isinstance(w, torch.Tensor) else "host")
        return super().gradient(w, indices, out, accumulate)


def test_parameters_stay_on_the_gpu_for_the_whole_run():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(256, 8, generator=g, dtype=torch.float64)
    Seen.devices = []
    problem = Seen(nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).double(),
                   nn.MSELoss(), X, X[:, :1].sin())
    monsoon.train(problem, "sync", 2, device="cuda:0", **COMMON)
    assert set(Seen.devices) == {"cuda:0"}


def test_a_float64_module_trains_in_float64_and_bf16_keeps_float32_weights():
    run = monsoon.train(_problem(False), "serial", device="cuda:0", dtype="float64", **COMMON)
    assert run.params.dtype == np.float64
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(3)
    X = torch.randn(256, 8, generator=g)
    make = lambda: TorchProblem(nn.Sequential(nn.Linear(8, 64), nn.Tanh(),  # noqa: E731
                                              nn.Linear(64, 1)), nn.MSELoss(), X, X[:, :1].sin())
    torch.manual_seed(1)
    fp32 = monsoon.train(make(), "serial", device="cuda:0", **COMMON)
    torch.manual_seed(1)
    bf16 = monsoon.train(make(), "serial", device="cuda:0", precision="bf16", **COMMON)
    assert bf16.params.dtype == np.float32 and bf16.summary["precision"] == "bf16"
    assert bf16.summary["final_loss"] == pytest.approx(fp32.summary["final_loss"], rel=0.05)


@pytest.mark.torchrun
@pytest.mark.parametrize("bucket_mb", [25.0, 0.0])
def test_torch_engine_on_nccl_with_one_rank_equals_serial_on_the_gpu(bucket_mb):
    """The rank's parameters, rule state and buffer live on the GPU: the
    gradient reaches the buffer in buckets during backward, or in one
    multiply after it (``bucket_mb=0``)."""
    serial = monsoon.train(_problem(True), "serial", device="cuda:0", **COMMON)
    rank = monsoon.train(_problem(True), "sync", 1, engine="torch", device="cuda",
                         dist_backend="nccl", timeout=60, bucket_mb=bucket_mb, **COMMON)
    assert rank.summary["dist_backend"] == "nccl"
    assert rank.summary["bucket_count"] == (1 if bucket_mb else None)
    assert rank.summary["devices"] == ["cuda:0"]
    _same(rank, serial)


def test_a_dropout_model_on_the_gpu_resumes_bit_identical(tmp_path):
    """Dropout's masks on the GPU come from the GPU's generator, seeded
    before each forward pass from (seed, rank, passes so far): a resumed
    run draws the uninterrupted run's masks there too."""
    from test_checkpoints import cut_after
    from test_resume_matrix import _torch_problem

    from monsoon.record import checkpoints

    opts = dict(lr=0.2, steps=12, batch_size=16, seed=0, evals=0, progress=False, device="cuda")
    whole = monsoon.train(_torch_problem(dropout=True), "serial", out=tmp_path / "a",
                          checkpoint_every=4, **opts)
    assert checkpoints.read(cut_after(tmp_path / "a", 1)[0]).meta["positions"][0] < 12
    resumed = monsoon.train(_torch_problem(dropout=True), "serial", resume=str(tmp_path / "a"),
                            **opts)
    assert np.array_equal(resumed.params, whole.params)


def test_a_batchnorm_sync_run_on_the_gpu_resumes_bit_identical(tmp_path):
    """Two towers on the GPU (threads), cut after a checkpoint: the
    checkpoint holds worker 0's buffers at its step (each worker keeps its
    step's buffers as GPU clones), and the resumed run ends bit-identical,
    parameters and buffers."""
    from test_checkpoints import cut_after
    from test_resume_matrix import _torch_problem

    opts = dict(steps=24, batch_size=16, seed=0, evals=0, backend="threads", progress=False,
                device="cuda")
    whole = monsoon.train(_torch_problem(batchnorm=True), "sync", 2, out=tmp_path / "a",
                          checkpoint_every=10, **opts)
    cut_after(tmp_path / "a", 1)
    resumed = monsoon.train(_torch_problem(batchnorm=True), "sync", 2,
                            resume=str(tmp_path / "a"), **opts)
    assert np.array_equal(resumed.params, whole.params)
    for name, value in whole.state.items():
        assert np.array_equal(resumed.state[name], value), name


def test_the_users_module_ends_trained_on_the_gpu():
    """After a GPU run the user's module holds the run's final weights
    (a copy), whichever strategy ran."""
    for strategy, workers in (("serial", 1), ("sync", 2)):
        problem = _problem(batchnorm=True)
        run = monsoon.train(problem, strategy, workers, device="cuda", backend="threads",
                            **COMMON)
        weights = torch.cat([p.detach().reshape(-1).cpu() for p in problem.module.parameters()])
        assert np.array_equal(weights.numpy(), run.params), strategy

"""Arrays where the problem computes (``monsoon/arrays.py``), on the CPU.

On a GPU the local engine keeps the parameters, gradients and rule state as
device tensors. Without a GPU the same code runs two ways here:

- ``resident``: a torch problem whose parameters are torch tensors on the
  CPU takes exactly the path a GPU run takes (tensor store, torch rules,
  the module viewing the store's tensor, host copies for snapshots,
  checkpoints and the result); it must equal the NumPy path;
- ``meta``: torch's device without storage stands in for a GPU where only
  the placement matters: every tensor the problem computes with must be
  on it, or torch raises a device mismatch before any value is read.

tests/test_gpu.py runs the same runs on a real GPU where there is one.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import monsoon
from monsoon import arrays, devices
from monsoon.errors import ConfigError
from monsoon.problems import TorchProblem
from monsoon.rules import RULES, Schedule, UpdateInfo
from monsoon.strategies import STRATEGIES


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _problem(resident=False, batchnorm=True, cls=TorchProblem, double=True):
    g = torch.Generator().manual_seed(3)
    X = torch.randn(192, 8, generator=g, dtype=torch.float64)
    y = (X[:, :1] * 2 - X[:, 1:2]).sin()
    torch.manual_seed(1)
    layers = [nn.Linear(8, 16)] + ([nn.BatchNorm1d(16)] if batchnorm else []) + \
        [nn.Tanh(), nn.Linear(16, 1)]
    module = nn.Sequential(*layers)
    problem = cls(module.double() if double else module, nn.MSELoss(), X, y)
    problem.resident = resident
    return problem


COMMON = dict(lr=0.1, steps=12, batch_size=48, seed=0, progress=False, evals=3)


# -- rules: one implementation, either kind of array ------------------------------

@pytest.mark.parametrize("name", sorted(n for n in RULES.names()
                                        if RULES.get(n).device_arrays))
def test_every_rule_on_tensors_equals_numpy(name):
    rng = np.random.default_rng(0)
    n = 257
    rule_np = RULES.get(name)(Schedule(0.05))
    rule_t = RULES.get(name)(Schedule(0.05))
    w_np = rng.standard_normal(n)
    w_t = torch.from_numpy(w_np.copy())
    state_np = rule_np.init(n, w_np.dtype)
    state_t = rule_t.init(n, w_np.dtype, zeros=arrays.zeros_for(w_t))
    assert all(isinstance(a, torch.Tensor) for a in state_t)
    reader_np = rule_np.init_reader(n, w_np.dtype)
    reader_t = rule_t.init_reader(n, w_np.dtype, zeros=arrays.zeros_for(w_t))
    for step in range(6):
        if step % 2 == 0:  # a read, then updates that come after it (delay-aware rules)
            rule_np.on_read(w_np, state_np, reader_np)
            rule_t.on_read(w_t, state_t, reader_t)
        g = rng.standard_normal(n)
        info = dict(step=step, staleness=step % 2, worker=0)
        rule_np.apply(w_np, g, state_np, UpdateInfo(reader=reader_np or None, **info))
        rule_t.apply(w_t, torch.from_numpy(g), state_t,
                     UpdateInfo(reader=reader_t or None, **info))
    assert _rel(w_t.numpy(), w_np) < 1e-12
    for a, b in zip(state_t, state_np):
        assert _rel(a.numpy(), b) < 1e-12


def test_a_host_only_rule_is_refused_on_a_gpu_in_one_line():
    from monsoon.engines import ENGINES

    rule = RULES.get("lbfgs")(Schedule(1.0))
    with pytest.raises(ConfigError) as err:
        devices.choose("cuda", _problem(), STRATEGIES.get("serial")(),
                       ENGINES.get("local")(backend="threads"), 1, gpus=1, rule=rule)
    assert "rule lbfgs runs on NumPy arrays in host memory" in str(err.value)
    assert "\n" not in str(err.value)


# -- the device path, resident on the CPU ---------------------------------------------

class Recording(TorchProblem):
    """Records what each gradient was given (threads share the class list)."""
    seen: list = []

    def gradient(self, w, indices, out=None, accumulate=False):
        Recording.seen.append((type(w), arrays.is_tensor(w) and w.data_ptr()))
        return super().gradient(w, indices, out, accumulate)


@pytest.mark.parametrize("strategy,workers", [("serial", 1), ("hogwild", 2)])
def test_the_module_computes_on_the_stores_tensor_without_a_copy(strategy, workers):
    Recording.seen = []
    run = monsoon.train(_problem(True, cls=Recording), strategy, workers, backend="threads",
                        **COMMON)
    kinds = {kind for kind, _ in Recording.seen}
    pointers = {ptr for _, ptr in Recording.seen}
    assert kinds == {torch.Tensor}
    assert len(pointers) == 1  # every gradient read the one shared parameter tensor
    assert isinstance(run.params, np.ndarray) and run.params.dtype == np.float64


@pytest.mark.parametrize("strategy,workers,rule", [
    ("serial", 1, "adam"), ("sync", 2, "sgd"), ("sync", 2, "adarevision"),
    ("async", 1, "momentum"), ("local-sgd", 2, "sgd"), ("ssp", 1, "adagrad")])
def test_resident_runs_equal_host_runs(strategy, workers, rule):
    """Towers on one device: the sync step sums the slots and applies the
    rule once per coordinate, exactly serial's step (to rounding: torch's
    kernels round a division by a scalar differently in the last bit, which
    AdaGrad's and Adam's per-coordinate scaling grows to about 1e-8 in 12
    steps; the other rules stay at 1e-9)."""
    tolerance = 1e-6 if rule in ("adam", "adagrad") else 1e-9
    host = monsoon.train(_problem(False), strategy, workers, rule=rule, backend="threads",
                         **COMMON)
    resident = monsoon.train(_problem(True), strategy, workers, rule=rule, backend="threads",
                             **COMMON)
    assert _rel(resident.params, host.params) < tolerance
    for name, value in host.state.items():
        assert _rel(resident.state[name], value) < tolerance, name
    assert resident.summary["final_loss"] == pytest.approx(host.summary["final_loss"],
                                                           rel=tolerance)
    if strategy == "sync":
        assert resident.summary["sync_step"] == "sharded"


def test_two_resident_towers_equal_one_worker_on_the_whole_batch():
    serial = monsoon.train(_problem(True, batchnorm=False), "serial", **COMMON)
    towers = monsoon.train(_problem(True, batchnorm=False), "sync", 2, backend="threads",
                           **COMMON)
    assert _rel(towers.params, serial.params) < 1e-9


def test_a_resident_run_resumes_from_its_checkpoint(tmp_path):
    from monsoon.engines.local import checkpointing

    checkpointing.COST_FACTOR, saved = 0, checkpointing.COST_FACTOR
    try:
        opts = dict(COMMON, steps=40, rule="adam", evals=5)
        # no BatchNorm: the local engine's checkpoints hold no buffers, and
        # --resume refuses a model with them (test_resume_matrix.py)
        whole = monsoon.train(_problem(True, batchnorm=False), "sync", 2, backend="threads",
                              out=tmp_path / "a", checkpoint_every=10, **opts)
        files = sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))
        for f in files[1:]:
            f.unlink()
        resumed = monsoon.train(_problem(True, batchnorm=False), "sync", 2,
                                backend="threads", resume=str(tmp_path / "a"), **opts)
    finally:
        checkpointing.COST_FACTOR = saved
    assert np.array_equal(resumed.params, whole.params)
    assert resumed.summary["updates"] == whole.summary["updates"]


# -- placement: a stand-in device --------------------------------------------------------

def _devices_of(problem) -> set:
    tensors = [*problem.module.parameters(), *problem.module.buffers(), problem.X, problem.y]
    return {t.device.type for t in tensors}


def _reaches_the_read(compute) -> None:
    """On ``meta`` a computation gets as far as reading a value back, and
    no further: it must not meet tensors on two devices before that."""
    with pytest.raises(RuntimeError) as err:
        compute()
    assert "cannot be called on meta tensors" in str(err.value), str(err.value)


def test_the_module_its_buffers_and_the_data_move_together():
    """The monitor's first evaluation after a multi-worker GPU run met the
    data still on the host ("mat1 is on cpu, different from other tensors
    on cuda:0"): the chunks were taken before the problem moved."""
    problem = _problem()
    w = problem.initial_params(0)
    problem.use_devices(["meta", "meta"])
    clone = problem.for_worker(1, 2)                 # a worker's copy: moves at first use
    assert clone.device == "cpu"
    _reaches_the_read(lambda: problem.evaluate(w))   # a host snapshot, evaluated there
    assert problem.device == "meta" and _devices_of(problem) == {"meta"}
    _reaches_the_read(lambda: problem.gradient(w, np.arange(8)))
    _reaches_the_read(lambda: clone.loss(w))
    assert _devices_of(clone) == {"meta"}


def test_sharing_the_data_with_processes_keeps_it_with_the_module():
    problem = _problem()
    w = problem.initial_params(0)
    problem.use_devices(["meta", "meta"])
    _reaches_the_read(lambda: problem.loss(w))
    with problem.shared_data():  # what the local engine does to start worker processes
        pass
    _reaches_the_read(lambda: problem.evaluate(w))
    assert _devices_of(problem) == {"meta"}


# -- precision ---------------------------------------------------------------------------

def test_a_module_keeps_its_own_dtype():
    double = _problem(double=True)
    single = _problem(double=False)
    assert double.dtype == np.float64 and single.dtype == np.float32
    run = monsoon.train(_problem(double=True), "serial", dtype="float64", **COMMON)
    assert run.params.dtype == np.float64 and run.summary["dtype"] == "float64"
    with pytest.raises(ConfigError, match="was built in float32"):
        monsoon.train(_problem(double=False), "serial", dtype="float64", **COMMON)


def test_bf16_autocasts_the_forward_pass_and_keeps_float32_weights():
    fp32 = monsoon.train(_problem(double=False), "serial", **COMMON)
    problem = _problem(double=False)
    bf16 = monsoon.train(problem, "serial", precision="bf16", **COMMON)
    assert bf16.summary["precision"] == "bf16" and fp32.summary["precision"] == "32"
    assert bf16.params.dtype == np.float32
    assert not np.array_equal(bf16.params, fp32.params)  # the forward pass was in bfloat16
    assert _rel(bf16.params, fp32.params) < 0.05
    assert bf16.summary["final_loss"] == pytest.approx(fp32.summary["final_loss"], rel=0.05)
    assert problem.precision == "32"  # the run's setting ends with the run


@pytest.mark.parametrize("problem,message", [
    ("linear", "--precision bf16 applies to torch problems"),
    ("float64", "precision bf16 keeps float32 master weights"),
])
def test_bf16_is_refused_where_it_cannot_hold(problem, message):
    built = "linear" if problem == "linear" else _problem(double=True)
    with pytest.raises(ConfigError) as err:
        monsoon.train(built, "serial", precision="bf16", **COMMON)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_noted_finiteness_holds_until_the_tensor_is_written():
    """On a GPU the problem reads the gradient's finiteness back with the
    loss (one read-back a step); the engine's check then trusts that note
    only while the tensor is unchanged."""
    g = torch.ones(4, dtype=torch.float64)
    arrays.note_finite(g, False)
    assert arrays.finite(g) is False
    torch.cat([torch.ones(2), torch.full((2,), 3.0)], out=g)  # how a gradient is gathered
    assert arrays.finite(g) is True
    g[2] = float("nan")
    assert arrays.finite(g) is False

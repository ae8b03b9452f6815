"""Resuming carries every state a run holds, or refuses in one line.

- A compressed sync run whose monitor is SIGKILLed mid-way, resumed with
  ``--resume``, ends bit-identical to the uninterrupted run: each worker's
  error-feedback residual and compressor state (random stream) is in the
  checkpoint (``engines/local/checkpointing.py``, ``messages.Sender.state``).
- The matrix: each engine that writes checkpoints whose deterministic runs
  are resumed here (local: serial and sync, replicated and sharded, in
  processes and threads; sim: sync, async, ssp, local-sgd), with the options that
  carry state (a compressor's residual, random stream; Adam's, AdaGrad's
  and AdaRevision's state; L-BFGS's correction pairs; backup workers;
  DiLoCo's outer momentum; local SGD's synchronised AdaGrad sums), cut
  after its first checkpoint (as if killed then) and resumed, ends
  bit-identical with the same totals; so does a lazy Dataset's run (its
  position is the step).
  (Ray, Spark and torch: ``test_checkpoints_every_engine.py``.)
- Runs that are not deterministic (async, hogwild; backup workers on real
  workers) meet their budget when resumed, and do no batch twice.
- A state whose checkpoints cannot hold it is refused at ``--resume`` in
  one line, before anything starts: a compressor state (local async; the
  torch engine's sync checkpoints hold it: ``test_torch_sender_state.py``),
  a model's buffers (BatchNorm's statistics) where other
  workers hold them (ray, spark); the sim (it replays its run), the local
  engine (``test_checkpoint_buffers.py``) and the torch engine's sync runs
  (every rank's) keep them.
- ``--elastic`` (Ray only) holds no state a checkpoint needs: every step is
  the full batch whatever the membership, and a resumed run starts every
  worker again; ``test_ray.py`` resumes sync runs on Ray."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import monsoon
from monsoon.record import checkpoints
from monsoon.errors import ConfigError

from test_checkpoints import cut_after, every_checkpoint_due  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_compressed_sync_run_killed_mid_way_resumes_bit_identical(tmp_path):
    run = tmp_path / "run"
    # long enough that the run is still going at its first checkpoint on a
    # busy machine: the monitor writes one at most 5% of the time, and drops
    # one the workers outran (update 30-500 of 1,600 at 100 epochs, which
    # train in 0.6 s on a quiet machine: twice in five, right after a full
    # suite, that run ended before any), so the kill lands mid-way
    args = dict(epochs=400, seed=0, evals=0, compress="topk:0.1")
    cmd = [sys.executable, "-m", "monsoon", "train", "--problem", "exp", "--strategy", "sync",
           "--workers", "2", "--epochs", "400", "--seed", "0", "--evals", "0", "--quiet",
           "--compress", "topk:0.1", "--checkpoint-every", "30",
           "--out", str(run)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list((run / "checkpoints").glob("ckpt-*.npz")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    saved = sorted((run / "checkpoints").glob("ckpt-*.npz"))
    assert not (run / "summary.json").exists(), "the run finished before the kill"
    resumed = monsoon.train("exp", "sync", 2, resume=str(run), **args)
    assert resumed.summary["resumed_from"] == str(saved[-1])
    whole = monsoon.train("exp", "sync", 2, **args)
    assert resumed.summary["updates"] == whole.summary["updates"] == 400 * 16
    assert np.array_equal(resumed.params, whole.params)


# (engine, strategy, workers, options, checkpoint_every)
MATRIX = {
    "local-serial-adam": ("local", "serial", 1, dict(rule="adam"), 20),
    "local-sync-randk-adagrad-threads": ("local", "sync", 2, dict(
        compress="randk:0.2", rule="adagrad", backend="threads"), 20),
    "local-sync-qsgd-processes": ("local", "sync", 2, dict(compress="qsgd:4"), 20),
    "local-sync-sharded-sign-threads": ("local", "sync", 2, dict(compress="sign",
                                                                 backend="threads"), 20),
    "sim-sync-topk": ("sim", "sync", 2, dict(compress="topk:0.1"), 20),
    "sim-async-randk": ("sim", "async", 2, dict(compress="randk:0.2"), 20),
    "sim-ssp-topk-adam": ("sim", "ssp", 2, dict(compress="topk:0.1", rule="adam"), 20),
    # L-BFGS's correction pairs and line search: 16 full-batch steps
    "local-serial-lbfgs": ("local", "serial", 1, dict(rule="lbfgs", epochs=16), 5),
    "local-sync-adarevision-threads": ("local", "sync", 2, dict(rule="adarevision",
                                                                backend="threads"), 20),
    # AdaRevision's per-worker read of the gradient sum (async on the sim)
    "sim-async-adarevision": ("sim", "async", 2, dict(rule="adarevision"), 20),
    "sim-sync-backup-workers": ("sim", "sync", 2, dict(backup_workers=1), 20),
    # DiLoCo's outer Nesterov momentum: 20 averaging rounds of 4 local steps
    "sim-local-sgd-diloco": ("sim", "local-sgd", 2, dict(diloco=True, local_steps=4,
                                                         steps=80), 5),
    # Local AdaAlter's shared AdaGrad sums (``server/summed.py``)
    "sim-local-sgd-adagrad": ("sim", "local-sgd", 2, dict(rule="adagrad", local_steps=4,
                                                          steps=80), 5),
}


@pytest.mark.parametrize("case", MATRIX)
def test_a_resumed_run_carries_every_state_on(tmp_path, case, monkeypatch):
    engine, strategy, workers, options, every = MATRIX[case]
    if "sharded" in case:
        from monsoon.engines.local import engine as local

        monkeypatch.setattr(local, "replicates", lambda strategy, params: False)
    budget = {} if {"epochs", "steps"} & set(options) else \
        dict(epochs=3) if engine == "local" else dict(steps=60)
    opts = dict(engine=engine, seed=0, evals=0, progress=False, **budget, **options)
    whole = monsoon.train("exp", strategy, workers, out=tmp_path / "a", checkpoint_every=every,
                          **opts)
    if "sharded" in case:
        assert whole.summary["sync_step"] == "sharded"
    kept = cut_after(tmp_path / "a", 1)
    resumed = monsoon.train("exp", strategy, workers, out=tmp_path / "b",
                            resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["resumed_from"] == str(kept[0])
    assert resumed.summary["updates"] == whole.summary["updates"]
    assert np.array_equal(resumed.params, whole.params)


@pytest.mark.parametrize("engine,strategy", [("local", "async")])
def test_a_compressor_state_that_is_not_saved_is_refused_at_resume(tmp_path, engine, strategy):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ConfigError) as err:
        monsoon.train("exp", strategy, 2, engine=engine, compress="topk:0.1", steps=10,
                      resume=str(tmp_path), progress=False)
    line = str(err.value)
    assert "\n" not in line and "compressor state" in line and f"the {engine} engine" in line


def test_a_checkpoint_without_the_compressor_state_is_refused_in_one_line(tmp_path):
    opts = dict(epochs=2, seed=0, evals=0, backend="threads", progress=False)
    monsoon.train("exp", "sync", 2, out=tmp_path / "a", checkpoint_every=10, **opts)
    with pytest.raises(ConfigError) as err:
        monsoon.train("exp", "sync", 2, compress="topk:0.1", resume=str(tmp_path / "a"), **opts)
    line = str(err.value)
    assert "\n" not in line and "holds no compressor state" in line


@pytest.mark.parametrize("strategy,options", [
    ("async", dict(backend="threads")), ("hogwild", dict(backend="processes")),
    ("sync", dict(backup_workers=1, backend="threads"))], ids=["async", "hogwild", "backup"])
def test_a_resumed_run_meets_its_budget_and_does_no_batch_twice(tmp_path, strategy, options):
    """Runs whose workers race (async, hogwild) or whose steps take the first
    N gradients (backup workers) are not deterministic, so the resumed run
    is not bit-identical: it does exactly the rest of the budget. Async and
    hogwild checkpoints are snapshots: each worker resumes after the batches
    whose examples it had counted, so none is done twice (the parameters
    are copied before the counters: every update in the copy is counted);
    an update still in flight as the counters are read may be missing from
    the copy, and is not done again.
    Backup workers' checkpoints are exact (taken at a step boundary).

    The checkpoint is one of a 3-epoch run (its data plan is the first
    half of the 6-epoch run's), so it is before the budget's end whenever
    the monitor wrote it: the monitor of a run this short may only wake
    near its end."""
    opts = dict(seed=0, evals=0, timeout=20, progress=False, **options)
    first = monsoon.train("exp", strategy, 2, epochs=3, out=tmp_path / "a", checkpoint_every=16,
                          **opts)
    kept = cut_after(tmp_path / "a", 1)
    meta = checkpoints.read(kept[0]).meta
    assert meta["exact"] == (strategy == "sync")
    resumed = monsoon.train("exp", strategy, 2, epochs=6, resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["resumed_from"] == str(kept[0])
    budget = 6 * 256  # exp: 256 examples, 16 batches of 16 an epoch
    if meta["exact"]:  # the late gradients: at most the backups' one a step
        assert resumed.summary["updates"] == budget // 16
        assert resumed.summary["late_gradients"] <= budget // 16
        assert resumed.summary["examples"] <= budget
    else:  # an update in flight as the counters were read (one a worker) may be missing
        assert resumed.summary["examples"] == budget
        assert budget // 16 - 2 <= resumed.summary["updates"] <= budget // 16
    assert resumed.summary["final_loss"] < 1.5 * first.summary["final_loss"] + 0.01


def _torch_problem(folder=None, batchnorm=False, dropout=False, rows=64):
    """A small TorchProblem: a lazy Dataset of .npy files (``folder``), or
    ``rows`` in memory; with a BatchNorm layer, whose buffers are trained
    state (``batchnorm="untracked"``: track_running_stats=False, the same
    parameters and no buffers); with Dropout, which draws random masks."""
    import torch
    from torch import nn

    from monsoon.problems import TorchProblem

    torch.manual_seed(5)
    norm = [nn.BatchNorm1d(8, track_running_stats=batchnorm != "untracked")] if batchnorm else []
    net = nn.Sequential(nn.Linear(6, 8), *norm, nn.Tanh(),
                        *([nn.Dropout(0.5)] if dropout else []), nn.Linear(8, 1))
    if folder is not None:
        from lazy_dataset import NpyFolder, Standardise

        return TorchProblem.from_dataset(NpyFolder(folder, Standardise(0.5)), net, nn.MSELoss(),
                                         dtype="float64")
    g = torch.Generator().manual_seed(3)
    X = torch.randn(rows, 6, generator=g, dtype=torch.float64)
    return TorchProblem(net.double(), nn.MSELoss(), X, X[:, :1].sin(), dtype="float64")


@pytest.mark.parametrize("strategy,workers,options", [
    ("serial", 1, {}), ("sync", 2, dict(backend="threads"))])
def test_a_dataset_resumes_at_its_position(tmp_path, strategy, workers, options):
    """A lazy Dataset's position is the step: the resumed run reads (and
    prefetches) the batches after it and ends bit-identical."""
    from lazy_dataset import write_files

    folder = write_files(tmp_path / "npy", n=32)
    opts = dict(lr=0.2, epochs=3, batch_size=8, seed=0, evals=0, progress=False, **options)
    whole = monsoon.train(_torch_problem(folder), strategy, workers, out=tmp_path / "a",
                          checkpoint_every=5, **opts)
    kept = cut_after(tmp_path / "a", 1)
    assert checkpoints.read(kept[0]).meta["positions"][0] == 5
    resumed = monsoon.train(_torch_problem(folder), strategy, workers, resume=str(tmp_path / "a"),
                            **opts)
    assert resumed.summary["examples"] == whole.summary["examples"] == 3 * 32
    assert np.array_equal(resumed.params, whole.params)


@pytest.mark.parametrize("engine,strategy,workers", [("sim", "sync", 2),
                                                    ("local", "serial", 1)])
def test_batchnorm_buffers_survive_the_resume(tmp_path, engine, strategy, workers):
    """BatchNorm's running statistics are trained state: the sim replays its
    run, and a serial run's checkpoints hold them (``buffer.<name>``)."""
    opts = dict(engine=engine, lr=0.2, steps=12, batch_size=16, seed=0, evals=0,
                progress=False)
    whole_problem, resumed_problem = _torch_problem(batchnorm=True), _torch_problem(batchnorm=True)
    whole = monsoon.train(whole_problem, strategy, workers, out=tmp_path / "a",
                          checkpoint_every=4, **opts)
    cut_after(tmp_path / "a", 1)
    resumed = monsoon.train(resumed_problem, strategy, workers, resume=str(tmp_path / "a"),
                            **opts)
    assert np.array_equal(resumed.params, whole.params)
    before, after = whole_problem.state(), resumed_problem.state()
    assert before["1.num_batches_tracked"] == 12 * workers  # the sim: every worker's batches
    for name in before:
        assert np.array_equal(after[name], before[name]), name
    assert resumed.summary["final_loss"] == whole.summary["final_loss"]  # eval mode: the buffers


def test_a_dropout_model_resumes_bit_identical(tmp_path):
    """Dropout draws a mask at every gradient: a worker seeds torch's
    generator before each from (seed, rank, its gradients so far), so the
    resumed run draws the masks the uninterrupted one drew after its
    checkpoint (a generator seeded once would replay the first ones)."""
    opts = dict(lr=0.2, steps=12, batch_size=16, seed=0, evals=0, progress=False)
    whole = monsoon.train(_torch_problem(dropout=True), "serial", out=tmp_path / "a",
                          checkpoint_every=4, **opts)
    assert checkpoints.read(cut_after(tmp_path / "a", 1)[0]).meta["positions"][0] < 12
    resumed = monsoon.train(_torch_problem(dropout=True), "serial", resume=str(tmp_path / "a"),
                            **opts)
    assert np.array_equal(resumed.params, whole.params)


def test_a_resumed_sync_worker_draws_the_uninterrupted_workers_masks():
    """Worker 1 of 2 on 65 rows in batches of 16 has an empty part of each
    epoch's last batch (1 row), and computes no gradient there: resumed
    after 6 steps (one such batch), it is seeded by the gradients its
    program computed (``Strategy.gradients_before``: 5), and its next
    gradient, Dropout mask and all, is the uninterrupted worker's."""
    from monsoon.strategies.base import WorkerJob
    from monsoon.strategies.batches import Budget
    from monsoon.strategies.ops import AllReduce, Gradient
    from monsoon.strategies.sync import Sync

    problem, strategy = _torch_problem(dropout=True, rows=65), Sync()
    w = problem.initial_params(0)

    def first_gradient_after(start_step):
        job = WorkerJob(1, 2, 65, 16, 0, Budget(steps=14), start_step=start_step)
        worker = problem.for_worker(1, 2)
        worker.seed_rng(0, 1, strategy.gradients_before(job))
        program, result, steps = strategy.program(job), None, start_step
        while True:
            op = program.send(result)
            if type(op) is AllReduce:
                steps, result = steps + 1, 0
            elif type(op) is Gradient:
                result = worker.gradient(w, op.indices)
                if steps == 6:
                    return np.array(result[1], copy=True)

    assert strategy.gradients_before(WorkerJob(1, 2, 65, 16, 0, Budget(steps=14),
                                               start_step=6)) == 5
    assert np.array_equal(first_gradient_after(6), first_gradient_after(0))


@pytest.mark.parametrize("engine,strategy", [("ray", "sync"), ("spark", "async")])
def test_buffers_the_checkpoints_do_not_hold_are_refused_at_resume(tmp_path, engine, strategy):
    """Ray's and Spark's workers hold their own buffers, which no checkpoint
    has: --resume refuses the model in one line, before anything starts
    (the local engine's checkpoints hold them: test_checkpoint_buffers.py)."""
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ConfigError) as err:
        monsoon.train(_torch_problem(batchnorm=True), strategy, 2, engine=engine, steps=12,
                      batch_size=16, resume=str(tmp_path), progress=False)
    line = str(err.value)
    assert "\n" not in line and f"checkpoints of {strategy} do not hold the model's buffers" \
        in line, line


def test_a_checkpoint_of_a_stateless_compressor_names_the_setting_that_differs(tmp_path):
    """Written with --no-error-feedback (no residual to keep), resumed with
    it off: the refusal names that setting, not an older monsoon."""
    opts = dict(epochs=2, seed=0, evals=0, backend="threads", progress=False,
                compress="topk:0.1")
    monsoon.train("exp", "sync", 2, out=tmp_path / "a", checkpoint_every=10,
                  no_error_feedback=True, **opts)
    with pytest.raises(ConfigError) as err:
        monsoon.train("exp", "sync", 2, resume=str(tmp_path / "a"), **opts)
    line = str(err.value)
    assert "\n" not in line and "no_error_feedback" in line and "older monsoon" not in line, line


@pytest.mark.parametrize("strategy,rule", [("local-sgd", "momentum"), ("easgd", "adagrad")])
def test_an_inner_rules_state_that_is_not_saved_is_refused_at_resume(tmp_path, strategy, rule):
    """The local engine's checkpoints hold each private copy, not its inner
    rule's state (momentum, AdaGrad's sums): --resume of such a run is
    refused in one line; the sim replays it, and plain sgd keeps none."""
    (tmp_path / "checkpoints").mkdir()
    opts = dict(steps=10, resume=str(tmp_path), backend="threads", progress=False)
    with pytest.raises(ConfigError) as err:
        monsoon.train("exp", strategy, 2, rule=rule, **opts)
    line = str(err.value)
    assert "\n" not in line and "inner rule state" in line and f"--rule {rule}" in line, line
    with pytest.raises(ConfigError) as err:  # sgd: nothing to lose, so the folder's emptiness
        monsoon.train("exp", strategy, 2, **opts)
    assert "inner rule state" not in str(err.value)

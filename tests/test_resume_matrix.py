"""Resuming carries every state a run holds, or refuses in one line.

- A compressed sync run whose monitor is SIGKILLed mid-way, resumed with
  ``--resume``, ends bit-identical to the uninterrupted run: each worker's
  error-feedback residual and compressor state (random stream) is in the
  checkpoint (``engines/local/checkpointing.py``, ``messages.Sender.state``).
- The matrix: each engine that writes checkpoints whose deterministic runs
  are resumed here (local: serial and sync, replicated and sharded, in
  processes and threads; sim: sync, async, ssp), with the options that
  carry state (a compressor's residual, random stream; Adam's and AdaGrad's
  moments), cut after its first checkpoint (as if killed then) and
  resumed, ends bit-identical with the same totals.
  (Ray, Spark and torch: ``test_checkpoints_every_engine.py``.)
- A compressed run whose checkpoints cannot hold the compressor state
  (local async, the torch engine) is refused at ``--resume`` in one line,
  before anything starts."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import monsoon
from monsoon.errors import ConfigError

from test_checkpoints import cut_after, every_checkpoint_due  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]


def test_a_compressed_sync_run_killed_mid_way_resumes_bit_identical(tmp_path):
    run = tmp_path / "run"
    # long enough that the run is still going at its first checkpoint on a
    # quiet machine: the kill lands mid-way, whatever the machine's speed
    args = dict(epochs=80, seed=0, evals=0, compress="topk:0.1")
    cmd = [sys.executable, "-m", "monsoon", "train", "--problem", "exp", "--strategy", "sync",
           "--workers", "2", "--epochs", "80", "--seed", "0", "--evals", "0", "--quiet",
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
    resumed = monsoon.train("exp", "sync", 2, resume=str(run), out=tmp_path / "resumed", **args)
    assert resumed.summary["resumed_from"] == str(saved[-1])
    whole = monsoon.train("exp", "sync", 2, out=tmp_path / "whole", **args)
    assert resumed.summary["updates"] == whole.summary["updates"] == 80 * 16
    assert np.array_equal(resumed.params, whole.params)


# (engine, strategy, workers, options, checkpoint_every)
MATRIX = {
    "local-serial-topk-adam": ("local", "serial", 1, dict(compress="topk:0.1", rule="adam"), 20),
    "local-sync-randk-adagrad-threads": ("local", "sync", 2, dict(
        compress="randk:0.2", rule="adagrad", backend="threads"), 20),
    "local-sync-qsgd-processes": ("local", "sync", 2, dict(compress="qsgd:4"), 20),
    "local-sync-sharded-sign-threads": ("local", "sync", 2, dict(compress="sign",
                                                                 backend="threads"), 20),
    "sim-sync-topk": ("sim", "sync", 2, dict(compress="topk:0.1"), 20),
    "sim-async-randk": ("sim", "async", 2, dict(compress="randk:0.2"), 20),
    "sim-ssp-topk-adam": ("sim", "ssp", 2, dict(compress="topk:0.1", rule="adam"), 20),
}


@pytest.mark.parametrize("case", MATRIX)
def test_a_resumed_run_carries_every_state_on(tmp_path, case, monkeypatch):
    engine, strategy, workers, options, every = MATRIX[case]
    if "sharded" in case:
        from monsoon.engines.local import engine as local

        monkeypatch.setattr(local, "replicates", lambda strategy, params: False)
    budget = dict(epochs=3) if engine == "local" else dict(steps=60)
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


@pytest.mark.parametrize("engine,strategy", [
    ("local", "async"), pytest.param("torch", "sync", marks=pytest.mark.torchrun)])
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

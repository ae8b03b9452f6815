"""The torch engine keeps its arrays where the problem computes (issue 45).

A ``resident`` torch problem keeps its parameters as torch tensors on the
CPU: on gloo with ``reduce_via="backend"`` the ranks then take the path a
GPU on NCCL takes (``rank.py``: replica, rule state and all-reduce buffer
as tensors, the module computing on the replica itself, bucket hooks
writing into device views of the buffer, the flags read back once a
step). Sync with 1 and 2 ranks, in buckets (two of them) and in one
all-reduce after backward, equals the NumPy path (serial on host arrays)
to 1e-9 in float64; a run resumed from its checkpoint ends bit-identical
to the uninterrupted one. tests/test_gpu.py runs the NCCL case on a GPU.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import monsoon
from monsoon import arrays
from monsoon.problems import TorchProblem

pytestmark = pytest.mark.torchrun

ROOT = Path(__file__).resolve().parent.parent
# 10 steps over 200 examples in batches of 64: the fourth batch is short (8)
COMMON = dict(steps=10, batch_size=64, seed=0, progress=False, evals=3, timeout=30)


class Seen(TorchProblem):
    """Writes, one file per process, the kind and address of the parameters
    each backward pass computed at (the ranks run in processes of their own)."""
    log = None

    def _backward(self, w, indices, fresh, on_loss=None):  # under gradient() and backward()
        if self.log is not None:
            with open(Path(self.log) / f"{os.getpid()}.txt", "a") as f:
                f.write(f"{type(w).__name__} {arrays.is_tensor(w) and w.data_ptr()}\n")
        return super()._backward(w, indices, fresh, on_loss)


def _problem(log=None) -> TorchProblem:
    """Two buckets under ``bucket_mb=0.01``: the first (1 MB) takes the last
    two layers, the second the first layer."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(200, 8, generator=g, dtype=torch.float64)
    y = (X[:, :1] * 2 - X[:, 1:2]).sin()
    torch.manual_seed(1)
    module = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4096), nn.Tanh(),
                           nn.Linear(4096, 1)).double()
    problem = Seen(module, nn.MSELoss(), X, y)
    problem.resident = log is not None
    problem.log = None if log is None else str(log)
    return problem


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _seen(log: Path, ranks: int) -> None:
    """Every rank computed on one torch tensor: its replica, never a copy."""
    files = sorted(log.glob("*.txt"))
    assert len(files) == ranks
    for f in files:
        lines = set(f.read_text().splitlines())
        assert len(lines) == 1 and lines.pop().startswith("Tensor "), f.read_text()


@pytest.fixture
def ranks_import_this_module(monkeypatch):
    """The ranks unpickle ``Seen`` from this module."""
    here = Path(__file__).resolve().parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT), str(here), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def serial():
    """The NumPy path's run both cases compare with (made once)."""
    return monsoon.train(_problem(), "serial", lr=0.01, **COMMON)


@pytest.mark.parametrize("ranks,bucket_mb", [(1, 0.01), (2, 0)])
def test_device_arrays_equal_the_numpy_path(ranks, bucket_mb, serial, tmp_path,
                                            ranks_import_this_module):
    run = monsoon.train(_problem(tmp_path), "sync", ranks, engine="torch", lr=0.01,
                        reduce_via="backend", bucket_mb=bucket_mb, **COMMON)
    _seen(tmp_path, ranks)
    assert run.summary["reduce_via"] == "gloo" and run.summary["updates"] == 10
    assert run.summary["bucket_count"] == (2 if bucket_mb else None)
    assert isinstance(run.params, np.ndarray)
    assert _rel(run.params, serial.params) < 1e-9
    assert run.summary["final_loss"] == pytest.approx(serial.summary["final_loss"], rel=1e-9)


def test_two_ranks_in_buckets_resume_from_a_checkpoint(tmp_path, ranks_import_this_module):
    """Momentum (rule state on the device) on 2 ranks in 2 buckets equals
    serial; resumed from its step-5 checkpoint (state restored, then moved
    to the device) it ends bit-identical."""
    opts = dict(COMMON, lr=0.005, rule="momentum", engine="torch", reduce_via="backend",
                bucket_mb=0.01)
    (tmp_path / "a-log").mkdir()
    whole = monsoon.train(_problem(tmp_path / "a-log"), "sync", 2, out=tmp_path / "a",
                          checkpoint_every=5, **opts)
    _seen(tmp_path / "a-log", 2)
    assert whole.summary["bucket_count"] == 2
    serial = monsoon.train(_problem(), "serial", rule="momentum", lr=0.005, **COMMON)
    assert _rel(whole.params, serial.params) < 1e-9
    checkpoint = tmp_path / "a" / "checkpoints"
    assert sorted(p.name for p in checkpoint.glob("ckpt-*.npz")) == \
        ["ckpt-000000000005.npz", "ckpt-000000000010.npz"]
    (checkpoint / "ckpt-000000000010.npz").unlink()
    resumed = monsoon.train(_problem(tmp_path), "sync", 2, resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["resumed_at_step"] == 5 and resumed.summary["updates"] == 10
    np.testing.assert_array_equal(resumed.params, whole.params)

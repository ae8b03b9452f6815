"""The local engine's checkpoints of a model with buffers (BatchNorm's
running statistics) hold them for every strategy, so its runs resume:

- sync (replicated and sharded steps, processes and threads): a run cut
  after a checkpoint, or stopped by SIGTERM, and resumed ends bit-identical
  to the uninterrupted one, parameters and buffers (worker 0's, as DDP's);
- async's checkpoints hold the workers' buffers combined (the mean; the
  largest batch count), and its resumed run carries on;
- a checkpoint of a model whose buffers differ (BatchNorm with and without
  running statistics: the same parameters) is refused in one line, about
  the model, before anything starts or the folder is touched.
"""
import numpy as np
import pytest

import monsoon
from monsoon.errors import Interrupted
from monsoon.record import checkpoints

from test_checkpoints import _interrupt_after_first_checkpoint, _without, cut_after
from test_checkpoints import every_checkpoint_due  # noqa: F401 (a fixture)
from test_resume_matrix import _torch_problem

TRACKED = "1.num_batches_tracked"


def _same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name


@pytest.mark.parametrize("backend,sharded", [("processes", False), ("threads", False),
                                             ("threads", True)])
def test_sync_with_buffers_resumes_bit_identical(tmp_path, monkeypatch, backend, sharded):
    if sharded:
        from monsoon.engines.local import engine

        monkeypatch.setattr(engine, "replicates", lambda strategy, params: False)
    opts = dict(steps=24, batch_size=16, seed=0, evals=0, backend=backend, progress=False)
    whole = monsoon.train(_torch_problem(batchnorm=True), "sync", 2, out=tmp_path / "a",
                          checkpoint_every=10, **opts)
    assert whole.summary["sync_step"] == ("sharded" if sharded else "replicated")
    kept = cut_after(tmp_path / "a", 1)  # as if the run died after its first checkpoint
    held = checkpoints.read(kept[0]).arrays
    assert held["buffer." + TRACKED][0] == 10  # worker 0's, at step 10
    resumed = monsoon.train(_torch_problem(batchnorm=True), "sync", 2,
                            resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["resumed_from"] == str(kept[0])
    assert np.array_equal(resumed.params, whole.params)
    _same_state(resumed.state, whole.state)
    assert whole.state[TRACKED] == 24


@pytest.mark.parametrize("worker0_past", [False, True])
def test_sync_with_buffers_stopped_by_sigterm_resumes_bit_identical(tmp_path, monkeypatch,
                                                                    worker0_past):
    """The final checkpoint holds worker 0's buffers at the stop's step
    boundary; ``worker0_past``: worker 0 leaves the stop to worker 1, so it
    has done the next step's forward pass when it stops (as where it passed
    the boundary just before the stop was asked for), and puts its buffers
    back."""
    from monsoon.engines.local import synchronous
    from monsoon.engines.local.store import STOP, STOP_AT

    boundary = synchronous._Step._boundary
    if worker0_past:

        def leave_the_stop_to_worker_1(step):
            if step.rank == 0 and step.control[STOP] and not step.control[STOP_AT]:
                return
            boundary(step)

        monkeypatch.setattr(synchronous._Step, "_boundary", leave_the_stop_to_worker_1)
    out = tmp_path / "a"
    opts = dict(steps=400, batch_size=16, seed=0, evals=0, backend="threads", progress=False)

    _interrupt_after_first_checkpoint(out)
    with pytest.raises(Interrupted):
        monsoon.train(_torch_problem(batchnorm=True), "sync", 2, out=out,
                      checkpoint_every=20, **opts)
    final = sorted((out / "checkpoints").glob("ckpt-*.npz"))[-1]
    meta = checkpoints.read(final).meta
    assert meta["reason"] == "interrupted" and meta["updates"] < 400
    monkeypatch.setattr(synchronous._Step, "_boundary", boundary)
    resumed = monsoon.train(_torch_problem(batchnorm=True), "sync", 2, resume=str(out), **opts)
    assert resumed.summary["resumed_from"] == str(final)
    whole = monsoon.train(_torch_problem(batchnorm=True), "sync", 2, **opts)
    assert np.array_equal(resumed.params, whole.params)
    _same_state(resumed.state, whole.state)


def test_async_with_buffers_carries_on_from_the_checkpoints_buffers(tmp_path):
    opts = dict(steps=60, batch_size=16, seed=0, evals=0, backend="processes", progress=False)
    start = _torch_problem(batchnorm=True).state()
    monsoon.train(_torch_problem(batchnorm=True), "async", 2, out=tmp_path / "a",
                  checkpoint_every=20, **opts)
    kept = cut_after(tmp_path / "a", 1)
    held = checkpoints.read(kept[0]).arrays
    assert held["buffer." + TRACKED][0] >= 1  # the workers' buffers, not the starting ones
    resumed = monsoon.train(_torch_problem(batchnorm=True), "async", 2,
                            resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["status"] == "finished"
    state = resumed.state
    assert all(np.isfinite(state[name]).all() for name in state)
    assert not np.array_equal(state["1.running_mean"], start["1.running_mean"])


@pytest.mark.parametrize("wrote,resumes,told", [
    (True, "untracked", "this model has none, the checkpoint holds 3: "),
    ("untracked", True, "the checkpoint holds none, this model has 3: "),
], ids=["buffers-dropped", "buffers-added"])
@pytest.mark.parametrize("older", [False, True], ids=["", "older"])
def test_a_checkpoint_of_a_model_whose_buffers_differ_is_refused_before_anything(
        tmp_path, wrote, resumes, told, older):
    """Resuming into a model without the checkpoint's buffers failed
    mid-start ('NoneType' object has no attribute 'items'), lost the
    previous run's model.pt and offered the same checkpoint again; one with
    buffers the checkpoint lacks was blamed on an older monsoon. ``older``:
    a checkpoint written before its meta named the model's buffers, told
    by its arrays (one holding none may be an older monsoon's, and says
    so)."""
    out = tmp_path / "a"
    opts = dict(batch_size=16, seed=0, evals=0, backend="threads", progress=False)
    monsoon.train(_torch_problem(batchnorm=wrote), "sync", 2, out=out, checkpoint_every=10,
                  steps=20, **opts)
    for path in out.glob("checkpoints/ckpt-*.npz"):
        if older:
            _without(path, "buffers")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(checkpoints.CheckpointError) as info:
        monsoon.train(_torch_problem(batchnorm=resumes), "sync", 2, out=out, resume=str(out),
                      checkpoint_every=10, steps=40, **opts)
    line = str(info.value)
    assert "\n" not in line, line
    if older and wrote == "untracked":
        assert "holds no model buffers and this model has 3 " in line, line
        assert "written for a model without them" in line, line
    else:
        assert "written for another model: its buffers differ from this model's" in line, line
        assert told + "1.num_batches_tracked, 1.running_mean, 1.running_var" in line, line
        assert "older monsoon" not in line, line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before

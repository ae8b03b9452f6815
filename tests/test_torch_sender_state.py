"""The torch engine's sync checkpoints hold every rank's compressor state
and every rank's traffic (``rank.RankWorker.gather_ranks``): a run with
error feedback, resumed with ``--resume`` from a periodic checkpoint or
restarted after a rank dies (``--max-restarts``), ends bit-identical to the
uninterrupted run, parameters and traffic alike, and so does an
uncompressed one, and so does a BatchNorm model's, whose checkpoints hold
every rank's buffers; a restart resumes only its own launch's checkpoints."""
import json
import os
import shutil

import numpy as np
import pytest

import monsoon
from monsoon import api
from monsoon.errors import ConfigError, Interrupted
from monsoon.problems import make_problem
from monsoon.record import checkpoints

from faulty import ExitOnce, SignalOnce
from test_checkpoints import cut_after

pytestmark = pytest.mark.torchrun

OPTS = dict(engine="torch", dtype="float64", steps=40, batch_size=16, lr=0.05, seed=0, evals=0,
            progress=False, timeout=30, compress="topk:0.1", checkpoint_every=10)
TRAFFIC = ("bytes_sent", "bytes_received", "bytes_sent_per_worker",
           "bytes_received_per_worker", "residual_norm")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run of a --compress, and its folder (each run once)."""
    done = {}

    def whole(compress: str):
        if compress not in done:
            out = tmp_path_factory.mktemp("whole") / "a"
            done[compress] = out, monsoon.train("exp", "sync", 2, out=out,
                                                **dict(OPTS, compress=compress))
        return done[compress]
    return whole


@pytest.fixture(scope="module")
def whole(runs):
    """The uninterrupted top-k run, and its folder."""
    return runs(OPTS["compress"])


def _same_run(run, whole) -> None:
    assert run.summary["updates"] == whole.summary["updates"] == OPTS["steps"]
    np.testing.assert_array_equal(run.params, whole.params)
    for key in TRAFFIC:
        assert run.summary[key] == whole.summary[key], key


def test_a_resumed_compressed_run_ends_bit_identical(whole, tmp_path):
    """Cut after the first checkpoint (step 10, as if the run died then):
    each rank's residual comes back from it, and so does the traffic."""
    out, run = whole
    held = checkpoints.read(checkpoints.checkpoint_files(out / "checkpoints")[0]).arrays
    assert held["sender.residual"].shape == (2, run.params.size)
    kept = cut_after(out, 1)
    resumed = monsoon.train("exp", "sync", 2, resume=str(out), out=tmp_path / "b", **OPTS)
    assert resumed.summary["resumed_from"] == str(kept[0])
    _same_run(resumed, run)


@pytest.mark.parametrize("compress", [OPTS["compress"], "none"])
def test_a_restarted_run_ends_bit_identical(runs, tmp_path, compress):
    """Rank 1 exits after its 25th gradient; the restarted attempt resumes
    from the step-20 checkpoint with every rank's sender (top-k's
    residuals) and traffic, which every sync run's checkpoints hold."""
    dying = ExitOnce(make_problem("exp", "float64"), tmp_path / "exited", rank=1, after=25)
    run = monsoon.train(dying, "sync", 2, out=tmp_path / "r", max_restarts=1,
                        **dict(OPTS, compress=compress))
    assert run.summary["restarts"] == 1 and run.summary["resumed_at_step"] == 20
    _same_run(run, runs(compress)[1])


def test_a_checkpoint_without_the_compressor_state_is_refused_before_any_rank_starts(
        whole, tmp_path):
    """An older monsoon's checkpoints of the same settings hold no sender
    arrays: --resume refuses them in one line, before any rank starts
    (``TorchEngine.checkpoint_shapes``), and says to start a new run."""
    folder = tmp_path / "old" / "checkpoints"
    shutil.copytree(whole[0] / "checkpoints", folder)
    for path in checkpoints.checkpoint_files(folder):
        held = checkpoints.read(path)
        kept = {k: v for k, v in held.arrays.items() if not k.startswith("sender.")}
        np.savez(path, meta=np.frombuffer(json.dumps(held.meta).encode(), np.uint8), **kept)
    with pytest.raises(ConfigError) as err:
        monsoon.train("exp", "sync", 2, resume=str(folder.parent), out=tmp_path / "b", **OPTS)
    line = str(err.value)
    assert "\n" not in line and "holds no compressor state" in line \
        and "start a new run" in line, line
    assert not (tmp_path / "b" / "summary.json").exists()


def test_an_interrupted_run_without_periodic_checkpoints_resumes_bit_identical(whole, tmp_path):
    """Ctrl-C mid-run, --checkpoint-every 0: rank 0 alone knows the run was
    interrupted, and tells the others, whose states then come with their
    end reports (``rank._writes_final``) into its one checkpoint."""
    opts = dict(OPTS, checkpoint_every=0)
    stopper = SignalOnce(make_problem("exp", "float64"), os.getpid(), rank=1, after=15,
                         pause=0.3)
    with pytest.raises(Interrupted):
        monsoon.train(stopper, "sync", 2, out=tmp_path / "i", **opts)
    resumed = monsoon.train("exp", "sync", 2, resume=str(tmp_path / "i"), out=tmp_path / "b",
                            **opts)
    assert 15 <= resumed.summary["resumed_at_step"] < OPTS["steps"]
    _same_run(resumed, whole[1])


def test_a_restart_never_resumes_an_earlier_runs_checkpoint(whole, tmp_path):
    """A new run in an earlier run's folder, of the same identity (the
    budget and checkpoint spacing are not in it), without checkpoints of
    its own: its restart starts the run over, as a fresh run, and resumes
    none of the earlier run's (only those of its own launch stay)."""
    out = tmp_path / "x"
    shutil.copytree(whole[0], out)
    dying = ExitOnce(make_problem("exp", "float64"), tmp_path / "exited", rank=1, after=5)
    run = monsoon.train(dying, "sync", 2, out=out, max_restarts=1,
                        **{**OPTS, "checkpoint_every": 0})
    assert run.summary["restarts"] == 1 and "resumed_from" not in run.summary
    _same_run(run, whole[1])
    assert checkpoints.checkpoint_files(out / "checkpoints") == []


@pytest.mark.parametrize("same", [True, False], ids=["its-launch", "another-launch"])
def test_a_torchrun_restart_keeps_its_own_launchs_checkpoints_alone(whole, tmp_path,
                                                                   monkeypatch, same):
    """Under torchrun each attempt's rank 0 starts the run folder again
    (``api._set_aside``): the checkpoints of its launch (the meta's
    ``launch``, TORCHELASTIC_RUN_ID) stay, an earlier launch's go."""
    from monsoon.engines.torchrun.engine import TorchEngine

    folder = tmp_path / "checkpoints"
    shutil.copytree(whole[0] / "checkpoints", folder)
    held = checkpoints.read(checkpoints.checkpoint_files(folder)[0]).meta
    for key, value in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                           TORCHELASTIC_RUN_ID="none").items():
        monkeypatch.setenv(key, value)
    # torchrun's default id is no launch's own: a first attempt keeps none
    assert TorchEngine.restarted_launch() is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert TorchEngine.restarted_launch() == "none"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", held["launch"] if same else "other")
    launch = TorchEngine.restarted_launch()
    removed = checkpoints.remove_others(folder, held, {}, keep_mine=True, launch=launch)
    assert bool(removed) != same and bool(checkpoints.checkpoint_files(folder)) == same


def test_a_batchnorm_run_resumes_bit_identical_every_ranks_buffers_included(tmp_path):
    """BatchNorm's running statistics are each rank's own (from its
    batches): sync's checkpoints hold every rank's (``buffer.<name>``,
    ranks first), each resumed rank restores its own, and the resumed run
    ends as the uninterrupted one: parameters, the model's buffers (rank
    0's), the loss in eval mode and every rank's buffers in the final
    checkpoint. A restart resumes the same way, so restarts are taken."""
    from test_resume_matrix import _torch_problem

    opts = dict(OPTS, compress="none", lr=0.2, steps=12, checkpoint_every=4)
    whole_problem, resumed_problem = _torch_problem(batchnorm=True), _torch_problem(batchnorm=True)
    api.check(whole_problem, "sync", 2, out=tmp_path / "a", max_restarts=1, **opts)
    whole = monsoon.train(whole_problem, "sync", 2, out=tmp_path / "a", **opts)
    final = checkpoints.read(checkpoints.checkpoint_files(tmp_path / "a" / "checkpoints")[0])
    assert final.arrays["buffer.1.running_mean"].shape == (2, 8)
    assert not np.array_equal(*final.arrays["buffer.1.running_mean"])  # each rank's own
    cut_after(tmp_path / "a", 1)
    resumed = monsoon.train(resumed_problem, "sync", 2, resume=str(tmp_path / "a"),
                            out=tmp_path / "b", **opts)
    assert resumed.summary["resumed_at_step"] == 4
    np.testing.assert_array_equal(resumed.params, whole.params)
    for name, value in whole_problem.state().items():
        assert np.array_equal(resumed_problem.state()[name], value), name
    assert resumed.summary["final_loss"] == whole.summary["final_loss"]
    again = checkpoints.read(checkpoints.checkpoint_files(tmp_path / "b" / "checkpoints")[0])
    for name in (k for k in final.arrays if k.startswith("buffer.")):
        assert np.array_equal(again.arrays[name], final.arrays[name]), name


def test_a_restarted_rank_that_cannot_see_the_folder_follows_rank_0(tmp_path):
    """Another node, no shared file system: rank 1 sees no checkpoint in its
    run folder, rank 0 does. Rank 1 must enter the same broadcasts as rank 0
    (it returned a fresh start and met rank 0's checkpoint broadcast with
    its own parameters' one) and start where rank 0's checkpoint says."""
    from types import SimpleNamespace

    from monsoon.engines.torchrun.rank import _resume_point
    from monsoon.strategies.sync import Sync

    found = object()  # rank 0's checkpoint, as its broadcast hands it over
    sent = [True, found]  # what rank 0 broadcasts, in order

    class Rank1:
        rank, world, attempt = 1, 2, 1

        def broadcast_object(self, obj):
            assert obj is None  # rank 1 sends nothing of its own
            return sent.pop(0)

    engine = SimpleNamespace(resume_dir=None, checkpoint_dir=str(tmp_path / "none-here"))
    start = _resume_point(engine, Rank1(), None, Sync(), np.zeros(3), None)
    assert start is found and not sent


def test_a_restart_after_a_resume_of_another_folder_resumes_its_own(whole, tmp_path):
    """--resume A (its oldest kept checkpoint: step 20) --out B, rank 1 lost
    at step 35: the restart resumes B's step-30 checkpoint (this launch's),
    not A's step 20 again."""
    shutil.copytree(whole[0] / "checkpoints", tmp_path / "a" / "checkpoints")
    cut_after(tmp_path / "a", 1)
    dying = ExitOnce(make_problem("exp", "float64"), tmp_path / "exited", rank=1, after=15)
    run = monsoon.train(dying, "sync", 2, resume=str(tmp_path / "a"), out=tmp_path / "b",
                        max_restarts=1, **OPTS)
    assert run.summary["restarts"] == 1 and run.summary["resumed_at_step"] == 30
    assert run.summary["resumed_from"].startswith(str(tmp_path / "b"))
    _same_run(run, whole[1])

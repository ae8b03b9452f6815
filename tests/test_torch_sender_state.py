"""The torch engine's sync checkpoints hold every rank's compressor state
(``rank.RankWorker.gather_senders``): a run with error feedback, resumed
with ``--resume`` from a periodic checkpoint or restarted after a rank
dies (``--max-restarts``), ends bit-identical to the uninterrupted run,
parameters and traffic alike."""
import numpy as np
import pytest

import monsoon
from monsoon.problems import make_problem
from monsoon.record import checkpoints

from faulty import ExitOnce
from test_checkpoints import cut_after

pytestmark = pytest.mark.torchrun

OPTS = dict(engine="torch", dtype="float64", steps=40, batch_size=16, lr=0.05, seed=0, evals=0,
            progress=False, timeout=30, compress="topk:0.1", checkpoint_every=10)
TRAFFIC = ("bytes_sent", "bytes_received", "bytes_sent_per_worker",
           "bytes_received_per_worker", "residual_norm")


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted run, and its folder."""
    out = tmp_path_factory.mktemp("whole") / "a"
    return out, monsoon.train("exp", "sync", 2, out=out, **OPTS)


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


def test_a_restarted_compressed_run_ends_bit_identical(whole, tmp_path):
    """Rank 1 exits after its 25th gradient; the restarted attempt resumes
    from the step-20 checkpoint with every rank's sender."""
    dying = ExitOnce(make_problem("exp", "float64"), tmp_path / "exited", rank=1, after=25)
    run = monsoon.train(dying, "sync", 2, out=tmp_path / "r", max_restarts=1, **OPTS)
    assert run.summary["restarts"] == 1 and run.summary["resumed_at_step"] == 20
    _same_run(run, whole[1])


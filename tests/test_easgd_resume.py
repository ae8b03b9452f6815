"""EASGD resumed on the local engine: each worker carries on from the
private copy x_i its checkpoint holds. The program's first Fetch (x_i =
the centre, at a fresh start) meets the centre without replacing the copy;
before, a resumed worker restarted from the centre, and the run ended
unlike the uninterrupted one."""
import numpy as np

import monsoon
from monsoon.record import checkpoints

KW = dict(seed=0, evals=0, easgd_tau=3, lr=0.05)


def test_a_resumed_easgd_worker_keeps_its_private_copy(tmp_path):
    """One worker (so one order of exchanges): cut at an exchange (18
    steps, tau 3), resumed to 42, it ends bit-identical to 42 steps run
    through."""
    full = monsoon.train("exp", "easgd", 1, steps=42, **KW)
    cut = monsoon.train("exp", "easgd", 1, steps=18, out=str(tmp_path / "a"), checkpoint_every=2,
                        **KW)
    saved = checkpoints.read(checkpoints.checkpoint_files(tmp_path / "a" / "checkpoints")[0])
    assert saved.meta["positions"] == [18]
    # the copy differs from the centre: a Fetch that took the centre would show
    assert not np.array_equal(saved.arrays["worker.0.params"], cut.params)
    resumed = monsoon.train("exp", "easgd", 1, steps=42, out=str(tmp_path / "b"),
                            resume=str(tmp_path / "a"), **KW)
    np.testing.assert_array_equal(resumed.params, full.params)
    assert resumed.summary["updates"] == full.summary["updates"]

"""Every engine that writes checkpoints (local, sim, ray, spark, torch) keeps
them in the one format of ``record/checkpoints.py``, and on every one:

- another run's checkpoint is refused by ``monsoon train --resume`` in one
  line on stderr, no traceback, exit code 2, before any worker starts;
- a damaged newest checkpoint is passed over (named on stderr) for the
  previous good one;
- a sync run resumed from it ends bit-identical to an uninterrupted run,
  with the same totals.

One uninterrupted sync run per engine (module-scoped) writes the folder the
tests resume from; each test works on its own copy of it."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import monsoon
from monsoon.record import checkpoints

ROOT = Path(__file__).resolve().parents[1]

# engine: (problem, workers, monsoon.train options of the whole run, checkpoint_every)
RUNS = {
    "local": ("exp", 2, dict(epochs=60, evals=10, backend="threads"), 100),
    "sim": ("exp", 2, dict(steps=60, evals=10, sim_compute_sigma=0.5), 20),
    # NumPy: the actors (2 workers, 2 shards) and the refused CLI run import no torch
    "ray": ("logistic", 2, dict(steps=40, batch_size=64, evals=10, timeout=60, shards=2), 10),
    "spark": ("logistic", 2, dict(steps=6, batch_size=512, rule="momentum", lr=0.5, evals=0),
              2),
    "torch": ("exp", 2, dict(steps=150, evals=10, timeout=30), 50),
}
MARKS = {"ray": [pytest.mark.ray], "spark": [pytest.mark.spark, pytest.mark.slow],
         "torch": [pytest.mark.torchrun, pytest.mark.slow]}


def _train(engine, folder=None, **extra):
    problem, workers, opts, _ = RUNS[engine]
    return monsoon.train(problem, "sync", workers, engine=engine, seed=0, dtype="float64",
                         progress=False, out=folder, **{**opts, **extra})


@pytest.fixture(scope="module", params=[pytest.param(e, marks=MARKS.get(e, []))
                                        for e in RUNS])
def whole(request, tmp_path_factory):
    """(engine, the uninterrupted run, its folder with checkpoints)."""
    engine = request.param
    if engine == "ray":
        pytest.importorskip("ray")
        request.getfixturevalue("local_ray")
    if engine == "spark":
        from spark_env import spark_session

        session = spark_session("local[2]")
        session.__enter__()
        request.addfinalizer(lambda: session.__exit__(None, None, None))
    if engine == "torch":
        pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp(engine) / "whole"
    with pytest.MonkeyPatch.context() as mp:
        _no_cost_floor(mp)
        run = _train(engine, folder, checkpoint_every=RUNS[engine][3])
    files = sorted((folder / "checkpoints").glob("ckpt-*.npz"))
    assert len(files) >= 2, files
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == [f.name for f in files]
    meta = checkpoints.read(files[-1]).meta
    assert meta["problem"] == RUNS[engine][0] and meta["strategy"] == "sync"
    return engine, run, folder


def _no_cost_floor(mp):
    """The local engine spaces checkpoints of microsecond steps (it has its
    own test); here every one that falls due is written."""
    from monsoon.engines.local import checkpointing

    mp.setattr(checkpointing, "COST_FACTOR", 0)


def test_another_runs_checkpoint_is_refused_in_one_line(whole, tmp_path):
    engine, _, folder = whole
    problem, workers, opts, _ = RUNS[engine]
    same = [arg for key in ("steps", "epochs", "batch_size", "rule", "lr") if key in opts
            for arg in ("--" + key.replace("_", "-"), str(opts[key]))]
    proc = subprocess.run(
        [sys.executable, "-m", "monsoon", "train", "--engine", engine, "--problem", problem,
         "--strategy", "sync", "--workers", str(workers), *same, "--seed", "1",
         "--dtype", "float64", "--quiet", "--resume", str(folder), "--out",
         str(tmp_path / "other")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "is from another run: its seed is 0, this run's is 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "other" / "summary.json").exists()


def test_a_damaged_newest_falls_back_and_the_resumed_run_ends_bit_identical(whole, tmp_path,
                                                                             capfd):
    engine, run, folder = whole
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    files = sorted((copy / "checkpoints").glob("ckpt-*.npz"))
    files[-1].write_bytes(files[-1].read_bytes()[:1000])  # a torn write
    resumed = _train(engine, tmp_path / "resumed", resume=str(copy))
    err = capfd.readouterr().err
    assert f"{files[-1]} is corrupt or partial" in err and f"using the older {files[-2].name}" \
        in err
    assert resumed.summary["resumed_from"] == str(files[-2])
    np.testing.assert_array_equal(resumed.params, run.params)
    assert resumed.summary["updates"] == run.summary["updates"]
    assert resumed.summary["examples"] == run.summary["examples"]

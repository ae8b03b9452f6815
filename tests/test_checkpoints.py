"""Checkpoints on the local and sim engines: written atomically, resumed bit
for bit where the run is deterministic, and refused in one line when they
are damaged or belong to another run (an older good one is then used)."""
import contextlib
import io
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

import monsoon
from monsoon.cli import main
from monsoon.record import checkpoints
from monsoon.errors import ConfigError, RunFailed
from monsoon.record import recorder as recorder_module



@pytest.fixture(autouse=True)
def every_checkpoint_due(monkeypatch, request):
    """Tiny models step in microseconds, so the cost floor (a checkpoint waits
    19x the last one's write time) would skip most checkpoints these tests
    count on; it has its own test."""
    if "cost_floor" not in request.node.name:
        from monsoon.engines.local import checkpointing

        monkeypatch.setattr(checkpointing, "COST_FACTOR", 0)


def cut_after(run_dir: Path, keep: int) -> list[Path]:
    """Keep only the ``keep`` oldest checkpoints: as if the run died then."""
    files = sorted((run_dir / "checkpoints").glob("ckpt-*.npz"))
    for f in files[keep:]:
        f.unlink()
    return files[:keep]


@pytest.mark.parametrize("strategy,workers,rule", [("serial", 1, "adam"), ("sync", 2, "adagrad")])
def test_a_resumed_run_ends_bit_identical(tmp_path, strategy, workers, rule):
    opts = dict(epochs=5, seed=0, rule=rule, evals=10)
    whole = monsoon.train("exp", strategy, workers, out=tmp_path / "a", checkpoint_every=30,
                          **opts)
    kept = cut_after(tmp_path / "a", 1)
    assert kept[0].name == "ckpt-000000000030.npz"
    resumed = monsoon.train("exp", strategy, workers, out=tmp_path / "b",
                            resume=str(tmp_path / "a"), **opts)
    assert np.array_equal(resumed.params, whole.params)
    assert resumed.summary["updates"] == whole.summary["updates"]
    assert resumed.summary["examples"] == whole.summary["examples"]
    # the curve carries on: the rows before the checkpoint come first
    assert resumed.history[0] == whole.history[0]
    assert [r["updates"] for r in resumed.history] == sorted(r["updates"] for r in resumed.history)


def test_sharded_sync_resumes_bit_identical(tmp_path, monkeypatch):
    from monsoon.engines.local import engine

    monkeypatch.setattr(engine, "replicates", lambda strategy, params: False)
    opts = dict(epochs=20, seed=0, rule="adam", evals=10)
    whole = monsoon.train("exp", "sync", 2, out=tmp_path / "a", checkpoint_every=100, **opts)
    assert whole.summary["sync_step"] == "sharded"
    assert cut_after(tmp_path / "a", 1)
    resumed = monsoon.train("exp", "sync", 2, resume=str(tmp_path / "a"), **opts)
    assert np.array_equal(resumed.params, whole.params)


@pytest.mark.parametrize("strategy,every", [("async", 30), ("hogwild", 30), ("local-sgd", 5),
                                            ("easgd", 8)])
def test_other_strategies_checkpoint_and_carry_on(tmp_path, strategy, every):
    first = monsoon.train("exp", strategy, 2, epochs=6, seed=0, out=tmp_path / "a",
                          checkpoint_every=every, timeout=20)
    kept = cut_after(tmp_path / "a", 1)
    meta = checkpoints.read(kept[0]).meta
    assert meta["exact"] is False and len(meta["positions"]) == 2
    resumed = monsoon.train("exp", strategy, 2, epochs=6, seed=0, resume=str(tmp_path / "a"),
                            timeout=20)
    # the budget is not done again: the resumed run does the rest of it
    assert resumed.summary["examples"] == pytest.approx(first.summary["examples"], rel=0.15)
    assert resumed.summary["final_loss"] < 2 * first.summary["final_loss"] + 0.05


def test_the_cost_floor_spaces_checkpoints_of_fast_steps(tmp_path, monkeypatch):
    from monsoon.engines.local import checkpointing

    writes = []
    save = checkpoints.save
    monkeypatch.setattr(checkpoints, "save", lambda *a, **k: writes.append(1) or save(*a, **k))
    monkeypatch.setattr(checkpointing, "COST_FACTOR", 10_000)
    run = monsoon.train("exp", "serial", epochs=5, out=tmp_path, checkpoint_every=1, evals=0)
    assert run.summary["updates"] == 80 and 1 <= len(writes) < 10


@pytest.mark.slow
def test_the_monitor_wakes_for_each_checkpoint_as_it_falls_due(tmp_path, monkeypatch):
    """Workers fill the checkpoint buffer, the monitor writes the file, and
    until it has taken it, the workers wait at the next checkpoint step. The
    monitor sleeps between loss-curve rows (a wake-up preempts a worker), so
    it also wakes when the next checkpoint is due at the run's pace: 3,200
    sync steps with one every 500 write all 6 (on a fast machine the
    monitor slept through the run and wrote the step-500 one at its end)."""
    writes = []
    save = checkpoints.save
    monkeypatch.setattr(checkpoints, "save", lambda *a, **k: writes.append(1) or save(*a, **k))
    run = monsoon.train("exp", "sync", 2, epochs=200, seed=0, evals=10, out=tmp_path,
                        checkpoint_every=500)
    assert run.summary["updates"] == 3200 and len(writes) == 6, len(writes)


@pytest.mark.parametrize("step", ["replicated", "sharded"])
def test_sync_writes_every_checkpoint_despite_the_cost_floor_and_a_slow_monitor(
        tmp_path, monkeypatch, step):
    """Each write takes 50 ms: the cost floor (19x that) and workers that
    outrun the monitor would skip most of these 16 checkpoints. Sync's
    workers instead wait at a checkpoint step until the monitor has taken
    the previous one out of the buffer: every one is written, in order, and
    the last one too."""
    from monsoon.engines.local import engine

    if step == "sharded":
        monkeypatch.setattr(engine, "replicates", lambda strategy, params: False)
    writes = []
    save = checkpoints.save

    def slow_save(directory, updates, *args, **kwargs):
        time.sleep(0.05)
        writes.append(updates)
        return save(directory, updates, *args, **kwargs)

    monkeypatch.setattr(checkpoints, "save", slow_save)
    run = monsoon.train("exp", "sync", 2, epochs=50, seed=0, evals=5, out=tmp_path,
                        checkpoint_every=50, timeout=20)
    assert run.summary["sync_step"] == step and run.summary["updates"] == 800
    assert writes == list(range(50, 801, 50))


def test_only_the_newest_three_are_kept(tmp_path):
    monsoon.train("exp", "serial", epochs=5, out=tmp_path, checkpoint_every=10)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("*"))
    assert names == ["ckpt-000000000060.npz", "ckpt-000000000070.npz", "ckpt-000000000080.npz"]


def _good_run(tmp_path) -> Path:
    """Serial writes its checkpoints inline: all three are there."""
    monsoon.train("exp", "serial", epochs=3, seed=0, out=tmp_path / "a", checkpoint_every=16,
                  evals=0)
    assert len(list((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))) == 3
    return tmp_path / "a"


def test_a_truncated_checkpoint_is_refused_in_one_line(tmp_path):
    run = _good_run(tmp_path)
    newest = sorted((run / "checkpoints").glob("ckpt-*.npz"))[-1]
    data = newest.read_bytes()
    for tenth in range(10):
        newest.write_bytes(data[:len(data) * tenth // 10])
        with pytest.raises(checkpoints.CheckpointError) as info:
            checkpoints.read(newest)
        assert "corrupt or partial" in str(info.value) and "\n" not in str(info.value)
    # a flipped byte in the middle: the zip's CRC catches it
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(damaged))
    with pytest.raises(checkpoints.CheckpointError, match="corrupt or partial"):
        checkpoints.read(newest)


def test_a_damaged_newest_checkpoint_falls_back_to_an_older_good_one(tmp_path, capsys):
    run = _good_run(tmp_path)
    files = sorted((run / "checkpoints").glob("ckpt-*.npz"))
    files[-1].write_bytes(files[-1].read_bytes()[:1000])
    resumed = monsoon.train("exp", "serial", epochs=3, seed=0, resume=str(run), evals=0)
    assert resumed.summary["resumed_from"] == str(files[-2])
    err = capsys.readouterr().err
    assert f"{files[-1]} is corrupt or partial" in err and files[-2].name in err
    whole = monsoon.train("exp", "serial", epochs=3, seed=0, evals=0)
    assert np.array_equal(resumed.params, whole.params)


def test_a_damaged_newest_checkpoint_in_the_run_folder_is_named_not_dropped(tmp_path, capsys):
    """--resume into the folder it resumes from (the command line's way):
    the damaged newest checkpoint is named in one line with the one used
    instead, and is not deleted before the resume could name it."""
    run = _good_run(tmp_path)
    files = sorted((run / "checkpoints").glob("ckpt-*.npz"))
    damaged = files[-1].read_bytes()[:1000]
    files[-1].write_bytes(damaged)
    capsys.readouterr()
    resumed = monsoon.train("exp", "serial", epochs=3, seed=0, out=run, resume=str(run),
                            evals=0, checkpoint_every=16)
    assert resumed.summary["resumed_from"] == str(files[-2])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"{files[-1]} is corrupt or partial" in err[0] and files[-2].name in err[0], err
    # the resumed run wrote that step again: its own checkpoint, and the
    # damaged file moved aside, the user's to look at (it was written over)
    checkpoints.read(files[-1])
    assert files[-1].with_name(files[-1].name + ".damaged").read_bytes() == damaged


def test_a_new_run_moves_a_damaged_checkpoint_aside_in_one_line(tmp_path, capsys):
    run = _good_run(tmp_path)
    files = sorted((run / "checkpoints").glob("ckpt-*.npz"))
    files[-1].write_bytes(files[-1].read_bytes()[:1000])
    capsys.readouterr()
    monsoon.train("exp", "serial", epochs=1, seed=0, out=run, evals=0)
    err = capsys.readouterr().err.strip().splitlines()
    aside = files[-1].with_name(files[-1].name + ".damaged")
    assert len(err) == 1 and f"{files[-1]} is corrupt or partial" in err[0], err
    assert aside.name in err[0] and aside.read_bytes() and not files[-1].exists()


def _without(path: Path, key: str) -> None:
    """Rewrite the checkpoint ``path`` without its meta key or array ``key``,
    as a hand edit, or a writer that left it out, would."""
    members = dict(np.load(path, allow_pickle=False))
    meta = json.loads(members["meta"].tobytes().decode())
    del (meta if key in meta else members)[key]
    members["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **members)


@pytest.mark.parametrize("key", ["positions", "rows", "counters"])
def test_an_incomplete_checkpoint_is_passed_over_as_a_damaged_one(tmp_path, capsys, key):
    """A checkpoint without a meta key or array its writer always writes
    (a missing ``positions`` started every worker at step 0, past the
    budget; a missing ``rows`` failed the run with a KeyError) is not whole:
    the older good one is used, named with it in one line, and the resumed
    run moves it aside when it writes that step again."""
    run = _good_run(tmp_path)
    files = sorted((run / "checkpoints").glob("ckpt-*.npz"))
    _without(files[-1], key)
    capsys.readouterr()
    resumed = monsoon.train("exp", "serial", epochs=3, seed=0, out=run, resume=str(run),
                            evals=0, checkpoint_every=16)
    assert resumed.summary["resumed_from"] == str(files[-2])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{files[-1]} is incomplete" in err[0], err
    assert key in err[0] and files[-2].name in err[0], err
    assert files[-1].with_name(files[-1].name + ".damaged").exists()
    whole = monsoon.train("exp", "serial", epochs=3, seed=0, evals=0)
    assert np.array_equal(resumed.params, whole.params)
    assert resumed.summary["updates"] == whole.summary["updates"]
    assert resumed.summary["examples"] == whole.summary["examples"]


@pytest.mark.parametrize("key", ["positions", "rows"])
def test_the_command_line_refuses_an_incomplete_checkpoint_in_one_line(tmp_path, capsys, key):
    run = _good_run(tmp_path)
    files = sorted((run / "checkpoints").glob("ckpt-*.npz"))
    for f in files[:-1]:
        f.unlink()
    _without(files[-1], key)
    capsys.readouterr()
    code = main(["train", "--strategy", "serial", "--epochs", "3", "--seed", "0", "--quiet",
                 "--evals", "0", "--checkpoint-every", "16", "--resume", str(run),
                 "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"{files[-1]} is incomplete (it holds no {key!r})" in err, err
    assert "--resume" not in err  # no offer to carry on from it


def test_a_failed_run_offers_to_carry_on_only_from_a_whole_checkpoint(tmp_path, monkeypatch):
    run = _good_run(tmp_path)
    files = sorted((run / "checkpoints").glob("ckpt-*.npz"))
    _without(files[-1], "positions")
    def record(self, *args, **kwargs):  # the resumed run fails at its first row
        raise RuntimeError("injected monitor fault")

    monkeypatch.setattr(recorder_module.Recorder, "record", record)
    with pytest.raises(RunFailed) as info:
        monsoon.train("exp", "serial", epochs=3, seed=0, out=run, resume=str(run), evals=10,
                      checkpoint_every=1000)
    assert f"to carry on from {files[-2].name}, call train again" in str(info.value)


def test_a_resumed_run_that_fails_gives_the_previous_runs_results_back(tmp_path, monkeypatch):
    """The previous run's results were set aside when a resumed run
    started, and went with it when it failed (its model.pt lost, the
    summary a failed one's). They come back, whole; the checkpoints the
    failed run wrote stay, and its line names the newest to carry on from."""
    run = _good_run(tmp_path)
    results = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    newest = sorted((run / "checkpoints").glob("ckpt-*.npz"))[-1]
    record = recorder_module.Recorder.record

    def fail_late(self, at, updates, *args, **kwargs):  # the resumed run fails well under
        # way: at its first row past its own first checkpoint (update 64; it resumed at 48).
        # A row count would depend on the pace rows are due at: a quick run takes fewer.
        if updates > 64:
            raise RuntimeError("injected monitor fault")
        return record(self, at, updates, *args, **kwargs)

    monkeypatch.setattr(recorder_module.Recorder, "record", fail_late)
    with pytest.raises(RunFailed) as info:
        monsoon.train("exp", "serial", epochs=6, seed=0, out=run, resume=str(run), evals=20,
                      checkpoint_every=16)
    line, now = str(info.value), sorted((run / "checkpoints").glob("ckpt-*.npz"))[-1]
    assert now.name > newest.name  # its own checkpoints are kept
    assert f"(run folder {run}, which keeps the previous run's results); to carry on from " \
           f"{now.name}, call train again with the same arguments and resume=\"{run}\"" \
        in line, line
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == results
    assert not list(run.rglob(".aside-*"))


@pytest.mark.parametrize("fails", ["mid-run", "at-the-end"])
def test_a_new_run_whose_summary_cannot_be_written_gives_the_previous_runs_results_back(
        tmp_path, monkeypatch, fails):
    """A new run (seed 1, no --resume) sets the previous run's results aside
    when it starts; where its own summary could not be written (a full disk:
    the write of a failed run's folder, or of a finished one's), they went
    with it and the folder held no results at all. They come back, whole,
    and nothing is left set aside."""
    import monsoon.api as api

    run = _good_run(tmp_path)
    results = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    series = {p.name: p.read_bytes() for p in (run / "tb").iterdir()}  # TensorBoard's
    ckpts = {p.name for p in (run / "checkpoints").glob("ckpt-*.npz")}

    def full_disk(out, *args, **kwargs):  # the folder's first file is written, then none
        (Path(out) / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(api, "write_run_folder", full_disk)
    if fails == "mid-run":
        def record(self, *args, **kwargs):
            raise RuntimeError("injected monitor fault")

        monkeypatch.setattr(recorder_module.Recorder, "record", record)
    with pytest.raises(RunFailed) as info:
        monsoon.train("exp", "serial", epochs=1, seed=1, out=run, evals=2, checkpoint_every=0)
    line = str(info.value)
    # its one line says so (before: a line that did not, or at the end OSError's traceback)
    assert "\n" not in line and f"run folder {run} could not be written ([Errno 28] No " \
        "space left on device); the previous run's results are back in place" in line, line
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == results
    assert {p.name: p.read_bytes() for p in (run / "tb").iterdir()} == series and series
    assert {p.name for p in (run / "checkpoints").glob("ckpt-*.npz")} == ckpts
    assert not list(run.rglob(".aside-*"))


@pytest.mark.parametrize("resumed", [False, True])
def test_a_run_that_cannot_give_the_previous_results_back_does_not_say_it_did(
        tmp_path, monkeypatch, capsys, resumed):
    """The folder made read-only while the run went (here: its renames
    refused, as they would be; the suite may run as root, whom a read-only
    folder does not stop): the run's results cannot be written, and the
    previous run's, set aside, cannot come back either. The line says
    neither that they are back in place nor that the folder keeps them,
    and a warning says they could not be given back."""
    import monsoon.api as api
    from monsoon.record import run_folder

    run = _good_run(tmp_path)
    real_replace = os.replace

    def read_only(src, dst):
        if Path(src).name.startswith(run_folder.ASIDE):  # a file set aside coming back
            raise PermissionError(13, "Permission denied", str(dst))
        real_replace(src, dst)

    def read_only_folder(out, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(Path(out) / "config.json"))

    def record(self, *args, **kwargs):
        raise RuntimeError("injected monitor fault")

    monkeypatch.setattr(run_folder.os, "replace", read_only)
    monkeypatch.setattr(api, "write_run_folder", read_only_folder)
    monkeypatch.setattr(recorder_module.Recorder, "record", record)
    options = dict(resume=str(run), seed=0) if resumed else dict(seed=1)
    with pytest.raises(RunFailed) as info:
        monsoon.train("exp", "serial", epochs=6, out=run, evals=2, checkpoint_every=16,
                      **options)
    line = str(info.value)
    assert "injected monitor fault" in line and "\n" not in line, line
    assert "back in place" not in line and "keeps the previous" not in line, line
    assert "could not be given back" in capsys.readouterr().err


def _interrupt_after_first_checkpoint(folder: Path) -> None:
    """SIGTERM to this process once ``folder`` holds a checkpoint newer than
    those there now (the run is well under way), as a user's Ctrl-C."""
    import signal
    import threading

    before = set((folder / "checkpoints").glob("ckpt-*.npz"))

    def signal_once_going():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if set((folder / "checkpoints").glob("ckpt-*.npz")) - before:
                break
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_once_going, daemon=True).start()


@pytest.fixture(scope="module")
def whole_400():
    """The uninterrupted run that both cases below resume to (the same options)."""
    return monsoon.train("exp", "serial", epochs=400, lr=0.01, seed=0, evals=10)


@pytest.mark.slow
@pytest.mark.parametrize("first_lr", [0.05, 0.01])  # another lr, and the very same settings
def test_an_interrupted_run_resumes_its_own_checkpoint_not_an_earlier_runs(tmp_path,
                                                                           first_lr, whole_400):
    """A finished run leaves later checkpoints in the folder than a second
    run interrupted early: the second's checkpoint, which its message and
    summary name, exists, and --resume carries on the second run."""
    import json

    from monsoon.errors import Interrupted

    out = tmp_path / "ck"
    opts = dict(seed=0, evals=10, checkpoint_every=50, out=out)
    monsoon.train("exp", "serial", epochs=40, lr=first_lr, **opts)
    first = sorted((out / "checkpoints").glob("ckpt-*.npz"))
    _interrupt_after_first_checkpoint(out)
    with pytest.raises(Interrupted) as info:
        monsoon.train("exp", "serial", epochs=400, lr=0.01, **opts)
    assert f"resume={json.dumps(str(out))}" in str(info.value)  # from Python: the keyword
    named = Path(json.loads((out / "summary.json").read_text())["checkpoint"])
    assert named.name < first[0].name  # interrupted before the first run's checkpoints
    assert named.exists()
    assert sorted((out / "checkpoints").glob("ckpt-*.npz"))[-1] == named
    resumed = monsoon.train("exp", "serial", epochs=400, lr=0.01, resume=str(out), **opts)
    assert resumed.summary["resumed_from"] == str(named)
    assert np.array_equal(resumed.params, whole_400.params)
    assert resumed.summary["updates"] == whole_400.summary["updates"]


def test_a_checkpoint_with_other_trajectory_settings_is_refused(tmp_path):
    """The rule's lr and schedule, the strategy's and the compressor's
    options shape the run: a checkpoint records them, and --resume with
    others is refused in one line naming the first that differs; the budget
    may grow."""
    run = _good_run(tmp_path)
    with pytest.raises(ConfigError, match="its lr is 0.05, this run's is 0.02") as info:
        monsoon.train("exp", "serial", epochs=3, seed=0, lr=0.02, resume=str(run))
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="its lr_schedule is 'constant', this run's is 'step'"):
        monsoon.train("exp", "serial", epochs=3, seed=0, lr_schedule="step", resume=str(run))
    resumed = monsoon.train("exp", "serial", epochs=6, seed=0, resume=str(run), evals=0,
                            checkpoint_every=7, timeout=30)
    assert resumed.summary["resumed_from"]


def test_pruning_keeps_the_newest_of_this_run_only(tmp_path):
    folder = tmp_path / "checkpoints"
    arrays = {"params": np.zeros(3, dtype=np.float32)}
    other = {"problem": "exp", "seed": 0, "settings": {"lr": 0.05}}
    mine = {"problem": "exp", "seed": 0, "settings": {"lr": 0.01}}
    for updates in (500, 600, 700, 800):
        checkpoints.save(folder, updates, other, arrays)
    (folder / "ckpt-000000000900.npz").write_bytes(b"damaged")
    for updates in (10, 20, 30, 40):
        path = checkpoints.save(folder, updates, mine, arrays)
        assert path.exists()
    names = sorted(p.name[5:17].lstrip("0") for p in checkpoints.checkpoint_files(folder))
    assert names == ["20", "30", "40", "600", "700", "800", "900"]


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    run = _good_run(tmp_path)
    with pytest.raises(ConfigError, match="from another run: its problem is 'exp'"):
        monsoon.train("parabola", "serial", epochs=3, resume=str(run))
    with pytest.raises(ConfigError, match="its strategy is 'serial', this run's is 'sync'"):
        monsoon.train("exp", "sync", 2, epochs=3, resume=str(run))
    with pytest.raises(ConfigError, match="its seed is 0, this run's is 1"):
        monsoon.train("exp", "serial", epochs=3, seed=1, resume=str(run))


def _svm_file(path: Path, rows: int, flip: bool = False) -> None:
    """A small svmlight file: ``rows`` examples (``flip``: the labels
    flipped), the same values for the same rows."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((rows, 5))
    y = (X[:, 0] > 0) != flip
    path.write_text("".join(f"{int(label)} " + " ".join(f"{j + 1}:{v:.4f}" for j, v in
                                                           enumerate(x)) + "\n"
                            for x, label in zip(X, y)))


def test_a_changed_data_file_is_refused_at_resume_and_the_same_one_resumes_from_anywhere(
        tmp_path, monkeypatch):
    """A checkpoint records the data it trained on: --resume on a file that
    has fewer rows, or the same rows with other labels, is refused in one
    line before the folder is touched; the same file named from another
    directory resumes (it was refused as another problem)."""
    (tmp_path / "d").mkdir()
    data, run = tmp_path / "d" / "data.svm", tmp_path / "d" / "run"
    _svm_file(data, 200)
    opts = dict(strategy="sync", workers=2, backend="threads", seed=0, evals=0, progress=False)
    monkeypatch.chdir(tmp_path / "d")
    monsoon.train("libsvm:data.svm", epochs=2, out="run", checkpoint_every=5, **opts)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for rows, flip, how in [(100, False, "it trained on 200 examples, this run's data has 100"),
                            (200, True, "as many examples, other values")]:
        _svm_file(data, rows, flip)
        with pytest.raises(ConfigError, match="the data differ from the checkpoint's") as info:
            monsoon.train("libsvm:data.svm", epochs=4, out="run", resume="run", **opts)
        assert how in str(info.value) and "\n" not in str(info.value)
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    _svm_file(data, 200)
    monkeypatch.chdir(tmp_path)
    resumed = monsoon.train("libsvm:d/data.svm", epochs=4, out="d/run", resume="d/run", **opts)
    assert resumed.summary["resumed_from"]
    assert resumed.summary["examples"] == 4 * 200


def test_an_engine_that_counts_steps_refuses_a_checkpoint_without_them(tmp_path):
    """The local engine's checkpoints count updates, not steps; ray, torch
    and spark's sync driver resume at a step (``needs=("step",)``) and
    refuse such a file in one line instead of starting its steps at 0."""
    from monsoon import rules

    run = _good_run(tmp_path)
    ckpt = checkpoints.read(sorted((run / "checkpoints").glob("ckpt-*.npz"))[-1])
    rule = rules.make_rule(ckpt.meta["rule"], 0.1)
    with pytest.raises(checkpoints.CheckpointError,
                       match="holds no 'step': another engine wrote it") as info:
        checkpoints.Start.at(ckpt, rule, 1, needs=("step",))
    assert "\n" not in str(info.value)
    start = checkpoints.Start.at(ckpt, rule, 1)  # the local engine needs no step
    assert start.examples == ckpt.meta["examples"] and start.saved is ckpt


def _never_started(monkeypatch):
    """Make every engine's ``run`` fail the test: a refusal must come first."""
    from monsoon.engines.local.engine import LocalEngine
    from monsoon.engines.sim.engine import SimEngine

    def started(*args, **kwargs):
        raise AssertionError("the engine started")

    for cls in (LocalEngine, SimEngine):
        monkeypatch.setattr(cls, "run", started)


def test_a_checkpoint_of_another_engine_is_refused_before_anything_starts(tmp_path,
                                                                          monkeypatch):
    """Each engine's meta is its own (the local engine's counters and sender
    slots, the sim's replay point): the checkpoint names its engine, and
    --resume on another refuses it in one line, naming both."""
    opts = dict(steps=40, seed=0, evals=0, progress=False)
    monsoon.train("exp", "sync", 2, backend="threads", out=tmp_path / "local",
                  checkpoint_every=10, **opts)
    monsoon.train("exp", "sync", 2, engine="sim", out=tmp_path / "sim", checkpoint_every=10,
                  **opts)
    for wrote in ("local", "sim"):
        for f in (tmp_path / wrote / "checkpoints").glob("ckpt-*.npz"):
            assert checkpoints.read(f).meta["engine"] == wrote
    _never_started(monkeypatch)
    with pytest.raises(checkpoints.CheckpointError) as info:
        monsoon.train("exp", "sync", 2, engine="sim", resume=str(tmp_path / "local"), **opts)
    line = str(info.value)
    assert "\n" not in line
    assert "was written by the local engine, this run's is the sim engine; resume it with " \
           "--engine local, or start a new run" in line, line
    with pytest.raises(checkpoints.CheckpointError,
                       match="written by the sim engine, this run's is the local engine; "
                             "resume it with --engine sim"):
        monsoon.train("exp", "sync", 2, backend="threads", resume=str(tmp_path / "sim"), **opts)


def test_the_command_line_refuses_another_engines_checkpoint_in_one_line(tmp_path,
                                                                         monkeypatch):
    run = _good_run(tmp_path)
    _never_started(monkeypatch)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["train", "--engine", "sim", "--strategy", "serial", "--epochs", "3",
                     "--seed", "0", "--quiet", "--resume", str(run), "--out",
                     str(tmp_path / "b")])
    assert code == 2
    assert err.getvalue().count("\n") == 1, err.getvalue()
    assert "written by the local engine" in err.getvalue()
    assert "--engine local" in err.getvalue()
    assert not (tmp_path / "b" / "summary.json").exists()


def _as_written_before(folder: Path) -> None:
    """Rewrite each checkpoint of ``folder`` without the ``engine``,
    ``settings`` and data (``n_examples``, ``data``) keys, as a monsoon that
    did not record them wrote them."""
    for f in sorted((folder / "checkpoints").glob("ckpt-*.npz")):
        ckpt = checkpoints.read(f)
        f.unlink()
        checkpoints.save(folder / "checkpoints", int(f.name[5:17]),
                         {k: v for k, v in ckpt.meta.items()
                          if k not in ("format", "version", "engine", "settings",
                                       *checkpoints.DATA)}, ckpt.arrays)
        assert not {"engine", "settings", *checkpoints.DATA} & set(checkpoints.read(f).meta)


@pytest.mark.parametrize("engine,every", [("local", 10), ("sim", 10)])
def test_a_checkpoint_written_before_the_engine_was_recorded_still_resumes(tmp_path, engine,
                                                                           every):
    opts = dict(engine=engine, steps=40, seed=0, evals=0, progress=False,
                **({"backend": "threads"} if engine == "local" else {}))
    whole = monsoon.train("exp", "sync", 2, out=tmp_path / "a", checkpoint_every=every, **opts)
    kept = cut_after(tmp_path / "a", 1)
    _as_written_before(tmp_path / "a")
    resumed = monsoon.train("exp", "sync", 2, resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["resumed_from"] == str(kept[0])
    assert np.array_equal(resumed.params, whole.params)
    assert resumed.summary["updates"] == whole.summary["updates"]


def test_the_engine_is_compared_only_where_both_name_it(tmp_path):
    run = _good_run(tmp_path)
    ckpt = checkpoints.read(sorted((run / "checkpoints").glob("ckpt-*.npz"))[-1])
    ident = {k: ckpt.meta[k] for k in checkpoints.IDENTITY if k in ckpt.meta}
    assert ckpt.meta["engine"] == "local"
    checkpoints.check(ckpt, {**ident, "engine": "local"}, {})
    checkpoints.check(ckpt, ident, {})  # a caller that names no engine
    del ckpt.meta["engine"]  # written before the engine was recorded
    checkpoints.check(ckpt, {**ident, "engine": "sim"}, {})
    ckpt.meta["engine"] = "ray"
    with pytest.raises(checkpoints.CheckpointError, match="resume it with --engine ray"):
        checkpoints.check(ckpt, {**ident, "engine": "sim"}, {})


def test_wrong_shapes_are_refused_and_nothing_is_half_loaded(tmp_path):
    run = _good_run(tmp_path)
    newest = sorted((run / "checkpoints").glob("ckpt-*.npz"))[-1]
    ckpt = checkpoints.read(newest)
    arrays = dict(ckpt.arrays)
    arrays["params"] = arrays["params"][:-1]
    for f in (run / "checkpoints").glob("*.npz"):
        f.unlink()
    checkpoints.save(run / "checkpoints", 5, {k: v for k, v in ckpt.meta.items()
                                              if k not in ("format", "version")}, arrays)
    with pytest.raises(ConfigError, match=r"params has shape \(48,\).*needs \(49,\)"):
        monsoon.train("exp", "serial", epochs=3, seed=0, resume=str(run))


def test_loading_unpickles_nothing(tmp_path):
    path = tmp_path / "checkpoints" / "ckpt-000000000001.npz"
    path.parent.mkdir()
    np.savez(path, meta=np.array([{"format": "x"}], dtype=object))
    with pytest.raises(checkpoints.CheckpointError, match="corrupt or partial"):
        checkpoints.read(path)


def test_the_command_line_refuses_a_bad_checkpoint_in_one_line(tmp_path):
    run = _good_run(tmp_path)
    for f in (run / "checkpoints").glob("*.npz"):
        f.write_bytes(b"not a zip")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # what the shell shows, without a process start
        code = main(["train", "--strategy", "serial", "--epochs", "3", "--quiet", "--resume",
                     str(run), "--out", str(tmp_path / "b")])
    assert code == 2
    assert err.getvalue().count("\n") == 1 and "corrupt or partial" in err.getvalue()
    assert not (tmp_path / "b" / "summary.json").exists()


@pytest.mark.parametrize("strategy", ["sync", "async", "hogwild", "local-sgd", "easgd"])
def test_sim_resumes_every_strategy_bit_identical(tmp_path, strategy):
    opts = dict(engine="sim", steps=400, seed=3, evals=10, sim_compute_sigma=0.5,
                **({} if strategy == "hogwild" else {"sim_latency_s": 1e-4}))  # no message
    whole = monsoon.train("logistic", strategy, 4, out=tmp_path / "a", checkpoint_every=40,
                          **opts)
    files = sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))
    assert files
    for f in files[1:]:
        f.unlink()
    resumed = monsoon.train("logistic", strategy, 4, resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["resumed_from"] == str(files[0])
    assert np.array_equal(resumed.params, whole.params)
    assert resumed.summary["updates"] == whole.summary["updates"]
    assert resumed.summary["wall_time_s"] == whole.summary["wall_time_s"]  # virtual time
    for rank, copy in (whole.worker_params or {}).items():
        assert np.array_equal(resumed.worker_params[rank], copy)


# A run's last checkpoint is where its workers stopped: the replay of a run
# with a larger budget reaches that update after other events (workers not
# done fetch and compute on), so it is found by its update, not its event.
@pytest.mark.parametrize("strategy,workers,steps,every", [("async", 4, 400, 400),
                                                         ("serial", 1, 20, 5)])
def test_sim_resumes_its_last_checkpoint_with_a_larger_budget(tmp_path, strategy, workers,
                                                              steps, every):
    opts = dict(engine="sim", seed=0, evals=0)
    monsoon.train("logistic", strategy, workers, out=tmp_path / "a", steps=steps,
                  checkpoint_every=every, **opts)
    last = sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))[-1]
    assert last.name == f"ckpt-{steps:012d}.npz"
    whole = monsoon.train("logistic", strategy, workers, steps=2 * steps, **opts)
    resumed = monsoon.train("logistic", strategy, workers, steps=2 * steps,
                            resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["resumed_from"] == str(last)
    assert np.array_equal(resumed.params, whole.params)
    assert resumed.summary["updates"] == whole.summary["updates"] == 2 * steps
    assert resumed.summary["examples"] == whole.summary["examples"]
    assert resumed.summary["wall_time_s"] == whole.summary["wall_time_s"]  # virtual time
    for rank, copy in (whole.worker_params or {}).items():
        assert np.array_equal(resumed.worker_params[rank], copy)


def test_sim_refuses_a_checkpoint_its_replay_does_not_reproduce(tmp_path):
    opts = dict(engine="sim", steps=200, seed=3, evals=0)
    monsoon.train("logistic", "async", 4, out=tmp_path / "a", checkpoint_every=40, **opts)
    newest = sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))[-1]
    ckpt = checkpoints.read(newest)
    arrays = dict(ckpt.arrays)
    arrays["params"] = arrays["params"] + 1
    for f in (tmp_path / "a" / "checkpoints").glob("*.npz"):
        f.unlink()
    checkpoints.save(tmp_path / "a" / "checkpoints", 1, {k: v for k, v in ckpt.meta.items()
                                                         if k not in ("format", "version")},
                     arrays)
    with pytest.raises(ConfigError, match="did not reproduce"):
        monsoon.train("logistic", "async", 4, resume=str(tmp_path / "a"), **opts)


# The first checkpoint (every 200 updates) triggers the signal; the budget
# leaves ten times as many updates after it, so the run is still going when
# the signal lands, even on a busy machine.
@pytest.mark.parametrize("engine,problem,strategy,budget", [
    ("local", "exp", "serial", {"epochs": 150}),
    ("local", "exp", "sync", {"epochs": 150, "backend": "threads"}),
    ("sim", "logistic", "async", {"steps": 8000}),
])
def test_sigterm_in_process_writes_the_folder_and_resumes_bit_identical(tmp_path, engine,
                                                                        problem, strategy,
                                                                        budget):
    import json
    import signal
    import threading

    from monsoon.errors import Interrupted

    opts = dict(engine=engine, seed=0, evals=10, **budget)
    workers = {"serial": 1, "sync": 2}.get(strategy, 4)
    def signal_once_going():  # a checkpoint is written: the run is well under way
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if list((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz")):
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_once_going, daemon=True).start()
    with pytest.raises(Interrupted) as info:
        monsoon.train(problem, strategy, workers, out=tmp_path / "a", checkpoint_every=200,
                      **opts)
    assert info.value.exit_code == 143 and f"resume={json.dumps(str(tmp_path / 'a'))}" in str(info.value)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["checkpoint"]
    resumed = monsoon.train(problem, strategy, workers, resume=str(tmp_path / "a"), **opts)
    whole = monsoon.train(problem, strategy, workers, **opts)
    assert np.array_equal(resumed.params, whole.params)


SPARSE = "rcv1-like:rows=4000,features=2000,nnz=20"


def test_a_compiled_serial_loop_checkpoints_per_epoch_and_resumes_bit_identical(tmp_path):
    opts = dict(epochs=6, seed=0, evals=0)
    whole = monsoon.train(SPARSE, "serial", out=tmp_path / "a", checkpoint_every=1, **opts)
    files = sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))
    assert files and checkpoints.read(files[0]).meta["plan"] == "epochs"
    kept = cut_after(tmp_path / "a", 1)
    assert checkpoints.read(kept[0]).meta["positions"][0] >= 1
    resumed = monsoon.train(SPARSE, "serial", resume=str(tmp_path / "a"), **opts)
    assert np.array_equal(resumed.params, whole.params)
    assert resumed.summary["examples"] == whole.summary["examples"]


def test_compiled_hogwild_threads_checkpoint_per_epoch_and_carry_on(tmp_path):
    opts = dict(epochs=6, seed=0, evals=20)
    first = monsoon.train(SPARSE, "hogwild", 2, out=tmp_path / "a", checkpoint_every=1, **opts)
    assert first.summary["backend"] == "threads"
    kept = cut_after(tmp_path / "a", 1)
    positions = checkpoints.read(kept[0]).meta["positions"]
    assert len(positions) == 2 and max(positions) <= 6
    resumed = monsoon.train(SPARSE, "hogwild", 2, resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["examples"] == pytest.approx(first.summary["examples"], rel=0.2)
    assert resumed.summary["final_loss"] < 1.1 * first.summary["final_loss"] + 0.01


@pytest.mark.parametrize("engine", ["ray", "spark", "torch"])
def test_private_copies_are_refused_at_resume_before_the_engine_starts(tmp_path, engine,
                                                                       monkeypatch):
    """Ray, Spark and torch keep no checkpoints of local SGD's private worker
    copies (``Engine.keeps_private_copies``): --resume is refused in one
    line before anything starts (the engine's run is never called)."""
    from monsoon.engines import ENGINES
    from monsoon.errors import ConfigError

    def started(*args, **kwargs):
        raise AssertionError("the engine started")

    monkeypatch.setattr(ENGINES.get(engine), "run", started)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ConfigError, match=f"the {engine} engine keeps no checkpoints of "
                                          "local-sgd's private worker copies"):
        monsoon.train("exp", "local-sgd", 2, engine=engine, epochs=1, resume=str(tmp_path),
                      progress=False)


def test_the_cost_floor_is_documented_where_checkpoint_every_is():
    """On fast steps the floor, not --checkpoint-every, spaces the local
    engine's checkpoints: the option's help and the engine's page say so,
    with the code's factor."""
    from monsoon.engines.local.checkpointing import COST_FACTOR
    from monsoon.engines.options import CHECKPOINT_EVERY

    said = f"waits {COST_FACTOR} times as long as the previous one took to write"
    page = " ".join((Path(__file__).parents[1] / "docs" / "engines" / "local.md")
                    .read_text().split())
    assert said in CHECKPOINT_EVERY.help and said in page

"""A run holds its folder (``record/folder_lock.py``): a second ``monsoon
train`` (or ``compare``) on a folder in use is refused in one line, exit 2,
and the first ends with its own results; ``kill -9`` of the holder frees
the folder for the next run; under torchrun only rank 0 holds it.

The first run is stopped (SIGSTOP) once its first checkpoint is written,
so the second surely meets it running, and continued after."""
import json
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
from monsoon.record.folder_lock import LOCK_NAME, FolderLock

ROOT = Path(__file__).resolve().parent.parent
# logistic (NumPy): the lock is the run folder's, whatever the problem; its
# subprocesses import no torch. LONG steps train ~2 s after the first
# checkpoint, within which the first run is stopped (SIGSTOP).
TRAIN = ["train", "--problem", "logistic", "--strategy", "serial", "--quiet",
         "--checkpoint-every", "100"]
LONG = 20000


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _start(args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "monsoon", *args], env=_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _monsoon(args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monsoon", *args], env=_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def _wait_for_checkpoint(folder: Path, proc) -> None:
    deadline = time.monotonic() + 30
    while not list((folder / "checkpoints").glob("ckpt-*.npz")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 30 s"
        time.sleep(0.01)


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


def _lr(checkpoint: Path) -> float:
    with np.load(checkpoint) as f:
        return json.loads(f["meta"].tobytes())["settings"]["lr"]


def _meet(first_args, second_args, out: Path, checkpoints: Path):
    """The first command on ``out``, stopped once ``checkpoints`` has its
    first checkpoint, meets the second there, then ends: both processes,
    and whether the second left ``out``'s files as they were."""
    first = _start([*first_args, "--out", str(out)])
    try:
        _wait_for_checkpoint(checkpoints, first)
        os.killpg(first.pid, signal.SIGSTOP)
        before = _files(out)
        second = _monsoon([*second_args, "--out", str(out)])
        untouched = _files(out) == before
        os.killpg(first.pid, signal.SIGCONT)
        first.log = first.communicate(timeout=60)[1]
    finally:
        os.killpg(first.pid, signal.SIGKILL) if first.poll() is None else None
    return first, second, untouched


def _refused(first, second, what: str) -> None:
    """The second refused in one line naming the first, which ended well."""
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert f"is in use by another {what} (pid {first.pid}:" in lines[0]
    assert "give another --out, or wait for it to end" in lines[0]
    assert first.returncode == 0, first.log


def test_a_second_run_on_a_folder_in_use_is_refused_and_the_first_keeps_its_results(tmp_path):
    out = tmp_path / "run"
    first, second, untouched = _meet([*TRAIN, "--lr", "0.01", "--steps", str(LONG)],
                                     [*TRAIN, "--lr", "0.02", "--steps", "300"], out, out)
    _refused(first, second, "run")
    assert untouched  # nothing in the folder touched
    assert json.loads((out / "config.json").read_text())["lr"] == 0.01
    assert json.loads((out / "summary.json").read_text())["updates"] == LONG
    assert {_lr(c) for c in (out / "checkpoints").glob("ckpt-*.npz")} == {0.01}
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_after_the_holder_is_killed_a_new_run_takes_the_folder(tmp_path):
    out = tmp_path / "run"
    first = _start([*TRAIN, "--lr", "0.01", "--steps", "100000", "--out", str(out)])
    try:
        _wait_for_checkpoint(out, first)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=30)
    assert (out / LOCK_NAME).is_file()  # the killed run's lock file, its lock gone with it
    second = _monsoon([*TRAIN, "--lr", "0.02", "--steps", "300", "--out", str(out)])
    assert second.returncode == 0, second.stderr
    assert json.loads((out / "summary.json").read_text())["lr"] == 0.02
    assert {_lr(c) for c in (out / "checkpoints").glob("ckpt-*.npz")} == {0.02}
    assert sorted(p.name for p in out.rglob(".*")) == []  # its lock, nothing set aside


def test_a_second_compare_on_a_folder_in_use_is_refused(tmp_path):
    out = tmp_path / "cmp"
    args = ["compare", "--problem", "logistic", "--strategies", "serial", "--checkpoint-every",
            "100", "--out", str(out)]
    first, second, untouched = _meet([*args, "--steps", str(LONG)], [*args, "--steps", "300"],
                                     out, out / "serial")
    _refused(first, second, "compare")
    assert untouched
    assert (out / "report.md").is_file() and not (out / LOCK_NAME).exists()
    assert json.loads((out / "serial" / "summary.json").read_text())["updates"] == LONG


def test_a_compare_clears_an_old_strategys_folder_only_when_no_run_holds_it(tmp_path):
    """A compare removes the folders of strategies an earlier compare there
    ran: one a run still holds (its own ``monsoon train --out``) refuses the
    compare in one line, nothing removed; one whose run was killed (its
    lock file left) is removed, lock file and all."""
    out = tmp_path / "cmp"
    monsoon.compare("parabola", ["serial", "sync"], 2, steps=20, out=out, progress=False)
    held = FolderLock(out / "sync")  # a run of its own in the old sync folder
    try:
        with pytest.raises(ConfigError, match="in use by another run"):
            monsoon.compare("parabola", ["serial"], 2, steps=20, out=out, progress=False)
        assert (out / "sync" / "summary.json").is_file()
    finally:
        held.release()
    (out / "sync" / LOCK_NAME).write_text("12345\nmonsoon train\n")  # as kill -9 leaves it
    monsoon.compare("parabola", ["serial"], 2, steps=20, out=out, progress=False)
    assert not (out / "sync").exists()


def test_the_api_is_refused_on_a_folder_in_use_and_touches_nothing(tmp_path):
    (tmp_path / "config.json").write_text(  # a previous run's
        '{"problem": "exp", "strategy": "serial", "workers": 1}')
    lock = FolderLock(tmp_path)
    try:
        before = _files(tmp_path)
        with pytest.raises(ConfigError, match=f"in use by another run \\(pid {os.getpid()}"):
            monsoon.train("exp", steps=50, out=tmp_path, progress=False, evals=0)
        assert _files(tmp_path) == before
    finally:
        lock.release()
    assert not (tmp_path / LOCK_NAME).exists()
    monsoon.train("exp", steps=50, out=tmp_path, progress=False, evals=0)
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.torchrun
def test_under_torchrun_rank_0_alone_holds_the_folder(tmp_path):
    """Every rank runs ``monsoon train``; rank 1 takes no lock (it would be
    refused its own run's folder), rank 0 holds it to the end."""
    out = tmp_path / "run"
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.Popen(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "monsoon", "train",
         "--engine", "torch", "--workers", "2", "--strategy", "sync", "--problem", "exp",
         "--quiet", "--steps", "400", "--out", str(out)],
        env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    holders = set()
    try:
        while proc.poll() is None:
            try:
                pid = int((out / LOCK_NAME).read_text().split("\n")[0])
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except (OSError, ValueError):
                time.sleep(0.005)
                continue
            holders.add(next((e for e in env if e.startswith(b"RANK=")), b"").decode())
        log, _ = proc.communicate(timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    assert proc.returncode == 0, log
    assert holders == {"RANK=0"}
    assert json.loads((out / "summary.json").read_text())["updates"] == 400
    assert not (out / LOCK_NAME).exists()

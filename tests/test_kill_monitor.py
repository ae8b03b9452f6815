"""``kill -9`` of the monitor, on every engine that starts processes on this
machine: every process the run started (workers, pipeline stages, torch
ranks, the fork server, the resource trackers) is gone within 2 s, and no
file it made in /dev/shm is left (``monitor/lifecycle.py``).

Each run is long (it would go on for minutes), so nothing ends on its own:
``monsoon train`` runs as a child in a session of its own; once it is
mid-run, its whole process tree is read from /proc, the monitor gets
SIGKILL, and each of those pids and each /dev/shm file they mapped or held
open is checked."""
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")]

ROOT = Path(__file__).resolve().parents[1]
LONG = ["--seed", "0", "--quiet", "--evals", "0", "--timeout", "20"]


def tree(pid: int) -> dict[int, str]:
    """Every descendant of ``pid`` (not ``pid`` itself), with its command line."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text()
                                              .rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for child in (c for c, q in parent.items() if q == p):
            try:
                found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shm_files(pids) -> set[str]:
    """The /dev/shm files the processes map or hold open (unlinked ones too)."""
    found = set()
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) > 5 and parts[5].startswith("/dev/shm/"):
                    found.add(parts[5].removesuffix(" (deleted)"))
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    found.add(target.removesuffix(" (deleted)"))
        except OSError:
            continue
    return found


def mid_run(proc, out: Path, workers, want: int, timeout=120.0) -> dict[int, str]:
    """The tree once ``want`` workers (``workers(pid, cmdline)``) have started and
    the run is under way: a first checkpoint written, or (the pipeline,
    which writes none) each worker 0.3 s of CPU into its run."""
    deadline = time.monotonic() + timeout
    started = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        found = tree(proc.pid)
        pids = [p for p, cmd in found.items() if workers(p, cmd)]
        if len(pids) == want:
            started = started or {p: cpu_s(p) for p in pids}
            if list((out / "checkpoints").glob("ckpt-*.npz")) or \
                    all(cpu_s(p) - started[p] > 0.3 for p in pids if alive(p)):
                return tree(proc.pid)
        time.sleep(0.05)
    raise AssertionError("the run did not get going")


CASES = {
    "local-sync": (["--problem", "exp", "--strategy", "sync", "--workers", "2",
                    "--epochs", "1000000", "--checkpoint-every", "500"],
                   lambda pid, cmd: name(pid).startswith("monsoon-w"), 2),
    "local-pipeline": (["--problem", "digits", "--strategy", "pipeline", "--workers", "2",
                        "--micro-batches", "4", "--steps", "100000000"],
                       lambda pid, cmd: name(pid).startswith("monsoon-stage"), 2),
    "torch": (["--engine", "torch", "--problem", "exp", "--strategy", "sync", "--workers", "2",
               "--epochs", "1000000", "--checkpoint-every", "500"],
              lambda pid, cmd: name(pid).startswith("monsoon-rank"), 2),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.torchrun) if c == "torch"
                                  else c for c in CASES])
def test_sigkill_to_the_monitor_takes_every_process_and_its_memory(tmp_path, case):
    args, workers, want = CASES[case]
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "monsoon", "train", "--out", str(out),
                             *LONG, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    found = {}
    try:
        found = mid_run(proc, out, workers, want)
        segments = shm_files([proc.pid, *found])
        assert proc.poll() is None and all(alive(p) for p in found), "the run ended by itself"
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        proc.communicate(timeout=30)
        while any(alive(p) for p in found) and time.monotonic() - t0 < 2.0:
            time.sleep(0.02)
        left = {p: found[p][:80] for p in found if alive(p)}
        assert not left, f"alive {time.monotonic() - t0:.1f} s after the kill: {left}"
        assert not [s for s in segments if os.path.exists(s)], segments
        if case == "torch":  # the killed agent's job folder goes at the next launch
            from monsoon.engines.torchrun.launch import remove_stale_folders

            folders = list(Path(tempfile.gettempdir()).glob(f"monsoon-torch-{proc.pid}-*"))
            assert folders and all(f.exists() for f in folders), found
            remove_stale_folders()
            assert not any(f.exists() for f in folders)
    finally:  # whatever a failure left behind (the pids are checked to be the same);
        # the resource trackers last, so that they still remove the run's files
        left = {**found, **tree(proc.pid)}
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for trackers in (False, True):
            for p, cmd in left.items():
                try:
                    if (b"resource_tracker" in cmd) == trackers and alive(p) and \
                            Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ") == cmd:
                        os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.5 if any(alive(p) for p in left) else 0)

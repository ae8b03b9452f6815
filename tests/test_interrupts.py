"""Signals and deaths on the local engine (processes backend): SIGTERM and
SIGINT stop a run cleanly and it resumes bit for bit; a killed worker is
named. (A killed monitor: ``test_kill_monitor.py``.)

Real processes and real signals: a signal to the run goes to ``monsoon train``
started as a child in its own session (the claim is about that process: its
exit code, its message); a killed worker is one of this process's own workers,
found in /proc."""
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import monsoon
from monsoon.record import checkpoints

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")]

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 150  # 2,400 updates: the signal lands after the first checkpoint, at update 100
ARGS = ["--problem", "exp", "--epochs", str(EPOCHS), "--seed", "0", "--quiet", "--evals", "20",
        "--timeout", "20"]
# a NumPy problem (its command imports no torch, nor does its fork server) for
# tests whose stop is the command's and the monitor's whatever the problem computes
NUMPY = ("--problem", "logistic")


def children(pid: int) -> list[int]:
    """The worker processes under ``pid``: its descendants named
    ``monsoon-w<rank>`` (the fork server between them is not one)."""
    parent, names = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        names[int(entry.name)] = stat[stat.index("(") + 1:stat.rindex(")")]

    def under(p):
        while p in parent and p > 1:
            p = parent[p]
            if p == pid:
                return True
        return False

    return [p for p, name in names.items() if name.startswith("monsoon-w") and under(p)]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def mapped_segments(pid: int) -> set[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {line.split()[5] for line in maps.splitlines()
            if len(line.split()) > 5 and "/monsoon-" in line.split()[5]}


def start(out: Path, strategy="sync", workers=2, extra=()):
    cmd = [sys.executable, "-m", "monsoon", "train", "--strategy", strategy, "--workers",
           str(workers), "--out", str(out), *ARGS, *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)


def wait_running(proc, out: Path, workers: int, timeout=60.0) -> list[int]:
    """Until the workers exist and a first checkpoint is written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        pids = children(proc.pid)
        if len(pids) == workers and list((out / "checkpoints").glob("ckpt-*.npz")):
            return pids
        time.sleep(0.05)
    raise AssertionError("the run did not get going")


def wait_gone(pids, timeout=5.0) -> float:
    t0 = time.monotonic()
    while any(alive(p) for p in pids):
        assert time.monotonic() - t0 < timeout, f"workers still alive after {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - t0


# the signalled runs' budget: 1,280 updates; the signal, once the first
# checkpoint (update 100) is seen, lands at ~150 on an idle machine
SIGNALLED = 80


def final_params(out_dir, **options):
    return monsoon.train("exp", "sync", 2, epochs=SIGNALLED, seed=0, evals=20, timeout=20,
                         out=out_dir, **options)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted run, made once for both signals (on threads: sync
    ends there bit-identical to the processes backend, at less CPU)."""
    return final_params(tmp_path_factory.mktemp("whole"), backend="threads")


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGTERM to the group"])
def test_a_signal_stops_the_run_cleanly_and_it_resumes_bit_for_bit(tmp_path, how, whole):
    """The monitor's SIGTERM, Ctrl-C (SIGINT to the process group) and
    ``timeout``'s or a batch scheduler's SIGTERM to the group, which reaches
    the workers too: they leave the stop to the monitor (a worker that died
    of it took a sync run's trained replica with it)."""
    run = tmp_path / "run"
    proc = start(run, extra=["--checkpoint-every", "100", "--epochs", str(SIGNALLED)])
    workers = wait_running(proc, run, 2)
    segments = mapped_segments(proc.pid)
    # mid-run: at the first checkpoint (update 100 of 1,280) 12x as many updates are left
    if how == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)
    elif how == "SIGINT":
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group
    else:
        os.killpg(proc.pid, signal.SIGTERM)
    sig = how.split()[0]
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (143 if sig == "SIGTERM" else 130), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"--resume {run}" in lines[0] and sig in lines[0], err
    wait_gone(workers)
    assert not any(os.path.exists(s.replace(" (deleted)", "")) for s in segments)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["failed_workers"] == []
    assert (run / "metrics.csv").read_text().count("\n") >= 2
    saved = sorted((run / "checkpoints").glob("ckpt-*.npz"))
    assert saved and summary["checkpoint"] == str(saved[-1])
    assert 0 < summary["updates"] < SIGNALLED * 16

    resumed = final_params(tmp_path / "resumed", resume=str(run))
    assert resumed.summary["resumed_from"] == str(saved[-1])
    assert resumed.summary["updates"] == whole.summary["updates"] == SIGNALLED * 16
    assert np.array_equal(resumed.params, whole.params)


# epochs: 1,920 updates, so a signal after the first live rows lands mid-run (it
# lands within the first 200 updates on an idle machine: 10x that is left)
LONG = 120


def wait_training(proc, out: Path, timeout=60.0) -> None:
    """Until the workers have trained a while: the live series (``OUT/tb``,
    a row at the monitor's looks once they are released) has two rows
    after its header."""
    deadline, sizes = time.monotonic() + timeout, set()
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        files = list((out / "tb").glob("events*"))
        if files:
            sizes.add(files[0].stat().st_size)
        if len(sizes) >= 3:
            return
        time.sleep(0.02)
    raise AssertionError("the run did not get going")


@pytest.fixture(scope="module")
def whole_long():
    """The uninterrupted run (on threads, as ``whole``)."""
    return monsoon.train("exp", "sync", 2, epochs=LONG, seed=0, evals=20, timeout=20,
                         progress=False, backend="threads")


@pytest.mark.parametrize("how,options", [
    ("SIGINT", dict(checkpoint_every=0)),
    ("SIGTERM", dict(checkpoint_every=500, backend="threads")),
    ("SIGINT", dict(checkpoint_every=0, backup_workers=1))],
    ids=["no-periodic", "threads-periodic", "backup-workers"])
def test_a_stopped_sync_run_checkpoints_where_its_workers_stopped(tmp_path, how, options,
                                                                  whole_long):
    """Whichever barrier each worker was at when the stop came, every one
    stops at the same step boundary, and the monitor writes the final
    checkpoint there (with no periodic one, or besides them); --resume then
    carries on from it, bit for bit where the run is deterministic."""
    run = tmp_path / "run"
    extra = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    proc = start(run, extra=["--epochs", str(LONG), "--live-every", "0.05", *extra])
    wait_training(proc, run)
    workers = children(proc.pid)
    if how == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (143 if how == "SIGTERM" else 130), err
    assert len(err.strip().splitlines()) == 1 and f"--resume {run}" in err, err
    wait_gone(workers)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 0 < summary["updates"] < LONG * 16
    newest = sorted((run / "checkpoints").glob("ckpt-*.npz"))[-1]
    meta = checkpoints.read(newest).meta
    assert summary["checkpoint"] == str(newest)
    assert meta["reason"] == "interrupted" and meta["updates"] == summary["updates"]

    resumed = monsoon.train("exp", "sync", 2, epochs=LONG, seed=0, evals=20, timeout=20,
                            progress=False, resume=str(run), **options)
    assert resumed.summary["resumed_from"] == str(newest)
    assert resumed.summary["updates"] == LONG * 16
    if "backup_workers" not in options:  # which gradients count is the backups' race
        assert np.array_equal(resumed.params, whole_long.params)


@pytest.mark.parametrize("strategy", ["hogwild", "easgd", "async"])
def test_an_interrupted_racing_run_resumes_to_its_budget_with_no_update_lost(tmp_path,
                                                                            strategy):
    """Hogwild!, EASGD and async checkpoint a snapshot, and their workers
    stop at once on a signal; a worker stops between batches, never between
    a gradient and the op that lands it (``server/worker.py``'s ``LANDING``),
    so the final checkpoint's positions (from the examples counted) agree
    with its updates, and the resumed run ends with an uninterrupted run's
    totals: its budget, every batch's update (hogwild, async: one a batch;
    EASGD: one exchange every tau = 4 local steps), none done twice."""
    run = tmp_path / "run"
    proc = start(run, strategy=strategy, extra=["--epochs", str(LONG), "--live-every", "0.05",
                                                "--checkpoint-every", "0"])
    wait_training(proc, run)
    workers = children(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    wait_gone(workers)
    meta = checkpoints.read(sorted((run / "checkpoints").glob("ckpt-*.npz"))[-1]).meta
    assert meta["reason"] == "interrupted" and 0 < meta["updates"] < LONG * 16
    batches = LONG * 16  # exp: 16 batches of 16 an epoch
    per_update = 4 if strategy == "easgd" else 1
    if strategy == "easgd":  # each worker's exchanges: its local steps // tau
        assert meta["updates"] + meta["dropped"] == sum(p // 4 for p in meta["positions"])
    else:
        assert meta["updates"] + meta["dropped"] == sum(meta["positions"])
    assert meta["examples"] == 16 * sum(meta["positions"])

    resumed = monsoon.train("exp", strategy, 2, epochs=LONG, seed=0, evals=20, timeout=20,
                            progress=False, resume=str(run))
    assert resumed.summary["examples"] == batches * 16
    assert resumed.summary["updates"] + resumed.summary["dropped_updates"] == \
        batches // per_update


def test_an_async_worker_stopped_with_accrued_gradients_leaves_them_to_the_resumed_run(
        tmp_path):
    """--n-push 4: an async worker adds up 4 gradients before it pushes the
    sum. Worker 1 presses Ctrl-C from its 30th gradient, so it stops with 2
    gradients added up and not pushed: their batches are not counted
    (``server/worker.py``), so the final checkpoint's positions count pushed
    batches only, its updates agree with them, and the resumed run does
    those 2 batches again, ending with an uninterrupted run's updates and
    examples: nothing computed is lost, nothing is done twice."""
    from faulty import SignalOnce
    from monsoon.errors import Interrupted
    from monsoon.problems import make_problem

    opts = dict(epochs=50, batch_size=16, seed=0, evals=0, timeout=20, progress=False,
                n_push=4)
    stopper = SignalOnce(make_problem("exp"), os.getpid(), rank=1, after=30)
    with pytest.raises(Interrupted):
        monsoon.train(stopper, "async", 2, out=tmp_path / "a", checkpoint_every=0, **opts)
    meta = checkpoints.read(sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))[-1]).meta
    assert meta["reason"] == "interrupted"
    share = 50 * 8  # each worker's batches: exp's 16 batches of 16 an epoch, halved
    assert meta["positions"][1] == 28, meta  # its 29th and 30th gradients were never pushed
    assert all(p % 4 == 0 or p == share for p in meta["positions"]), meta
    pushes = sum(-(-p // 4) for p in meta["positions"])  # a worker's last push may be short
    assert meta["updates"] + meta["dropped"] == pushes, meta
    assert meta["examples"] == 16 * sum(meta["positions"])

    resumed = monsoon.train("exp", "async", 2, resume=str(tmp_path / "a"), **opts)
    whole = monsoon.train("exp", "async", 2, **opts)
    assert resumed.summary["examples"] == whole.summary["examples"] == 2 * share * 16
    for run in (resumed, whole):
        assert run.summary["updates"] + run.summary["dropped_updates"] == 2 * share // 4


COMPRESSED = dict(epochs=40, batch_size=16, seed=0, evals=0, timeout=20, progress=False,
                  compress="randk:0.2")


@pytest.mark.parametrize("every,sync_step", [(100, "replicated"), (0, "replicated"),
                                             (0, "sharded")],
                         ids=["periodic", "no-periodic", "sharded-no-periodic"])
def test_an_interrupted_compressed_sync_run_checkpoints_where_it_stopped(
        tmp_path, monkeypatch, every, sync_step):
    """Compressed sync (randk with error feedback: each worker's residual
    and random stream). Worker 1 presses Ctrl-C from its 130th gradient, so
    the workers stop at a step boundary between checkpoint steps (every
    100), or in a run with no periodic checkpoints. Each worker hands its
    sender's state at that boundary to the monitor, which writes the final
    checkpoint there with it; the resumed run ends bit-identical to an
    uninterrupted one."""
    from faulty import SignalOnce
    from monsoon.server import shards
    from monsoon.errors import Interrupted
    from monsoon.problems import make_problem

    if sync_step == "sharded":  # every model counts as large
        monkeypatch.setattr(shards, "REPLICATE_MAX_BYTES", 0)
    run = tmp_path / "a"
    stopper = SignalOnce(make_problem("exp"), os.getpid(), rank=1, after=130)
    with pytest.raises(Interrupted) as info:
        monsoon.train(stopper, "sync", 2, out=run, checkpoint_every=every, **COMPRESSED)
    assert f"resume=\"{run}\"" in str(info.value)  # from Python: the keyword
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sync_step"] == sync_step and 0 < summary["updates"] < 40 * 16
    newest = sorted((run / "checkpoints").glob("ckpt-*.npz"))[-1]
    meta = checkpoints.read(newest).meta
    assert summary["checkpoint"] == str(newest)
    assert meta["reason"] == "interrupted" and meta["updates"] == summary["updates"], meta

    resumed = monsoon.train("exp", "sync", 2, resume=str(run), checkpoint_every=every,
                            **COMPRESSED)
    whole = monsoon.train("exp", "sync", 2, **COMPRESSED)
    assert resumed.summary["resumed_from"] == str(newest)
    assert resumed.summary["updates"] == whole.summary["updates"] == 40 * 16
    assert np.array_equal(resumed.params, whole.params)


def test_an_interrupted_run_offers_resume_only_where_it_would_be_accepted(tmp_path):
    """Async's checkpoints do not hold the workers' compressor state, so
    --resume refuses them: the interrupt's line says so instead of offering
    the command (the same check, ``checkpoints.resume_refusal``; it reads
    the strategy and the compressor, not the problem: NumPy's here)."""
    from monsoon.errors import ConfigError

    run = tmp_path / "run"
    proc = start(run, strategy="async", extra=[*NUMPY, "--compress", "topk:0.5",
                                               "--checkpoint-every", "100"])
    wait_running(proc, run, 2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--resume " not in lines[0], err
    assert "cannot be carried on" in lines[0] and "compressor state" in lines[0], err
    assert json.loads((run / "summary.json").read_text())["checkpoint"]
    with pytest.raises(ConfigError, match="compressor state"):
        monsoon.train(NUMPY[1], "async", 2, epochs=EPOCHS, seed=0, compress="topk:0.5",
                      resume=str(run), progress=False)


def kill_a_worker_once_running(out: Path, workers: int):
    """A thread that SIGKILLs this process's second worker once all
    ``workers`` run and a first checkpoint is written; ``result`` gets
    ``at`` (the kill's time) and ``before`` (the checkpoints written then)."""
    import threading

    result = {}

    def kill_one():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = children(os.getpid())
            saved = sorted((out / "checkpoints").glob("ckpt-*.npz"))
            if len(pids) == workers and saved:
                result.update(before=saved, at=time.monotonic())
                os.kill(sorted(pids)[1], signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_one, daemon=True)
    killer.start()
    return killer, result


def test_sigkill_to_a_sync_worker_fails_fast_and_names_it(tmp_path, capsys):
    from monsoon.cli import main
    from monsoon.record import checkpoints

    run = tmp_path / "run"
    killer, result = kill_a_worker_once_running(run, 2)
    code = main(["train", "--strategy", "sync", "--workers", "2", "--out", str(run), *ARGS,
                 "--checkpoint-every", "100", "--timeout", "10"])
    killer.join(5)
    assert "at" in result, "the worker was not killed mid-run"
    assert time.monotonic() - result["at"] < 10
    err = capsys.readouterr().err
    assert code == 1
    assert "failed" in err and "exit code -9" in err and len(err.strip().splitlines()) == 1
    for path in result["before"]:  # what was written before survives, whole
        if path.exists():
            assert checkpoints.read(path).meta["problem"] == "exp"
    assert list((run / "checkpoints").glob("ckpt-*.npz"))


@pytest.mark.parametrize("strategy", ["async", "hogwild"])
def test_sigkill_to_an_async_worker_is_named_and_the_run_finishes(tmp_path, strategy):
    killer, result = kill_a_worker_once_running(tmp_path / "run", 3)
    # the kill lands at the first checkpoint (update 200 of 8,000: ~0.8 s of training
    # on a quiet machine)
    run = monsoon.train("exp", strategy, 3, epochs=500, seed=0, timeout=20, evals=20,
                        out=tmp_path / "run", checkpoint_every=200)
    killer.join(5)
    assert "at" in result, "the worker was not killed mid-run"
    failed = run.summary["failed_workers"]
    assert len(failed) == 1 and "exit code -9" in failed[0]["error"]
    assert run.summary["status"] == "finished"
    assert list((tmp_path / "run" / "checkpoints").glob("ckpt-*.npz"))


def test_a_signal_during_start_up_stops_cleanly(tmp_path):
    import threading

    from monsoon.errors import Interrupted
    from monsoon.monitor.lifecycle import StopSignals

    def stop_once_handled():
        # SIGTERM as soon as the run's handler is in place: a fixed delay could
        # fire before it (a cold import), and the default action ends pytest
        deadline = time.monotonic() + 30
        while StopSignals.active is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if StopSignals.active is not None:
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_once_handled, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(Interrupted) as info:
        monsoon.train("exp", "sync", 2, epochs=400, out=tmp_path / "run", timeout=20)
    assert time.monotonic() - t0 < 30
    assert info.value.exit_code == 143
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["updates"] == 0
    assert not children(os.getpid())


def fork_servers(pid: int) -> list[int]:
    """The fork server ``pid`` started (its child running multiprocessing's forkserver)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"forkserver" in cmdline:
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("when", ["fork-server", "workers"])
def test_ctrl_c_during_start_up_prints_one_line_and_leaves_nothing(tmp_path, when):
    """Ctrl-C reaches the whole process group while the fork server imports
    what it preloads (it ignores SIGINT only after that, on its own), or
    while four workers on these cores read their payload and map the shared
    memory (the monitor unlinks it once each has, and must wait for that
    even when it stops them): one line, no traceback, no worker named
    failed, nothing left in /dev/shm or running."""
    run = tmp_path / "run"
    proc = start(run, workers=4)
    deadline, segments = time.monotonic() + 60, set()
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if when == "fork-server" and fork_servers(proc.pid):
            break
        if when == "workers" and children(proc.pid):
            segments = mapped_segments(proc.pid)
            break
        time.sleep(0.002)
    servers = fork_servers(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and "interrupted by SIGINT" in err, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["failed_workers"] == []
    wait_gone(servers)
    assert not children(proc.pid)
    assert not any(os.path.exists(s.replace(" (deleted)", "")) for s in segments)


@pytest.mark.parametrize("when", ["fork-server", "running"])
def test_timeouts_sigterm_to_the_run_then_its_group_is_one_stop(tmp_path, when):
    """GNU ``timeout`` on expiry signals the command, then its whole group
    (the command again), here 10 ms apart, while the fork server starts or
    mid-run: one stop, not a second one: the run ends interrupted in one
    line with its folder and a final checkpoint, and no process of it is
    left. Before, the repeat was taken for a second signal ("SIGTERM again:
    stopped at once, without a checkpoint", no folder), and at start-up the
    fork server died of it ("EOFError", status failed)."""
    run = tmp_path / "run"
    # mid-run, the stop is the command's and the monitor's: NumPy's run stops alike
    proc = start(run, strategy="async",
                 extra=("--epochs", "5000", *(NUMPY if when == "running" else ())))
    deadline = time.monotonic() + 60
    while when == "fork-server" and not fork_servers(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.002)
    if when == "running":
        wait_running(proc, run, 2)
    servers = fork_servers(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert len(err.strip().splitlines()) == 1 and "interrupted by SIGTERM after" in err, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["failed_workers"] == [], summary
    assert checkpoints.checkpoint_files(run / "checkpoints")
    assert (run / "metrics.csv").exists() and (run / "config.json").exists()
    wait_gone(servers)
    assert not children(proc.pid)


def test_a_second_signal_after_the_first_stops_at_once_and_a_repeat_does_not():
    """In the run's handlers: a stop signal again within ``REPEAT_S`` of the
    first is that stop (ignored); one later is a second signal, which
    raises ``Interrupted`` at once."""
    from monsoon.errors import Interrupted
    from monsoon.monitor.lifecycle import REPEAT_S, StopSignals

    with StopSignals() as stops:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # from the terminal and from timeout
        assert stops.signum == signal.SIGTERM
        time.sleep(REPEAT_S + 0.1)
        with pytest.raises(Interrupted, match="SIGTERM again: stopped at once") as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler raises in this thread
    assert info.value.exit_code == 143


class CtrlCOnTheCurve:
    """The exp problem, which presses Ctrl-C at the first loss evaluated
    after its ``steps`` gradients: while the curve of a finished run is
    evaluated."""

    def __new__(cls, steps: int):
        from faulty import FaultyProblem
        from monsoon.problems import make_problem

        class Late(FaultyProblem):
            def loss(self, w):
                if self.calls >= steps and not self.pressed:
                    self.pressed = True
                    os.kill(os.getpid(), signal.SIGINT)
                return self.inner.loss(w)

        problem = Late(make_problem("exp"), "nan", rank=None, after=10 ** 9)  # never armed
        problem.pressed = False
        return problem


def test_ctrl_c_while_a_finished_runs_curve_is_evaluated_still_writes_its_folder(tmp_path):
    """Training is over and the curve's snapshots are being evaluated when
    Ctrl-C comes: the curve keeps its ends and drops the points not yet
    evaluated, and the run folder is written whole (summary, metrics, params)
    before the run ends as interrupted (exit code 130). Before, the
    KeyboardInterrupt left a folder without a summary or model."""
    from monsoon.errors import Interrupted

    problem = CtrlCOnTheCurve(300)
    with pytest.raises(Interrupted) as info:
        monsoon.train(problem, "serial", 1, steps=300, batch_size=16, evals=50,
                      out=tmp_path / "run", progress=False)
    assert problem.pressed
    assert info.value.exit_code == 130 and "after the run had finished" in str(info.value)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["updates"] == 300, summary
    assert summary["curve_rows_dropped"] > 0, summary
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[1:]
    assert 3 <= len(rows) < 50 and rows[-1].split(",")[1] == "300", rows
    assert (tmp_path / "run" / "params.npy").exists()  # the trained model (exp: NumPy)


IMPORT_INTERRUPTED = """
import os, signal, sys

class CtrlCOnNumpy:  # Ctrl-C (or SIGTERM) the moment the package starts loading NumPy
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.{sig})
        return None

sys.meta_path.insert(0, CtrlCOnNumpy())
sys.argv = ["monsoon", "train", "--problem", "exp", "--steps", "10", "--out", sys.argv[1]]
from {module} import main
sys.exit(main())
"""


@pytest.mark.parametrize("entry, sig", [("monsoon_cli", "SIGINT"), ("monsoon.cli", "SIGINT"),
                                        ("monsoon_cli", "SIGTERM")])
def test_ctrl_c_while_the_command_loads_ends_in_one_line_having_run_nothing(tmp_path, entry,
                                                                              sig):
    """The ``monsoon`` command's entry (``monsoon_cli``, outside the package)
    holds a Ctrl-C that arrives while the package imports NumPy and the
    rest: one line, exit code 130, no run folder; a SIGTERM likewise (143;
    before, the process ended with no word). Entered through the package
    itself, the same Ctrl-C lands inside NumPy's import: a traceback
    (NumPy's "bad install" message, on some versions)."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", IMPORT_INTERRUPTED.format(module=entry, sig=sig),
                           str(out)], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if entry == "monsoon.cli":
        assert "Traceback" in proc.stderr and proc.returncode != 0, proc.stderr
        return
    assert proc.returncode == 128 + getattr(signal, sig), proc.stderr
    assert proc.stderr.strip() == "monsoon: interrupted while starting; nothing ran", proc.stderr
    assert not out.exists()


def _die_holding(store, shard):
    """A worker's push, cut short: the lock taken and marked, then death."""
    store.locks[shard].acquire()
    store.lock_owner[shard] = 2  # rank 1
    os._exit(1)


def test_the_lock_of_a_worker_that_died_holding_it_is_released():
    """A worker SIGKILLed inside a push would leave its shard's lock taken for
    good, and every survivor would wait on it until --timeout. The monitor
    releases it (only the dead rank's, only the locks it held)."""
    import multiprocessing as mp

    from monsoon.engines.local.store import ParameterStore
    from monsoon.rules import make_rule

    ctx = mp.get_context("fork")
    store = ParameterStore(np.zeros(10), make_rule("sgd", 0.1), 2, 2, sync_slots=False,
                           backend="processes", mp_context=ctx)
    try:
        p = ctx.Process(target=_die_holding, args=(store, 1))
        p.start()
        p.join(10)
        assert p.exitcode == 1
        assert not store.locks[1].acquire(timeout=0.1)  # held by the dead
        assert store.release_locks_of(0) == []  # rank 0 held none
        assert store.release_locks_of(1) == [1]
        assert store.locks[1].acquire(timeout=1)
        assert store.lock_owner[1] == 0
        store.locks[1].release()
        assert store.locks[0].acquire(timeout=1)  # untouched
        store.locks[0].release()
    finally:
        store.close()


def _die_unmarked(store, lock):
    """Death between taking a lock and writing the owner: only the claim says whose it is."""
    store.lock_claims[1] = lock + 1
    (store.locks[lock] if lock < len(store.locks) else store.sync_lock).acquire()
    os._exit(1)


def _hold_marked(store, lock, ready, done):
    with store.holding(lock, 0):
        ready.set()
        done.wait(30)


@pytest.mark.parametrize("lock", [1, 2], ids=["shard", "sync-step"])
def test_a_lock_taken_by_a_worker_killed_before_it_marked_it_is_released(lock):
    """A SIGKILL can land between a worker's acquire and its owner mark: the
    lock has no owner, only the dead worker's claim. The monitor releases it
    once it has watched it stay untakeable and owner-less; it leaves alone a
    claimed lock that a live worker holds, or that is free."""
    import multiprocessing as mp

    from monsoon.engines.local.store import ParameterStore
    from monsoon.rules import make_rule

    ctx = mp.get_context("fork")
    store = ParameterStore(np.zeros(10), make_rule("sgd", 0.1), 2, 2, sync_slots=False,
                           backend="processes", mp_context=ctx)
    take = (lambda: store.locks[lock]) if lock < 2 else (lambda: store.sync_lock)
    try:
        p = ctx.Process(target=_die_unmarked, args=(store, lock))
        p.start()
        p.join(10)
        assert p.exitcode == 1 and store.lock_owner[lock] == 0
        assert not take().acquire(timeout=0.1)  # held by the dead, unmarked
        assert store.release_locks_of(0) == []  # rank 0 claimed none
        assert store.release_locks_of(1) == [lock]
        assert take().acquire(timeout=1)
        assert not take().acquire(timeout=0.1)  # released once, not twice
        take().release()
        assert store.lock_claims[1] == 0

        # rank 1 died waiting for a lock that live rank 0 holds: not released
        ready, done = ctx.Event(), ctx.Event()
        holder = ctx.Process(target=_hold_marked, args=(store, lock, ready, done))
        holder.start()
        assert ready.wait(10)
        store.lock_claims[1] = lock + 1
        assert store.release_locks_of(1) == []
        assert store.lock_owner[lock] == 1 and not take().acquire(timeout=0.1)
        done.set()
        holder.join(10)
        assert holder.exitcode == 0 and store.lock_owner[lock] == 0

        # rank 1 died after releasing, before clearing its claim: nothing to release
        store.lock_claims[1] = lock + 1
        assert store.release_locks_of(1) == []
        assert take().acquire(timeout=1)
        assert not take().acquire(timeout=0.1)
        take().release()
    finally:
        store.close()


def stages_of(pid: int) -> list[int]:
    """The pipeline's stage processes under ``pid`` (named ``monsoon-stage<rank>``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().startswith("monsoon-stage"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return [p for p in found if p in _descendants(pid)]


def live_examples(run: Path) -> int:
    """The examples of the last live row in ``run``'s event file (0: none
    yet): its whole TFRecords (length, its CRC, the event, its CRC) holding
    ``run/examples`` (an ``Event``: wall_time, then the step, the run's
    examples, as a varint)."""
    latest = 0
    for path in (run / "tb").glob("events.out.tfevents.*"):
        data, pos = path.read_bytes(), 0
        while pos + 12 <= len(data):
            end = pos + 16 + struct.unpack_from("<Q", data, pos)[0]
            if end > len(data):
                break  # a record still being written
            event, pos = data[pos + 12:end - 4], end
            if b"run/examples" in event and event[9:10] == b"\x10":
                latest, shift = 0, 0
                for byte in event[10:20]:
                    latest, shift = latest | (byte & 0x7F) << shift, shift + 7
                    if byte < 0x80:
                        break
    return latest


def _descendants(pid: int) -> set[int]:
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, q in parent.items() if q in frontier} - out
        out |= frontier
    return out


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_to_the_group_stops_a_local_pipeline_at_a_step_boundary(tmp_path, sig):
    """Ctrl-C, or ``kill`` of the process group (the stages and the fork
    server get it too): the monitor stops every stage before the same step;
    the run folder says interrupted, the line says why it cannot be carried
    on (the pipeline writes no checkpoints), and no stage is left."""
    run = tmp_path / "run"
    epochs = 400  # minutes of work: it ends only if the signal stops it
    cmd = [sys.executable, "-m", "monsoon", "train", "--problem", "digits", "--strategy",
           "pipeline", "--workers", "2", "--epochs", str(epochs), "--out", str(run), "--quiet",
           "--evals", "20", "--timeout", "20"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    deadline = time.monotonic() + 90
    while len(stages := stages_of(proc.pid)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    # the stages are training: a live row (one a second) counts examples
    while live_examples(run) == 0:
        assert proc.poll() is None, ("the run ended with no live row of examples",
                                     proc.communicate())
        assert time.monotonic() < deadline, "no live row of examples: the stages never trained"
        time.sleep(0.05)
    t0 = time.monotonic()
    os.killpg(proc.pid, getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (130 if sig == "SIGINT" else 143), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"interrupted by {sig}" in lines[0], err
    assert "cannot be carried on" in lines[0] and f"--resume {run}" not in lines[0], err
    assert time.monotonic() - t0 < 30
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["failed_workers"] == []
    n = summary["n_examples"]
    assert 0 < summary["updates"] < epochs * n // summary["batch_size"]
    assert live_examples(run) == summary["examples"]  # the last live row: the run's counts
    assert np.isfinite(summary["final_loss"])
    wait_gone(stages)


def test_a_signal_stops_a_sim_pipeline_after_the_step_under_way(tmp_path):
    import threading

    from monsoon.errors import Interrupted
    from monsoon.monitor.lifecycle import StopSignals

    def stop_once_running():
        deadline = time.monotonic() + 60
        while StopSignals.active is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(1.0)  # some steps
        if StopSignals.active is not None:
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=stop_once_running, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(Interrupted) as info:  # 1,000 epochs: many minutes unless stopped
        monsoon.train("digits", "pipeline", 2, engine="sim", epochs=1000, out=tmp_path / "run")
    assert time.monotonic() - t0 < 60
    assert info.value.exit_code == 130 and "cannot be carried on" in str(info.value)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 0 < summary["updates"]
    assert summary["simulated_time_s"] == summary["wall_time_s"] > 0
    assert summary["real_time_s"] > 0 and 0 < summary["utilization"]["workers"] <= 1


def test_an_interrupted_compare_reports_what_ran_and_its_resume_carries_it_on(tmp_path):
    """SIGINT during sync, serial done: report.md has serial and sync (marked
    interrupted); the advice, ``resume="OUT"`` (the keyword: it was called
    from Python, where it said ``--resume OUT``), keeps serial's run and
    resumes sync from its checkpoint to the budget."""
    import threading

    from monsoon.errors import Interrupted
    from monsoon.monitor.lifecycle import StopSignals

    out = tmp_path / "my cmp"  # a space: the call it names quotes the folder
    opts = dict(workers=2, epochs=EPOCHS, seed=0, evals=20, timeout=20, checkpoint_every=100,
                progress=False)

    def stop_sync_once_checkpointed():
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if StopSignals.active is not None and \
                    list((out / "sync" / "checkpoints").glob("ckpt-*.npz")):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    threading.Thread(target=stop_sync_once_checkpointed, daemon=True).start()
    with pytest.raises(Interrupted) as info:
        monsoon.compare("exp", "serial,sync", out=out, **opts)
    message = str(info.value)
    assert info.value.exit_code == 130 and "--resume" not in message
    assert f"call compare again with the same arguments and resume=\"{out}\" (the runs" \
        in message
    assert f"{out / 'sync'}\"" not in message and "during sync" in message
    report = (out / "report.md").read_text()
    assert "| serial | 1 |" in report and "| sync | 2 |" in report
    assert "**sync was interrupted before its budget" in report
    assert "same gradient per step" not in report
    serial = (out / "serial" / "summary.json").read_text()

    done = monsoon.compare("exp", "serial,sync", out=out, resume=str(out), **opts)
    assert (out / "serial" / "summary.json").read_text() == serial  # kept, not run again
    sync = done.results["sync"].summary
    assert sync["status"] == "finished" and sync["updates"] == EPOCHS * 16
    assert sync["resumed_from"]
    assert "interrupted" not in (out / "report.md").read_text()


def test_an_interrupted_local_sgd_run_resumes_to_an_uninterrupted_runs_totals(tmp_path):
    """Local SGD: every worker walks the global plan, a local step on each
    batch, and they average every 8. Worker 1 presses Ctrl-C from its 29th
    gradient and pauses; worker 0 goes on towards the average at 32 (as far
    as it gets: under load it may not reach it), so they stop batches apart.
    Each resumes at its own batch with its private copy: the resumed run
    does every batch once, makes the uninterrupted run's averages with its
    weights, and ends on its parameters, bit for bit."""
    from faulty import SignalOnce
    from monsoon.errors import Interrupted
    from monsoon.problems import make_problem

    opts = dict(epochs=50, batch_size=16, seed=0, evals=0, timeout=20, progress=False)
    stopper = SignalOnce(make_problem("exp"), os.getpid(), rank=1, after=29)
    with pytest.raises(Interrupted):
        monsoon.train(stopper, "local-sgd", 2, out=tmp_path / "a", checkpoint_every=0, **opts)
    newest = sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))[-1]
    saved = checkpoints.read(newest)
    meta = saved.meta
    assert meta["reason"] == "interrupted"
    first, second = meta["positions"]
    assert second == 29 and 24 <= first <= 32 and meta["updates"] == 3, meta
    # exp: batches of 16, each worker's part 8 rows
    assert meta["examples"] == int(saved.arrays["counters"][:, 0].sum()) \
        == 8 * (first + second), meta
    assert meta["local_updates"] == first + second, meta

    resumed = monsoon.train("exp", "local-sgd", 2, resume=str(tmp_path / "a"), **opts)
    whole = monsoon.train("exp", "local-sgd", 2, **opts)
    assert resumed.summary["examples"] == whole.summary["examples"] == 50 * 256
    # a local step on each worker's half of every batch
    assert resumed.summary["local_updates"] == whole.summary["local_updates"] == 2 * 50 * 16
    assert resumed.summary["updates"] == whole.summary["updates"] == 50 * 16 // 8
    assert np.array_equal(resumed.params, whole.params)


def test_local_sgd_stopped_after_a_rounds_last_local_step_resumes_into_the_same_rounds(
        tmp_path):
    """Ctrl-C from worker 1's last gradient of round 2 (local steps 4): it
    stops between that round's last local step and its average, which the
    checkpoint lacks (worker 0 with it, or, under load, still in the round);
    resumed, worker 1 makes that average first, as worker 0 ends the round,
    so the resumed run makes the uninterrupted run's averages and ends on
    its parameters, bit for bit."""
    from faulty import SignalOnce
    from monsoon.errors import Interrupted
    from monsoon.problems import make_problem

    opts = dict(epochs=20, batch_size=16, seed=0, evals=0, timeout=20, progress=False,
                local_steps=4, backend="threads")
    # a generous pause: the signal wakes the monitor, which stops the workers meanwhile
    stopper = SignalOnce(make_problem("exp"), os.getpid(), rank=1, after=8, pause=1.2)
    with pytest.raises(Interrupted):
        monsoon.train(stopper, "local-sgd", 2, out=tmp_path / "a", checkpoint_every=0, **opts)
    meta = checkpoints.read(sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))[-1]).meta
    # worker 1 at the round's end; worker 0 there too, or (under load) still in the round
    first, second = meta["positions"]
    assert second == 8 and 4 <= first <= 8 and meta["updates"] == 1, meta

    resumed = monsoon.train("exp", "local-sgd", 2, resume=str(tmp_path / "a"), **opts)
    whole = monsoon.train("exp", "local-sgd", 2, **opts)
    assert resumed.summary["updates"] == whole.summary["updates"] == 20 * 16 // 4
    assert np.array_equal(resumed.params, whole.params)


def test_a_sigterm_during_a_deferred_write_ends_the_process_once_the_write_is_done(tmp_path):
    """torch's agent SIGTERMs every rank as soon as one is lost, and rank
    0's last checkpoint is written under ``sigterm_deferred``: a SIGTERM
    sent mid-write (its default action: death) waits for the write, then
    ends the process as it would have, and nothing after the block runs."""
    done, after = tmp_path / "done", tmp_path / "after"
    code = (f"import os, signal, time\n"
            f"from monsoon.monitor.lifecycle import sigterm_deferred\n"
            f"signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
            f"with sigterm_deferred():\n"
            f"    os.kill(os.getpid(), signal.SIGTERM)\n"
            f"    time.sleep(0.2)\n"
            f"    open({str(done)!r}, 'w').write('written')\n"
            f"open({str(after)!r}, 'w').write('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == -signal.SIGTERM
    assert done.read_text() == "written" and not after.exists()

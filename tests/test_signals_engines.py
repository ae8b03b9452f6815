"""Ctrl-C and SIGTERM on the ray, spark and torch engines keep the promise
the local engine keeps (``test_interrupts.py``): the run stops at a clean
point, writes a final checkpoint there and the run folder (status
"interrupted"), prints one line with the command that carries it on, exits
with 128 + the signal's number, and leaves no process behind; ``--resume``
then ends as an uninterrupted run would.

Real processes and real signals: ``monsoon train`` is started in a session
of its own, and Ctrl-C is SIGINT to its whole process group, as a terminal
sends it (Ray's and Spark's processes, torch's ranks are in it), SIGTERM
goes to the process alone. Every process under it while it ran (Ray's
raylet and workers, Spark's JVM and Python workers, torch's ranks and fork
server) must be gone once it has exited. The resumed and the uninterrupted
runs are made in this process, on the test session's Ray and Spark."""
import contextlib
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
from monsoon.record import checkpoints
from monsoon.rules import make_rule

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")]

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
EVERY = 50  # a periodic checkpoint every 50 updates: the signal comes after the first
# engine: (its marker, epochs of exp: 16 sync steps each). Long enough that the signal,
# sent once the first checkpoint is written, lands mid-run: a Ray or Spark step takes
# milliseconds here (their runs stop at update 50-80 of 480 on an idle machine), a
# torch step a tenth of that
RUNS = {"ray": (pytest.mark.ray, 30), "spark": (pytest.mark.spark, 30),
        "torch": (pytest.mark.torchrun, 200)}
OPTIONS = dict(seed=0, dtype="float64", evals=10, timeout=30, progress=False)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
            "OMP_NUM_THREADS": "1", "PYSPARK_PYTHON": sys.executable}


def _command(engine: str, strategy: str, epochs: int, out: Path, extra=()) -> list:
    return ["-m", "monsoon", "train", "--engine", engine, "--strategy", strategy,
            "--workers", "2", "--problem", "exp", "--epochs", str(epochs), "--seed", "0",
            "--dtype", "float64", "--evals", "10", "--timeout", "30", "--quiet",
            "--checkpoint-every", str(EVERY), "--out", str(out), *extra]


def _processes() -> dict:
    """pid -> (parent pid, start time) of every process now."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = Path(entry, "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                table[int(entry.name)] = (int(fields[1]), fields[19])
    return table


def _under(pid: int, table: dict) -> set:
    """The descendants of ``pid`` in ``table``, as (pid, start time)."""
    children = {}
    for p, (parent, _) in table.items():
        children.setdefault(parent, []).append(p)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add((child, table[child][1]))
            todo.append(child)
    return found


class Run:
    """``monsoon train`` (or torchrun running it) in a session of its own,
    watched: every process that was ever under it is kept in ``seen``."""

    def __init__(self, args: list, out: Path):
        self.out = out
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=_env(), cwd=ROOT, start_new_session=True)
        self.seen = set()

    def watch(self) -> None:
        self.seen |= _under(self.proc.pid, _processes())

    def wait_for_checkpoint(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not list((self.out / "checkpoints").glob("ckpt-*.npz")):
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 90 s"
            self.watch()
            time.sleep(0.02)
        self.watch()

    def interrupt(self, how: str) -> tuple[int, str]:
        """Once the run has a checkpoint, ``stop`` it; whatever happens, the
        run does not outlive the test."""
        try:
            self.wait_for_checkpoint()
            return self.stop(how)
        finally:
            if self.proc.poll() is None:
                self.kill()

    def stop(self, how: str, pid: int | None = None, group: bool = False) -> tuple[int, str]:
        """Ctrl-C (SIGINT to the whole process group) or SIGTERM to the
        process alone (to the whole group where ``group``: ``timeout``, a
        batch scheduler), or to ``pid`` alone where given (one of its own)."""
        if (how == "SIGINT" or group) and pid is None:
            os.killpg(self.proc.pid, signal.Signals[how])  # the whole process group
        else:
            os.kill(self.proc.pid if pid is None else pid, signal.Signals[how])
        try:
            _, err = self.proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{how} did not end the run within 90 s")
        return self.proc.returncode, err

    def rank_pid(self, rank: int) -> int:
        """The pid of torchrun's rank ``rank``: its child whose environment
        has RANK=``rank``."""
        for pid, (parent, _) in _processes().items():
            if parent == self.proc.pid:
                with contextlib.suppress(OSError):
                    if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes() \
                            .split(b"\0"):
                        return pid
        raise AssertionError(f"torchrun has no rank {rank}")

    def left(self, timeout: float = 15.0) -> list:
        """The processes seen under the run that are still there after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            table = _processes()
            alive = [p for p, start in self.seen if p in table and table[p][1] == start]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.2)

    def kill(self) -> None:
        for pid, _ in self.seen | {(self.proc.pid, None)}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)


def _checks(run: Run, code: int, err: str, how: str, total: int) -> dict:
    """What every interrupted run must show: its exit code, monsoon's one
    line (the last, with the --resume command), no traceback or crash dump
    from the stop, the run folder with status "interrupted", the final
    checkpoint where it stopped, no process left. Returns that checkpoint's meta."""
    assert code == 128 + signal.Signals[how], err
    ours = [line for line in err.splitlines() if line.startswith("monsoon:")]
    assert len(ours) == 1 and ours[0] == err.strip().splitlines()[-1], err
    assert f"interrupted by {how}" in ours[0] and f"--resume {run.out}" in ours[0], err
    assert "Traceback" not in err and "***" not in err and " ERROR " not in err, err
    summary = json.loads((run.out / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary
    assert 0 < summary["updates"] < total, summary
    newest = sorted((run.out / "checkpoints").glob("ckpt-*.npz"))[-1]
    meta = checkpoints.read(newest).meta
    assert summary["checkpoint"] == str(newest)
    assert meta["reason"] == "interrupted" and meta["updates"] == summary["updates"], meta
    assert not run.left(), "processes outlived the run"
    return meta


@pytest.fixture
def ray_here(request):
    pytest.importorskip("ray")
    return request.getfixturevalue("local_ray")


@pytest.fixture
def spark_here():
    from spark_env import spark_session

    with spark_session("local[2]") as session:
        yield session


def _here(engine: str, request) -> None:
    """This process's Ray or Spark, for the runs made here."""
    if engine in ("ray", "spark"):
        request.getfixturevalue(f"{engine}_here")
    else:
        pytest.importorskip("torch")


_whole = {}


def _uninterrupted(engine: str, strategy: str, epochs: int, **extra):
    key = (engine, strategy, epochs, tuple(sorted(extra.items())))
    if key not in _whole:
        _whole[key] = monsoon.train("exp", strategy, 2, engine=engine, epochs=epochs,
                                    **OPTIONS, **extra)
    return _whole[key]


@pytest.mark.timeout(300)  # three runs on a cluster engine (94 s on CI's machine), when busy
@pytest.mark.parametrize("engine", [pytest.param(e, marks=RUNS[e][0]) for e in RUNS])
def test_ctrl_c_stops_a_sync_run_cleanly_and_it_resumes_bit_for_bit(engine, tmp_path,
                                                                      request):
    """Sync: every worker (ray: on every shard; spark: every barrier rank;
    torch: every rank) stops after the same step, and the final checkpoint
    is exact there: the resumed run ends bit-identical to an uninterrupted
    one, with its totals. The final checkpoint holds what the workers
    counted themselves (``monitor/tally.py``: Ray's driver and torch's rank
    0 add their reports first), so the resumed run's summary.json counts
    every gradient's staleness and every byte of the whole run."""
    _here(engine, request)
    epochs = RUNS[engine][1]
    total = epochs * 16
    run = Run([sys.executable, *_command(engine, "sync", epochs, tmp_path / "run")],
              tmp_path / "run")
    code, err = run.interrupt("SIGINT")
    meta = _checks(run, code, err, "SIGINT", total)
    assert meta["step"] == meta["updates"] and meta["examples"] == 16 * meta["updates"], meta

    resumed = monsoon.train("exp", "sync", 2, engine=engine, epochs=epochs, **OPTIONS,
                            resume=str(run.out))
    whole = _uninterrupted(engine, "sync", epochs)
    assert resumed.summary["updates"] == whole.summary["updates"] == total
    assert resumed.summary["examples"] == whole.summary["examples"] == total * 16
    assert np.array_equal(resumed.params, whole.params)
    # Spark's barrier checkpoints hold no traffic: its bytes count from the checkpoint
    traffic = () if engine == "spark" else (
        "bytes_sent", "bytes_received", "bytes_sent_per_worker")
    for key in ("staleness_counts", *traffic):
        assert resumed.summary[key] == whole.summary[key], key


@pytest.mark.parametrize("engine", [pytest.param("ray", marks=pytest.mark.ray),
                                    pytest.param("spark", marks=pytest.mark.spark)])
def test_sigterm_stops_an_async_run_with_every_counted_batch_applied(engine, tmp_path,
                                                                      request):
    """Async: Ray's workers stop between batches, their pushes in; Spark's
    driver applies no segment's result after the signal. The final
    checkpoint's positions (each worker's batches) agree with its updates
    and examples, so the resumed run ends with the uninterrupted run's
    totals: every batch done once. (Ray's own SIGTERM handler, which
    ``ray.init`` installs, used to abort the driver with a stack dump.)"""
    _here(engine, request)
    epochs, push = 100, 4  # pushes (and reads) every 4 batches: 400 pushes
    total = epochs * 16 // push
    run = Run([sys.executable, *_command(engine, "async", epochs, tmp_path / "run",
                                         ["--n-push", str(push), "--n-fetch", str(push)])],
              tmp_path / "run")
    code, err = run.interrupt("SIGTERM")
    newest = sorted((tmp_path / "run" / "checkpoints").glob("ckpt-*.npz"))[-1]
    positions = [int(p) for p in checkpoints.Start.at(
        checkpoints.read(newest), make_rule("sgd", 0.1), 2).positions]
    meta = _checks(run, code, err, "SIGTERM", total)
    assert all(p % push == 0 for p in positions), positions  # whole pushes only
    assert meta["dropped"] == 0 and meta["updates"] == sum(positions) // push, (meta, positions)
    assert meta["examples"] == 16 * sum(positions), (meta, positions)

    resumed = monsoon.train("exp", "async", 2, engine=engine, epochs=epochs, n_push=push,
                            n_fetch=push, **OPTIONS, resume=str(run.out))
    assert resumed.summary["examples"] == epochs * 256
    assert resumed.summary["updates"] + resumed.summary["dropped_updates"] == total


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.parametrize("starting", [b"raylet", b"ray::IDLE"])
def test_a_sigterm_while_ray_starts_stops_the_run_cleanly(starting, tmp_path):
    """A SIGTERM while ``ray.init`` is still starting Ray's processes: once
    the raylet runs (Ray's Python handler exited at once, status 15, without
    a word, and Ray's dashboard and runtime-env agents lived on for a
    minute or more), or once a Ray worker process waits (the driver's core
    worker's C++ handler: a stack dump, then abort). Now it stops the run
    as a SIGTERM later would: exit 143, one line, the folder with status
    "interrupted" and its final checkpoint, no process left."""
    pytest.importorskip("ray")
    out = tmp_path / "run"
    run = Run([sys.executable, *_command("ray", "async", 100, out)], out)
    try:
        deadline = time.monotonic() + 90
        while not any(starting in _program(pid) for pid, _ in run.seen):
            assert run.proc.poll() is None, run.proc.communicate()
            assert time.monotonic() < deadline, f"no {starting} within 90 s"
            run.watch()
            time.sleep(0.01)
        assert not (out / "summary.json").exists()  # still starting: nothing recorded yet
        code, err = run.stop("SIGTERM")
    finally:
        if run.proc.poll() is None:
            run.kill()
    assert code == 143, err
    assert err.strip().splitlines()[-1].startswith("monsoon: interrupted by SIGTERM"), err
    assert "Traceback" not in err and "***" not in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary
    assert checkpoints.read(Path(summary["checkpoint"])).meta["updates"] == summary["updates"]
    assert not run.left(), "processes outlived the run"


def _program(pid: int) -> bytes:
    """The program process ``pid`` runs (b"" where it has ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


@pytest.mark.spark
def test_a_sigterm_to_the_whole_group_stops_a_spark_run_cleanly(tmp_path, request):
    """``timeout``, SLURM, systemd and ``kill -- -PGID`` signal the whole
    process group. The Spark JVM that monsoon starts runs in a session of
    its own, so the SIGTERM reaches monsoon alone, which stops the run as a
    SIGTERM to its own process does: exit 143, the final checkpoint, the
    line with --resume, no process left. (The JVM got it too before, and,
    where it died of it first, the run ended as a failure: Py4JNetworkError,
    no checkpoint.)"""
    _here("spark", request)
    epochs, push = 100, 4
    run = Run([sys.executable, *_command("spark", "async", epochs, tmp_path / "run",
                                         ["--n-push", str(push), "--n-fetch", str(push)])],
              tmp_path / "run")
    try:
        run.wait_for_checkpoint()
        jvms = [pid for pid, _ in run.seen if pid != run.proc.pid and
                _program(pid).endswith(b"java")]
        assert jvms, "no Spark JVM under the run"
        # out of the group's reach: whether the JVM outlives a group SIGTERM
        # long enough to break the run is a race, its session is not
        assert all(os.getsid(pid) != os.getsid(run.proc.pid) for pid in jvms)
        code, err = run.stop("SIGTERM", group=True)
    finally:
        if run.proc.poll() is None:
            run.kill()
    _checks(run, code, err, "SIGTERM", epochs * 16 // push)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", [pytest.param(e, marks=RUNS[e][0]) for e in RUNS])
def test_timeouts_sigterm_to_the_run_then_its_group_is_one_stop(engine, tmp_path, request):
    """What GNU ``timeout`` does on expiry: SIGTERM to the run, then to its
    whole process group 10 ms later. One stop on every engine (the run's
    handler takes the repeat for the same stop, ``lifecycle.REPEAT_S``):
    the final checkpoint, the folder, one line. Before, the repeat stopped
    the run at once without them, and the torch engine's ranks, in the
    run's group and taking SIGTERM by default, died of it (the run failed:
    "rank 0 died (SIGTERM)"): they now run in sessions of their own, and
    so do Ray's GCS and raylet (the group's SIGTERM killed the raylet under
    the stop when it came first: "ActorUnavailableError", exit 1)."""
    _here(engine, request)
    epochs = RUNS[engine][1]
    run = Run([sys.executable, *_command(engine, "sync", epochs, tmp_path / "run")],
              tmp_path / "run")
    try:
        run.wait_for_checkpoint()
        if engine == "ray":  # out of the group's reach, as the race is lost under load
            ray_servers = [pid for pid, _ in run.seen
                           if os.path.basename(_program(pid)) in (b"gcs_server", b"raylet")]
            assert len(ray_servers) == 2, run.seen
            assert all(os.getsid(pid) != os.getsid(run.proc.pid) for pid in ray_servers)
        os.kill(run.proc.pid, signal.SIGTERM)
        time.sleep(0.01)
        code, err = run.stop("SIGTERM", group=True)
    finally:
        if run.proc.poll() is None:
            run.kill()
    _checks(run, code, err, "SIGTERM", epochs * 16)


@pytest.mark.torchrun
def test_under_torchrun_ctrl_c_stops_every_rank_at_one_step(tmp_path):
    """Under a torchrun of the user's, Ctrl-C reaches torchrun's agent,
    which hands SIGINT to every rank (they run in sessions of their own):
    rank 0 stops every rank after one collective, writes the final
    checkpoint and the run folder, and prints monsoon's line; torchrun then
    exits with its own error (its SignalException, which monsoon does not
    own, docs/faults.md), and no rank is left."""
    pytest.importorskip("torch")
    epochs = RUNS["torch"][1]
    out = tmp_path / "run"
    run = Run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2",
               *_command("torch", "sync", epochs, out)], out)
    code, err = run.interrupt("SIGINT")
    assert code != 0, err  # torchrun's own exit, after the ranks have ended
    ours = [line for line in err.splitlines() if line.startswith("monsoon:")]
    assert len(ours) == 1 and "interrupted by SIGINT" in ours[0], err
    assert f"--resume {out}" in ours[0], err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 0 < summary["updates"] < epochs * 16
    meta = checkpoints.read(sorted((out / "checkpoints").glob("ckpt-*.npz"))[-1]).meta
    assert meta["reason"] == "interrupted" and meta["updates"] == summary["updates"]
    assert not run.left(), "processes outlived the run"


@pytest.mark.torchrun
def test_under_torchrun_one_signal_to_a_rank_other_than_0_stops_the_run(tmp_path):
    """A SIGTERM that reaches one rank of the user's torchrun alone (a
    scheduler ending one process), not torchrun's agent: one signal stops
    the run whichever rank it reaches. Rank 1 hands its signal to rank 0
    with the next collective's flags, and rank 0 stops every rank as on a
    signal of its own: the final checkpoint, the run folder, monsoon's one
    line, torchrun's exit code as for a SIGTERM to rank 0, no rank left."""
    pytest.importorskip("torch")
    epochs = RUNS["torch"][1]
    codes = {}
    for rank in (0, 1):
        out = tmp_path / f"rank{rank}"
        run = Run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2",
                   *_command("torch", "sync", epochs, out)], out)
        try:
            run.wait_for_checkpoint()
            code, err = run.stop("SIGTERM", run.rank_pid(rank))
        finally:
            if run.proc.poll() is None:
                run.kill()
        codes[rank] = code
        ours = [line for line in err.splitlines() if line.startswith("monsoon:")]
        assert len(ours) == 1 and "interrupted by SIGTERM" in ours[0], (rank, code, err)
        assert f"--resume {out}" in ours[0], err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "interrupted" and 0 < summary["updates"] < epochs * 16
        meta = checkpoints.read(sorted((out / "checkpoints").glob("ckpt-*.npz"))[-1]).meta
        assert meta["reason"] == "interrupted" and meta["updates"] == summary["updates"]
        assert summary["checkpoint"] == str(sorted((out / "checkpoints").glob("ckpt-*.npz"))[-1])
        assert not run.left(), "processes outlived the run"
    assert codes[1] == codes[0] != 0, codes


def test_a_stop_that_reaches_one_shard_mid_step_ends_every_worker_after_that_step():
    """Ray's synchronous stop (``engines/ray/shard.py``), on plain ``Shard``
    objects driven from threads through the worker's own protocol: the
    driver's stop reaches shard 0 while step 1 is under way (worker 0's
    parts are in on both shards, worker 1's not yet) and shard 1 not at
    all. Step 1 still completes on both shards, and every worker reads the
    same answers for it (shard 0: the last step; shard 1: not), so every
    worker ends after step 1 and no shard is left a step ahead."""
    import threading

    from monsoon.engines.ray.shard import Shard
    from monsoon.engines.ray.sync_step import step_replies

    shards = [Shard(s, np.zeros(2), make_rule("sgd", 1.0), workers=2, counted=2, timeout=10,
                    span=(2 * s, 2 * s + 2, 4)) for s in range(2)]

    def call(batch):  # a worker's remote calls, at once
        replies = [None] * len(batch)
        threads = [threading.Thread(target=lambda k=k, sh=sh, m=m, a=a: replies.__setitem__(
            k, getattr(sh, m)(*a))) for k, (sh, m, a) in enumerate(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        return replies

    def step(rank, k, out):
        grad = np.full(4, rank + 1.0)
        out[rank] = step_replies(call, shards, [0, 1], k, rank, [grad[:2], grad[2:]], 1, 0,
                                 True)

    def both(k, between=None):
        out = {}
        first = threading.Thread(target=step, args=(0, k, out))
        first.start()
        deadline = time.monotonic() + 10
        while not all(0 in sh.arrivals for sh in shards):  # worker 0's parts are in
            assert time.monotonic() < deadline
            time.sleep(0.001)
        if between is not None:
            between()
        step(1, k, out)
        first.join(10)
        return out

    step0 = both(0)
    assert not any(r.stop for replies in step0.values() for r in replies.values())
    step1 = both(1, between=shards[0].stop)
    stops = {rank: {s: r.stop for s, r in replies.items()} for rank, replies in step1.items()}
    assert stops[0] == stops[1] == {0: True, 1: False}, stops
    assert [sh.step for sh in shards] == [2, 2]
    params = [np.concatenate([replies[0][0], replies[1][0]]) for replies in step1.values()]
    assert np.array_equal(params[0], params[1])


@pytest.mark.parametrize("engine", [pytest.param(e, marks=RUNS[e][0]) for e in RUNS])
def test_a_stopped_run_that_resume_would_refuse_says_why(engine, tmp_path, request):
    """local-sgd's workers keep copies of their own, which no ray, spark or
    torch checkpoint holds (``checkpoints.resume_refusal``): a SIGINT still
    stops the run cleanly, with its run folder, and its line says why
    ``--resume`` would refuse it instead of offering it; no checkpoint is
    written. (In this process: the signal comes once the run's handlers are
    in place.) ``--checkpoint-every`` is refused for it: the run folder's
    default interval alone."""
    import threading

    from monsoon.errors import Interrupted
    from monsoon.monitor.lifecycle import StopSignals

    _here(engine, request)

    def stop_once_handled():
        deadline = time.monotonic() + 60
        while StopSignals.active is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(1.0)  # training, or still starting: either way a clean stop
        if StopSignals.active is not None:
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=stop_once_handled, daemon=True).start()
    out = tmp_path / "run"
    with pytest.raises(Interrupted) as info:
        monsoon.train("exp", "local-sgd", 2, engine=engine, epochs=400, out=out, **OPTIONS)
    line = str(info.value)
    assert info.value.exit_code == 130 and "interrupted by SIGINT" in line, line
    assert "cannot be carried on" in line and "private worker copies" in line, line
    assert "--resume" not in line, line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["updates"] < 400 * 16
    assert not list((out / "checkpoints").glob("ckpt-*.npz"))


def _stopped_once_checkpointed(out: Path, how: str = "SIGINT") -> None:
    """Sends ``how`` to this process once the run writing to ``out`` has
    its first checkpoint (a thread of its own): a stop in mid-run."""
    import threading

    def stop_once_checkpointed():
        deadline = time.monotonic() + 120
        while not list((out / "checkpoints").glob("ckpt-*.npz")):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        os.kill(os.getpid(), signal.Signals[how])

    threading.Thread(target=stop_once_checkpointed, daemon=True).start()


@pytest.mark.ray
def test_a_ray_async_run_resumed_after_ctrl_c_counts_the_pushes_its_workers_dropped(
        tmp_path, request):
    """Worker 1's every third gradient is NaN: its worker drops the push
    (``Worker.push``; the shards never see it) and counts it. The final
    checkpoint of a run stopped by Ctrl-C holds those drops with the
    shards' (the count the interrupted run's summary and rows show), so
    the resumed run counts every push of the whole run once, applied or
    dropped."""
    from faulty import FaultyProblem
    from monsoon.errors import Interrupted
    from monsoon.problems import make_problem

    _here("ray", request)
    epochs, out = 50, tmp_path / "run"
    opts = dict(engine="ray", epochs=epochs, batch_size=16, seed=0, evals=10, timeout=30,
                progress=False)

    def problem():
        return FaultyProblem(make_problem("exp"), "nan", rank=1, after=2, every=3)

    _stopped_once_checkpointed(out)
    with pytest.raises(Interrupted):
        monsoon.train(problem(), "async", 2, out=out, checkpoint_every=EVERY, **opts)
    stopped = json.loads((out / "summary.json").read_text())
    newest = sorted((out / "checkpoints").glob("ckpt-*.npz"))[-1]
    meta = checkpoints.read(newest).meta
    assert meta["reason"] == "interrupted" and stopped["dropped_updates"] > 0, stopped
    assert meta["dropped"] == stopped["dropped_updates"], (meta, stopped["dropped_updates"])
    assert meta["updates"] == stopped["updates"], (meta, stopped["updates"])

    resumed = monsoon.train(problem(), "async", 2, resume=str(out), **opts).summary
    assert resumed["examples"] == epochs * 256
    assert resumed["updates"] + resumed["dropped_updates"] == epochs * 16  # every push, once
    assert resumed["dropped_updates"] > stopped["dropped_updates"]



@pytest.mark.spark
@pytest.mark.parametrize("strategy", ["async", "ssp"])
def test_a_spark_run_resumed_after_ctrl_c_counts_the_whole_runs_staleness_traffic_and_clocks(
        strategy, tmp_path, request):
    """Spark's driver applies every segment itself and counts its staleness,
    its bytes (each worker's sender) and SSP's clocks: a checkpoint holds
    them all (``RunTally.totals``), so the run resumed after Ctrl-C counts
    every update's staleness, every byte and every clock of the whole run,
    as the uninterrupted run does."""
    from monsoon.errors import Interrupted

    _here("spark", request)
    epochs, out = 50, tmp_path / "run"
    opts = dict(engine="spark", epochs=epochs, n_push=2, n_fetch=2, **OPTIONS)
    _stopped_once_checkpointed(out)
    with pytest.raises(Interrupted):
        monsoon.train("exp", strategy, 2, out=out, checkpoint_every=EVERY, **opts)
    stopped = json.loads((out / "summary.json").read_text())
    assert 0 < stopped["updates"] < epochs * 8, stopped

    resumed = monsoon.train("exp", strategy, 2, resume=str(out), **opts).summary
    whole = _uninterrupted("spark", strategy, epochs, n_push=2, n_fetch=2)
    for key in ("updates", "examples", "bytes_sent", "bytes_sent_per_worker"):
        assert resumed[key] == whole.summary[key], key
    assert sum(resumed["staleness_counts"].values()) == resumed["updates"] == epochs * 8
    if strategy == "ssp":  # every worker finished every clock, once
        assert resumed["clocks"] == whole.summary["clocks"] == [epochs * 4] * 2
        assert sum(resumed["clock_staleness_counts"].values()) == \
            sum(whole.summary["clock_staleness_counts"].values()) == epochs * 16

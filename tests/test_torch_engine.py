"""The torch engine (issue 16) on real torchrun jobs, 2 ranks on gloo.

- sync x2 equals serial (float64, 1e-9) and DDP x2 from the same module;
  local-sgd with H = 1 equals sync (both launched by ``monsoon.train``, which
  becomes torchrun's elastic agent);
- a rank killed mid-run fails the run within ``--timeout``, naming the rank;
  with ``--max-restarts 1`` and checkpoints the run completes, equal to an
  uninterrupted one; a rank lost after the last step (in the gather of
  the ranks' reports) fails the run naming it, and rank 0's checkpoint
  there resumes;
- two torchrun invocations (``--nnodes 2``, c10d rendezvous on 127.0.0.1)
  train together, as two nodes would; with ``--max-restarts 1`` they carry
  on from the newest checkpoint when their agents' restart counts differ
  (one restarted its rank for a failure, the other for the membership
  change).

Every process is started in a session of its own and its whole tree is
killed in ``finally``; ports are free ones.
"""
import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import monsoon
from monsoon.errors import ConfigError
from monsoon.problems import TorchProblem

from ddp_reference import _free_port, run_ddp

pytestmark = pytest.mark.torchrun

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = Path(sys.executable).parent / "torchrun"
# A run long enough to be killed mid-way, short enough to finish (~2 ms a step)
RUN = ["--engine", "torch", "--workers", "2", "--strategy", "sync", "--problem", "exp",
       "--dtype", "float64", "--quiet", "--timeout", "10"]
STEPS = 800


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
            "OMP_NUM_THREADS": "1"}


def _start(args, log: Path) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=_env(),
                            cwd=ROOT, start_new_session=True)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (torchrun's ranks run in sessions of their own)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _kill_tree(proc: subprocess.Popen) -> None:
    for pid in reversed(_tree(proc.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


def _rank_pid(proc: subprocess.Popen, rank: int, command: bytes | None = None) -> int | None:
    """The pid of rank ``rank`` under ``proc``: a rank ``monsoon train
    --engine torch`` started is named ``monsoon-rankK``; one torchrun
    started runs ``command`` with RANK in its environment."""
    for pid in _tree(proc.pid):
        try:
            if command is None:
                if Path(f"/proc/{pid}/comm").read_text().strip() == f"monsoon-rank{rank}":
                    return pid
                continue
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in env and command in \
                    Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def _signal_pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` was sent to process ``pid`` and not yet delivered
    (it is stopped)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _wait_for_checkpoint(out: Path, proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not list((out / "checkpoints").glob("ckpt-*.npz")):
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within 60 s"
        time.sleep(0.005)


def _final_params(out: Path) -> np.ndarray:
    with np.load(out / "checkpoints" / f"ckpt-{STEPS:012d}.npz") as f:
        return f["params"]


def _node(port: int, out: Path, log: Path, restarts: int = 0) -> subprocess.Popen:
    """One of two torchrun invocations (one rank each) meeting at a c10d
    rendezvous on 127.0.0.1:``port``."""
    return _start([str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                   "--rdzv-id", f"monsoon-test-{port}", "--max-restarts", str(restarts),
                   "-m", "monsoon", "train", *RUN, "--steps", str(STEPS),
                   "--checkpoint-every", "50", "--out", str(out)], log)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two torchrun invocations, one rank each, meeting at a c10d rendezvous
    on 127.0.0.1: the uninterrupted run the restart tests compare with."""
    folder = tmp_path_factory.mktemp("two-nodes")
    out, port = folder / "run", _free_port()
    procs = []
    try:
        for node in range(2):
            procs.append(_node(port, out, folder / f"node{node}.log"))
        codes = [p.wait(timeout=100) for p in procs]
    finally:
        for p in procs:
            _kill_tree(p)
    logs = [(folder / f"node{n}.log").read_text() for n in range(2)]
    return out, codes, logs


def test_two_nodes_train_together(two_nodes):
    """Each node's torchrun exits 0; one of them holds rank 0 and writes the
    run folder, with the run's one event file (rank 1 began one too, empty:
    TensorBoard listed it); together they are one sync x2 run, equal to serial."""
    import json

    from monsoon.record.events import OWN_PATTERN

    out, codes, logs = two_nodes
    assert codes == [0, 0], "\n".join(logs)
    assert sum("run folder:" in log for log in logs) == 1  # only rank 0 reports
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["workers"] == 2
    tb = sorted(p.name for p in (out / "tb").glob(OWN_PATTERN))
    assert len(tb) == 1, tb
    assert summary["updates"] == STEPS and summary["dist_backend"] == "gloo"
    serial = monsoon.train("exp", "serial", 1, dtype="float64", steps=STEPS, progress=False,
                           evals=0)
    assert _rel(_final_params(out), serial.params) < 1e-9


def test_killed_rank_fails_within_timeout_and_restart_resumes(two_nodes, tmp_path):
    """Rank 1 is SIGKILLed after the first checkpoint. Without restarts the
    run fails at once, naming rank 1 (within 30 s under --timeout 60: a run
    that waited for its timeout to notice would take over twice that, and
    a loaded machine's slow exit stays under it); with
    --max-restarts 1 every rank restarts, resumes from the newest checkpoint
    and ends bit-identical to the uninterrupted two-node run."""
    for restarts in (0, 1):
        out = tmp_path / f"run{restarts}"
        steps = STEPS if restarts else 10 ** 6
        wait = [] if restarts else ["--timeout", "60"]  # the last --timeout given stands
        proc = _start([sys.executable, "-m", "monsoon", "train", *RUN, *wait, "--steps",
                       str(steps), "--checkpoint-every", "50", "--max-restarts", str(restarts),
                       "--out", str(out)], tmp_path / f"log{restarts}")
        try:
            _wait_for_checkpoint(out, proc)
            victim = _rank_pid(proc, 1)
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            code = proc.wait(timeout=60)
            elapsed = time.monotonic() - killed
        finally:
            _kill_tree(proc)
        log = (tmp_path / f"log{restarts}").read_text()
        if restarts == 0:
            assert code == 1, log
            assert elapsed < 30, f"the run took {elapsed:.1f} s to fail"
            assert "rank 1 died (SIGKILL)" in log
        else:
            assert code == 0, log
            import json

            summary = json.loads((out / "summary.json").read_text())
            assert summary["restarts"] == summary["agent_restarts"] == 1
            assert summary["resumed_at_step"] >= 50
            assert summary["updates"] == STEPS
            np.testing.assert_array_equal(_final_params(out), _final_params(two_nodes[0]))


def test_two_nodes_carry_on_when_their_agents_restart_counts_differ(two_nodes, tmp_path):
    """torchrun's agents count only their own ranks' failures: an agent whose
    rank is alive when another node joins the next rendezvous round restarts
    it uncounted (a membership change). Rank 1 is stopped (SIGSTOP) after the
    first checkpoint: rank 0 fails within --timeout and its agent restarts it
    (TORCHELASTIC_RESTART_COUNT 1), rank 1's agent stops its rank for the
    membership change (its count stays 0; the rank is let go on once the
    agent's SIGTERM is pending). The restarted ranks still meet, in rank 0's
    attempt, resume from the newest checkpoint and end bit-identical to the
    uninterrupted two-node run."""
    out, port = tmp_path / "run", _free_port()
    procs = [_node(port, out, tmp_path / f"node{n}.log", restarts=1) for n in range(2)]
    logs = lambda: "\n".join(f"--- node {n} ---\n" + (tmp_path / f"node{n}.log").read_text()
                             for n in range(2))  # noqa: E731
    try:
        _wait_for_checkpoint(out, procs[0])
        victim = next(filter(None, (_rank_pid(p, 1, b"-m\0monsoon\0train") for p in procs)))
        os.kill(victim, signal.SIGSTOP)
        deadline = time.monotonic() + 60  # rank 0's --timeout, then its agent's new round
        while not _signal_pending(victim, signal.SIGTERM):
            assert time.monotonic() < deadline, "rank 1's agent did not stop it\n" + logs()
            time.sleep(0.05)
        os.kill(victim, signal.SIGCONT)
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            _kill_tree(p)
    assert codes == [0, 0], logs()
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert summary["restarts"] == 1 and summary["resumed_at_step"] >= 50, summary
    assert summary["agent_restarts"] == 1, summary  # rank 0's agent restarted it, counted
    assert summary["updates"] == STEPS
    np.testing.assert_array_equal(_final_params(out), _final_params(two_nodes[0]))


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def test_sync_equals_serial_and_ddp_and_local_sgd_h1(tmp_path):
    """The same module, 10 full-batch steps of SGD on 2 ranks launched by
    ``monsoon.train``: sync equals serial and DDP (gloo) to 1e-9 in float64,
    reducing through shared memory (the default on one machine) and through
    gloo's all-reduce in buckets; local-sgd with one local step equals sync."""
    torch.manual_seed(7)
    module = _mlp().double()
    g = torch.Generator().manual_seed(1)
    X = torch.randn(64, 8, generator=g, dtype=torch.float64)
    y = (X[:, :1] * 2 - X[:, 1:2]).sin()
    reference = run_ddp(copy.deepcopy(module), nn.MSELoss(), X, y, lr=0.1, steps=10, seed=0,
                        path=tmp_path / "ddp.pt")
    problem = TorchProblem(module, nn.MSELoss(), X, y, dtype="float64")
    common = dict(lr=0.1, steps=10, batch_size=64, seed=0, progress=False)
    sync = monsoon.train(problem, "sync", 2, engine="torch", timeout=30, **common)
    assert sync.summary["engine"] == "torch" and sync.summary["world_size"] == 2
    assert sync.summary["reduce_via"] == "shm" and sync.summary["updates"] == 10
    buckets = monsoon.train(problem, "sync", 2, engine="torch", timeout=30,
                            reduce_via="backend", **common)
    assert buckets.summary["reduce_via"] == "gloo" and buckets.summary["bucket_count"] >= 1
    serial = monsoon.train(problem, "serial", 1, **common)
    for run in (sync, buckets):
        assert _rel(run.params, serial.params) < 1e-9
        mine = run.model.state_dict()
        for name, value in reference.items():
            assert _rel(mine[name], value) < 1e-9, name
    local = monsoon.train(problem, "local-sgd", 2, engine="torch", local_steps=1, timeout=30,
                          **common)
    assert _rel(local.params, sync.params) < 1e-9
    assert len(local.worker_params) == 2


def test_a_run_resumed_from_a_periodic_checkpoint_counts_every_steps_staleness(tmp_path):
    """Rank 0 counts each step's update (staleness 0) itself: a periodic
    checkpoint holds that count at its step, so a run resumed from it (a
    crashed run's newest) counts the whole run's (``monitor/tally.py``)."""
    from monsoon.record import checkpoints

    opts = dict(engine="torch", dtype="float64", steps=200, seed=0, evals=0, progress=False,
                timeout=30)
    whole = monsoon.train("exp", "sync", 2, out=tmp_path / "a", checkpoint_every=50, **opts)
    files = checkpoints.checkpoint_files(tmp_path / "a" / "checkpoints")
    for newer in files[:-1]:  # as a run killed after its oldest kept one left it
        newer.unlink()
    meta = checkpoints.read(files[-1]).meta
    assert meta["reason"] == "periodic" and 0 < meta["updates"] < 200
    resumed = monsoon.train("exp", "sync", 2, resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["updates"] == 200
    assert resumed.summary["staleness_counts"] == whole.summary["staleness_counts"] == {0: 200}


@pytest.mark.slow
def test_a_rank_lost_at_the_end_fails_the_run_naming_it_and_its_checkpoint_resumes(tmp_path):
    """Rank 1 exits after the last step, as it reports (``rank._finish``'s
    gather): the run fails in one line naming rank 1, no rank is left
    behind, and rank 0's checkpoint where every rank stopped (step 30, a
    checkpoint every 20) resumes. The resumed run's own final checkpoint
    says it ended ("final", not "periodic") and holds its whole counts."""
    import json

    from faulty import FaultyProblem
    from monsoon.monitor.tally import RunTally
    from monsoon.errors import WorkerError
    from monsoon.problems import make_problem
    from monsoon.record import checkpoints
    from test_kill_monitor import name

    def problem(rank):  # rank -1: none exits
        return FaultyProblem(make_problem("exp", "float64"), "exit-at-end", rank=rank)

    opts = dict(engine="torch", seed=0, evals=0, progress=False, timeout=30,
                checkpoint_every=20)
    with pytest.raises(WorkerError) as caught:
        monsoon.train(problem(1), "sync", 2, steps=30, out=tmp_path / "a", **opts)
    assert str(caught.value).startswith("torch engine: rank 1 failed (exit code 3)")
    assert not [pid for pid in _tree(os.getpid()) if name(pid).startswith("monsoon-rank")]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_worker"] == 1
    first = checkpoints.read(summary["checkpoint"]).meta
    assert first["step"] == 30
    resumed = monsoon.train(problem(-1), "sync", 2, steps=50, resume=str(tmp_path / "a"),
                            out=tmp_path / "b", **opts).summary
    assert resumed["resumed_at_step"] == 30 and resumed["updates"] == 50
    meta = checkpoints.read(resumed["checkpoint"]).meta
    assert (meta["reason"], meta["step"]) == ("final", 50)
    tally = RunTally.resumed(2, None, meta["totals"])
    assert tally.staleness == resumed["staleness_counts"] == {0: 50}
    assert sum(t["sent"] for t in tally.traffic.values()) == resumed["bytes_sent"] > 0
    # the first attempt's 30 steps of traffic count too (every step sends alike)
    sent = RunTally.resumed(2, None, first["totals"]).traffic
    assert [3 * per for per in resumed["bytes_sent_per_worker"]] == \
        [5 * sent[rank]["sent"] for rank in range(2)]


def test_a_failed_runs_folder_agrees_with_the_checkpoint_it_names(tmp_path):
    """Rank 1 exits at its 46th gradient, after rank 0's checkpoint of step
    40: the run fails, and this process, whose recorder holds no row (rank
    0 kept the curve, lost with the run), writes a folder that agrees with
    the checkpoint its summary names: its updates, examples and rows
    (before: "updates": 0 and metrics.csv its header alone)."""
    import csv
    import json

    from faulty import FaultyProblem
    from monsoon.errors import WorkerError
    from monsoon.problems import make_problem
    from monsoon.record import checkpoints

    problem = FaultyProblem(make_problem("exp", "float64"), "exit", rank=1, after=45)
    with pytest.raises(WorkerError, match="rank 1 failed"):
        monsoon.train(problem, "sync", 2, engine="torch", steps=100, seed=0, progress=False,
                      timeout=30, checkpoint_every=20, out=tmp_path / "a")
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    meta = checkpoints.read(summary["checkpoint"]).meta
    assert summary["status"] == "failed" and summary["updates"] == meta["updates"] == 40
    assert (summary.get("examples"), summary.get("dropped_updates")) == (meta["examples"], 0)
    with open(tmp_path / "a" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(meta["rows"]) > 1
    assert [int(r["updates"]) for r in rows] == [r["updates"] for r in meta["rows"]]
    assert [float(r["loss"]) for r in rows] == [r["loss"] for r in meta["rows"]]


def test_startup_counts_the_launchers_agent_and_rendezvous(monkeypatch):
    """startup_s counted from each rank's entry: a run whose launch took 12 s
    said "+0.12 s start-up" (the agent's start, its rendezvous and the ranks'
    forks left out), where the other engines count their workers' start.
    The launcher's work before the agent (here made 1.5 s longer) counts now."""
    from monsoon.engines.torchrun import launch

    slow = launch.remove_stale_folders
    monkeypatch.setattr(launch, "remove_stale_folders", lambda: (time.sleep(1.5), slow()))
    t = time.perf_counter()
    run = monsoon.train("logistic", "sync", 2, engine="torch", steps=5, seed=0, evals=0,
                        progress=False, timeout=30)
    took = time.perf_counter() - t
    assert 1.5 < run.summary["startup_s"] < took - run.summary["wall_time_s"]


@pytest.mark.parametrize("waited,why", [
    (0.0, "rank 1 died or its connection closed"),
    (2.0, "rank 1 died, stalled or was cut off for longer than --timeout 3 s")])
def test_a_failed_collective_says_how_long_it_waited_and_what_that_means(monkeypatch, waited,
                                                                        why):
    """A peer that exited 2.1 s into a run said "the all-reduce of step 3547
    failed after 2.1 s (... has exited); rank 1 died, stalled or was cut off
    for longer than --timeout 60 s": the time the run's, and a timeout that
    never came. The line now gives the collective's own wait, and names the
    timeout only where the wait reached half of it."""
    from types import SimpleNamespace

    from monsoon.engines.torchrun import rank as rank_module
    from monsoon.errors import WorkerError

    worker = rank_module.RankWorker.__new__(rank_module.RankWorker)
    worker.rank, worker.world, worker.engine = 0, 2, SimpleNamespace(timeout=3.0)
    worker.t0 = time.perf_counter() - 100  # the run started 100 s ago
    clock = iter([10.0, 10.0 + waited])
    monkeypatch.setattr(rank_module.time, "perf_counter", lambda: next(clock))
    with pytest.raises(WorkerError) as failed:
        with worker._collective("step 3547"):
            raise RuntimeError("Connection closed by peer: rank 1 has exited")
    assert str(failed.value) == (f"rank 0: the all-reduce of step 3547 failed after {waited:.1f} s "
                                 f"(Connection closed by peer: rank 1 has exited); {why}")
    assert failed.value.worker == 1


def test_a_sync_step_with_a_nan_gradient_is_dropped_and_counted_as_on_the_local_engine():
    """Rank 1's every fifth gradient after its third is NaN: the sum every
    rank gets is NaN, and each drops the step (``RankWorker._apply_mean``)
    and counts it, through shared memory (``auto`` on x86) and gloo alike,
    as the local engine does (``server/reduce.py``), to the bit. (A sum of
    finite gradients cannot overflow here: each rank sends (n_k / B) g_k.)"""
    from faulty import FaultyProblem
    from monsoon.problems import make_problem

    problem = FaultyProblem(make_problem("exp"), "nan", rank=1, after=3, every=5)
    opts = dict(steps=20, seed=0, evals=0, progress=False)
    local = monsoon.train(problem, "sync", 2, backend="threads", **opts)
    assert (local.summary["updates"], local.summary["dropped_updates"]) == (16, 4)
    for via in ("auto", "backend"):
        run = monsoon.train(problem, "sync", 2, engine="torch", reduce_via=via, timeout=30,
                            **opts)
        assert (run.summary["updates"], run.summary["dropped_updates"]) == (16, 4), via
        np.testing.assert_array_equal(run.params, local.params)


def test_each_ranks_own_dropped_local_steps_are_counted():
    """Rank 1's gradient is NaN every fifth call: its LocalApply drops the
    step on its own copy. summary.json counts every rank's drops, as the
    local engine does (not rank 0's alone), in the local steps' own field."""
    from faulty import FaultyProblem
    from monsoon.problems import make_problem

    problem = FaultyProblem(make_problem("exp"), "nan", rank=1, after=3, every=5)
    opts = dict(steps=20, seed=0, progress=False)
    local = monsoon.train(problem, "local-sgd", 2, **opts)
    run = monsoon.train(problem, "local-sgd", 2, engine="torch", timeout=30, **opts)
    assert local.summary["dropped_local_updates"] > 0
    assert run.summary["dropped_local_updates"] == local.summary["dropped_local_updates"]
    assert np.isfinite(run.params).all()


def test_local_steps_are_counted_in_their_own_unit_and_stop_a_diverging_run():
    """Rank 1's every third gradient after its third is NaN: every rank's
    local steps are counted apart from the rounds (all applied), as on the
    local engine, and the run finishes. Every rank's gradients NaN after the
    second: rank 0 stops the run on its own local steps, and the message
    counts every rank's, as the summary does."""
    from faulty import FaultyProblem
    from monsoon.problems import make_problem
    from monsoon.record.recorder import DROPPED_LOCAL

    inner = make_problem("exp")
    opts = dict(steps=400, local_steps=8, seed=0, progress=False)
    problem = FaultyProblem(inner, "nan", rank=1, after=3, every=3)
    local = monsoon.train(problem, "local-sgd", 2, **opts).summary
    run = monsoon.train(problem, "local-sgd", 2, engine="torch", timeout=30, **opts).summary
    for s in (local, run):
        assert (s["updates"], s["dropped_updates"]) == (400 // 8, 0)
        assert s["local_updates"] + s["dropped_local_updates"] == 2 * 400
        assert s["status"] == "finished"
    assert run["dropped_local_updates"] == local["dropped_local_updates"] > 100
    diverging = monsoon.train(FaultyProblem(inner, "nan", rank=None, after=2), "local-sgd", 2,
                              engine="torch", timeout=30, steps=20_000, local_steps=8, seed=0,
                              progress=False, raise_on_divergence=False).summary
    assert diverging["status"] == "diverged" and diverging["local_updates"] == 2 * 2
    assert diverging["stopped"] == DROPPED_LOCAL.format(
        dropped=diverging["dropped_local_updates"], updates=diverging["local_updates"])
    assert diverging["examples"] < 20_000 * make_problem("exp").n_examples


def test_a_ranks_refusal_is_the_runs_not_restarted_and_the_folder_given_back(tmp_path):
    """A rank's ConfigError (every rank refuses the problem as it builds
    its instance) is raised as it is, once: no attempt is restarted under
    --max-restarts (each would be refused alike: no rank refuses twice;
    one that starts after another's refusal exits at once), and the previous run's
    folder is given back as it was. It failed as "rank 0 failed", after
    two restarts, the previous results wiped."""
    from faulty import RefusedInRanks
    from monsoon.problems import make_problem
    from test_refuse_early import previous_run, snapshot

    out, log = tmp_path / "run", tmp_path / "refusals.txt"
    before = previous_run(out)
    with pytest.raises(ConfigError, match="^problem refused in rank [01]$"):
        monsoon.train(RefusedInRanks(make_problem("exp"), log), "sync", 2, engine="torch",
                      max_restarts=2, steps=5, timeout=30, progress=False, out=out)
    refused = log.read_text().split()  # a rank that starts after another's refusal only exits
    assert 1 <= len(refused) == len(set(refused)) and set(refused) <= {"0", "1"}, refused
    assert snapshot(out) == before


def test_refusals_name_the_engine_to_use():
    for strategy, advice in (("async", "cannot carry out Push .*engines that run async: local, sim, ray"),
                             ("hogwild", "cannot carry out Apply .*engines that run hogwild: local")):
        with pytest.raises(ConfigError, match=advice):
            monsoon.train("exp", strategy, 2, engine="torch", steps=2, progress=False)


def test_the_agents_log_of_a_failed_rank_keeps_its_line_without_a_traceback(caplog):
    """While the agent runs, its line about a failed rank is logged without
    the traceback (formatting one imports torch._dynamo: seconds between a
    rank's death and the run's failure); outside, the logger is as it was."""
    import logging

    from monsoon.engines.torchrun.launch import agent_log_without_tracebacks

    log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")

    def failed():
        try:
            raise RuntimeError("process 1 terminated with signal SIGKILL")
        except RuntimeError:
            log.exception("failed (exitcode: -9) local_rank: 1")

    with caplog.at_level(logging.ERROR, logger=log.name):
        with agent_log_without_tracebacks():
            failed()
        failed()
    inside, outside = caplog.records[-2:]
    assert inside.getMessage() == outside.getMessage() == "failed (exitcode: -9) local_rank: 1"
    assert inside.exc_info is None and outside.exc_info is not None
    assert not log.filters


def test_a_third_party_strategy_without_exact_checkpoints_is_refused_a_resume(tmp_path):
    """``--resume`` of a strategy whose ranks do not share the parameters at
    every step, yet keep no private copies that ``refuse_checkpoints`` would
    name (a plug-in's sync on fetched copies): preflight lets it through,
    and the rank's resume point refuses it in one line, before reading any
    checkpoint (its non-sync branch is reachable)."""
    from monsoon.engines.torchrun import rank
    from monsoon.engines.torchrun.engine import TorchEngine
    from monsoon.strategies.base import Strategy
    from monsoon.strategies.ops import AllReduce, Fetch, Gradient

    class PrivateSync(Strategy):
        name = "private-sync"
        uses = (Gradient, AllReduce, Fetch)
        shared_params = False
        synchronous = True

    class Comm:
        attempt, rank, world = 0, 0, 2

    class Problem:
        name, n_params, backward = "p", 3, None

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    engine = TorchEngine(resume_dir=str(folder))
    engine.given = frozenset({"resume_dir"})
    engine.check(PrivateSync(), 2)
    engine.preflight(Problem(), PrivateSync(), 2, 4)
    with pytest.raises(ConfigError, match="resumes runs whose ranks share the parameters"):
        rank._resume_point(engine, Comm(), None, PrivateSync(), np.zeros(3), None)


# 100 rows in batches of 16 over 3 ranks: six steps of 16 (parts 6, 5, 5) and one of
# 4 (2, 1, 1) an epoch; rank 0's part times the ranks is not the step's batch
UNEVEN = dict(batch_size=16, seed=0, lr=0.05, progress=False, timeout=60)


def _uneven_problem() -> TorchProblem:
    g = torch.Generator().manual_seed(1)
    X = torch.randn(100, 4, generator=g)
    torch.manual_seed(0)
    return TorchProblem(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)),
                        nn.MSELoss(), X, X[:, :1].sin())


def _examples_after(updates: int) -> int:
    """The examples the three ranks computed for ``updates`` steps of the plan."""
    epochs, steps = divmod(updates, 7)
    return 100 * epochs + 16 * min(steps, 6)


@pytest.mark.parametrize("reduce_via,buckets", [("shm", None), ("backend", 1)])
def test_rows_count_every_ranks_examples_with_uneven_shards(tmp_path, reduce_via, buckets):
    """Each curve row and live row counts the examples the ranks really
    computed for the updates its parameters hold (their sum, as the flags
    carried them), in one all-reduce or in gradient buckets (where a step's
    examples ride in its own first bucket), and the summary the same."""
    from test_live import scalars

    from monsoon.record import read_metrics

    out = tmp_path / "run"
    run = monsoon.train(_uneven_problem(), "sync", 3, engine="torch", epochs=2, evals=20,
                        out=out, reduce_via=reduce_via, live_every=0.001, **UNEVEN)
    assert run.summary["bucket_count"] == buckets
    assert run.summary["updates"] == 14 and run.summary["examples"] == 200
    rows = read_metrics(out / "metrics.csv")
    assert len(rows) > 3 and rows[-1]["updates"] == 14
    for row in rows:
        assert row["examples"] == _examples_after(row["updates"]), row
    exact = {_examples_after(u) for u in range(15)}
    live = [step for step, _ in scalars(out / "tb")["run/minibatch_loss"]]
    assert live and set(live) <= exact and live[-1] == 200, live


def test_checkpoints_and_a_resumed_run_count_every_ranks_examples(tmp_path):
    """Uneven shards: each periodic checkpoint holds the examples of the
    steps it holds, and a run resumed from one counts on from there: its
    rows and summary are those of an uninterrupted run."""
    from monsoon.record import checkpoints, read_metrics

    opts = dict(engine="torch", epochs=2, evals=20, **UNEVEN)
    monsoon.train(_uneven_problem(), "sync", 3, out=tmp_path / "a", checkpoint_every=3, **opts)
    files = checkpoints.checkpoint_files(tmp_path / "a" / "checkpoints")
    for path in files:
        meta = checkpoints.read(path).meta
        assert meta["examples"] == _examples_after(meta["step"]), meta
    for newer in files[:-1]:  # as a run killed after its oldest kept one left it
        newer.unlink()
    assert checkpoints.read(files[-1]).meta["step"] == 9  # past the first epoch's short step
    resumed = monsoon.train(_uneven_problem(), "sync", 3, out=tmp_path / "b",
                            resume=str(tmp_path / "a"), **opts)
    assert resumed.summary["updates"] == 14 and resumed.summary["examples"] == 200
    for row in read_metrics(tmp_path / "b" / "metrics.csv"):
        assert row["examples"] == _examples_after(row["updates"]), row


def test_a_torch_run_stops_at_its_target_before_its_budget():
    """--target-loss stops a torch engine run as a local one
    (``test_target_stop.py``): rank 0 evaluates its rows as it takes them,
    and the first at the target stops every rank after the next collective."""
    run = monsoon.train("logistic", "sync", 2, engine="torch", steps=3000, seed=0,
                        target_loss=0.45, progress=False, timeout=30)
    s = run.summary
    assert s["status"] == "reached target" and "stopped" not in s, s
    assert s["stopped_at_target"].startswith("reached the target loss 0.45"), s
    assert s["updates"] < 3000 and s["final_loss"] <= 0.45, s
    assert run.problem.loss(run.params) == pytest.approx(s["final_loss"], rel=1e-5)

"""The ray engine on a real local Ray instance (2 CPUs): sync, async, faults,
checkpoints. Skipped only where Ray is not installed.

Every actor is a process that imports Ray and monsoon (seconds on a busy
machine, more with torch): the claims here are the engine's, so the runs
use the NumPy problem "logistic" (its workers import no torch) and, where
the claim is not about the parameter server's split, one shard. The tests
whose claim needs several shards (sync's exactness, elastic regrouping of
every shard) keep one a worker."""
import threading
import time

import numpy as np
import pytest

import monsoon
from monsoon.errors import ConfigError, WorkerError
from monsoon.problems import make_problem

from faulty import ExitOnce, FaultyProblem, UnshippableProblem

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("local_ray")]


def test_sync_equals_serial_on_the_full_batch():
    opts = dict(steps=15, batch_size=16384, dtype="float64", seed=3, lr=0.5)  # every example
    serial = monsoon.train("logistic", "serial", **opts)
    run = monsoon.train("logistic", "sync", 2, engine="ray", shards=2, **opts)
    np.testing.assert_allclose(run.params, serial.params, rtol=1e-6, atol=1e-12)
    assert run.summary["engine"] == "ray" and run.summary["updates"] == 15
    assert run.summary["shards"] == 2


@pytest.mark.parametrize("compress", [None, "topk:0.1"])
def test_a_step_not_finite_in_one_shards_slice_is_dropped_on_every_shard(compress):
    """Worker 1's gradient is NaN in its first element only, every fifth
    step: shard 0 alone sees the NaN (compressed too: a top-k message
    decodes into one slice), yet the whole step is dropped (never half
    applied) and counted once, as on the local engine; the loss curve's
    updates count the steps applied, as summary.json does."""
    def problem():
        return FaultyProblem(make_problem("logistic", dtype="float64"), "nan", rank=1, after=3,
                             every=5)

    opts = dict(steps=30, batch_size=64, dtype="float64", seed=0, evals=10, compress=compress)
    local = monsoon.train(problem(), "sync", 2, **opts)
    run = monsoon.train(problem(), "sync", 2, engine="ray", shards=2, **opts)
    assert local.summary["dropped_updates"] > 0
    np.testing.assert_allclose(run.params, local.params, rtol=1e-9, atol=1e-12)
    for key in ("dropped_updates", "updates"):
        assert run.summary[key] == local.summary[key], key
    assert run.summary["updates"] + run.summary["dropped_updates"] == 30
    updates = [row["updates"] for row in run.history]
    assert updates == sorted(updates) and updates[-1] == run.summary["updates"], updates


def _same_gradient_everywhere():
    """A quadratic whose every example pulls w to the same target t, so
    that every worker's gradient is w - t whichever workers a step counts:
    k steps of SGD (lr) from 0 leave w = t (1 - (1 - lr)^k)."""
    from monsoon.problems.quadratic import Quadratic

    problem = Quadratic(n_params=8, n_examples=240, dtype="float64", seed=2)
    problem.offsets[:] = 0.0
    return problem


@pytest.mark.parametrize("fault", [None, "nan"])
def test_backup_workers_on_two_shards_count_the_same_workers_on_every_shard(fault):
    """Sync with a backup worker (3 workers, each step counts 2) on two
    shards. With "nan", worker 1's gradient is NaN in its first element
    (shard 0's slice) every second step after its second: the step is
    dropped where shard 0 counts worker 1, and then on both shards, so the
    whole vector is t (1 - (1 - lr)^k) for one k, the updates applied; a
    shard that applied a step the other dropped would leave two."""
    problem = _same_gradient_everywhere()
    target = problem.target.copy()
    if fault:
        problem = FaultyProblem(problem, "nan", rank=1, after=2, every=2)
    steps, lr = 30, 0.1
    run = monsoon.train(problem, "sync", 2, backup_workers=1, engine="ray", shards=2,
                        steps=steps, batch_size=24, lr=lr, seed=1, evals=0, timeout=30)
    summary = run.summary
    assert summary["shards"] == 2 and summary["backup_workers"] == 1
    assert summary["updates"] + summary["dropped_updates"] == steps
    assert (summary["dropped_updates"] > 0) == bool(fault), summary["dropped_updates"]
    # each step counts two workers (the third is late, or skips the step); the
    # staleness histogram counts each update applied once, a dropped step not
    assert summary["staleness_counts"] == {0: summary["updates"]}
    assert 1 <= summary["late_gradients"] <= steps
    assert np.isfinite(run.params).all()
    np.testing.assert_allclose(run.params, target * (1 - (1 - lr) ** summary["updates"]),
                               rtol=1e-9, atol=1e-12)


def test_summary_json_counts_every_contribution_a_step_did_not_count_as_late(tmp_path):
    """Sync with a backup worker (3 workers, each step counts the first 2):
    each part a worker sends is counted by a step or late, so summary.json's
    late_gradients are the parts sent that no step counted (the staleness
    histogram counts each step's update once, at 0); every part is the
    gradient of 16 examples (48 a step, split in 3) and a dense vector."""
    import json

    inner = make_problem("logistic", dtype="float64")
    monsoon.train(inner, "sync", 2, backup_workers=1, engine="ray", shards=1, steps=40,
                  batch_size=48, dtype="float64", seed=0, evals=0, timeout=30, out=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    parts = summary["examples"] / 16  # 48 examples a step, split among 3 workers
    assert summary["staleness_counts"] == {"0": 40}
    assert summary["late_gradients"] >= 1
    assert summary["late_gradients"] == parts - 2 * 40
    assert summary["bytes_sent"] == parts * inner.n_params * 8


def _train_in_background(**kwargs):
    box = {}

    def target():
        try:
            box["result"] = monsoon.train(**kwargs)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def _kill_worker_when_running(name: str, examples: int = 320, settle_s: float = 0.0):
    """Kill the named worker actor once it has trained on ``examples``
    (so mid-run, however slowly the machine starts its actors), and
    ``settle_s`` later (time for the driver's polls, every 0.05 s, to see it)."""
    deadline = time.monotonic() + 120  # a worker process starts in seconds, minutes when busy
    while time.monotonic() < deadline:
        try:
            actor = ray.get_actor(name)
            ray.get(actor.ask.remote("ready"), timeout=120)
            break
        except ValueError:
            time.sleep(0.2)
    else:
        raise AssertionError(f"actor {name} never appeared")
    while time.monotonic() < deadline and \
            ray.get(actor.ask.remote("progress"), timeout=30)["examples"] < examples:
        time.sleep(0.05)
    time.sleep(settle_s)
    ray.kill(actor)


def _idle_pids(holding=None) -> set:
    """The idle hosts' process ids (``holding``: only those that hold CPUs,
    a worker's, or only those that hold none, a shard's)."""
    from monsoon.engines.ray.hosts import POOL

    return {ray.get(handle.pid.remote(), timeout=30) for _, key, handle in POOL.idle
            if holding is None or bool(key[0]) == holding}


def test_the_next_run_reuses_the_hosts_and_ends_bit_identical(monkeypatch):
    """A run that ended normally leaves its worker and shard processes to the
    next run of this driver (no process start); the next run ends exactly as
    the first; a run whose shards are of another shape (more threads) still
    takes the idle workers' hosts (a new shard holds no CPU, so nothing is
    ended for it); a run whose workers reserve another share of a CPU gets
    hosts of its own (the idle ones, holding CPUs, are ended first); and idle
    hosts end after IDLE_S."""
    from monsoon.engines.ray import engine as ray_engine
    from monsoon.engines.ray import hosts

    hosts.POOL.clear(ray)
    monkeypatch.setattr(hosts, "IDLE_S", 60.0)  # a busy machine's gaps between the runs
    opts = dict(steps=12, batch_size=64, dtype="float64", seed=4, lr=0.3, shards=1)
    first = monsoon.train("logistic", "sync", 2, engine="ray", **opts)
    before = _idle_pids()
    assert len(before) == 3  # two workers and a shard, all idle
    second = monsoon.train("logistic", "sync", 2, engine="ray", **opts)
    assert _idle_pids() == before
    np.testing.assert_array_equal(second.params, first.params)
    workers = _idle_pids(holding=True)
    monkeypatch.setattr(ray_engine, "server_threads", lambda n: 16)  # a shard of another shape
    wider = monsoon.train("logistic", "sync", 2, engine="ray", **opts)
    np.testing.assert_array_equal(wider.params, first.params)
    assert workers <= _idle_pids(holding=True)  # the same worker processes served it
    monkeypatch.setattr(hosts, "IDLE_S", 0.2)
    monkeypatch.setattr(ray_engine, "cpus_per_worker", lambda n, cpus: 0.5)  # another share
    three = monsoon.train("logistic", "async", 3, engine="ray", **opts)
    assert three.summary["updates"] == 12
    deadline = time.monotonic() + 30
    while hosts.POOL.idle_count() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hosts.POOL.idle_count() == 0


DRIVER = """
import os, sys, time, ray, monsoon
from monsoon.engines.ray.hosts import POOL
ray.init(address=sys.argv[1], log_to_driver=False,
         runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
monsoon.train("logistic", "sync", 2, engine="ray", steps=4, shards=1, progress=False)
print(" ".join(str(ray.get(h.pid.remote(), timeout=60)) for _, _, h in POOL.idle), flush=True)
time.sleep(600)
"""


def test_kill_9_of_a_driver_takes_its_idle_hosts(tmp_path):
    """The idle hosts a run left for the next one belong to the driver's Ray
    job: ``kill -9`` of the driver ends them, as it ends any actor of its."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, ray.get_runtime_context().gcs_address],
        stdout=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{here}:{here.parent}"})
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3  # two workers and a shard, idle
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
            time.sleep(0.1)
        assert not [p for p in pids if os.path.exists(f"/proc/{p}")]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_a_call_for_an_ended_runs_object_is_refused():
    """A host's object has a generation: a late call meant for the object of
    a run that ended never reaches the next run's."""
    from monsoon.engines.ray.hosts import Host

    host = Host()
    host.build(1, dict, ((("a", 1),),))
    assert host.call(1, "get", "a") == 1
    host.drop()
    host.build(2, dict, ((("a", 2),),))
    with pytest.raises(RuntimeError, match="run that ended"):
        host.call(1, "get", "a")
    assert host.call(2, "get", "a") == 2


def test_async_carries_on_when_a_worker_actor_is_killed():
    thread, box = _train_in_background(problem="logistic", strategy="async", workers=2,
                                       engine="ray", shards=1, steps=1200, run_name="killasync",
                                       timeout=30)
    _kill_worker_when_running("monsoon-killasync-worker-1")
    thread.join(120)
    assert "error" not in box, box.get("error")
    summary = box["result"].summary
    assert [f["worker"] for f in summary["failed_workers"]] == [1]
    assert "Actor" in summary["failed_workers"][0]["error"]
    assert summary["examples"] < 1200 * 16  # worker 1's share was lost, not redone
    assert np.isfinite(summary["final_loss"])


@pytest.mark.parametrize("strategy", ["async", "ssp"])
def test_a_lost_workers_traffic_and_staleness_stay_counted(strategy):
    """Worker 1's actor pauses at its 51st gradient, after 50 pushes (the
    driver's polls see its figures), and exits: the run goes on without
    it, and its summary counts those 50 pushes' bytes beside worker 0's,
    one entry per worker, their staleness, and SSP's clock report. Before,
    the lost worker's traffic and clock report were left out: one byte
    entry for two workers, bytes_sent_per_update below a push's size,
    its clocks 0."""
    problem = FaultyProblem(make_problem("exp"), "exit-after-pause", rank=1, after=50)
    run = monsoon.train(problem, strategy, 2, engine="ray", shards=1, epochs=20, seed=0,
                        timeout=20, progress=False)
    s = run.summary
    assert [f["worker"] for f in s["failed_workers"]] == [1]
    push = problem.n_params * np.dtype(problem.dtype).itemsize
    assert s["bytes_sent_per_worker"] == [(s["updates"] - 50) * push, 50 * push]
    assert s["bytes_sent"] == s["updates"] * push
    assert s["bytes_sent_per_update"] == push
    # async: its 50th push's staleness was still unread; SSP's tick had read it
    assert sum(s["staleness_counts"].values()) == s["updates"] - (strategy == "async")
    if strategy == "ssp":
        # its clock report: 50 clocks, a count for each gradient begun (its 51st too)
        assert s["clocks"] == [s["updates"] - 50, 50]
        assert sum(s["clock_staleness_counts"].values()) == s["updates"] + 1


def test_a_run_stopped_by_divergence_counts_what_its_workers_did():
    """Worker 1's gradients are all NaN after its second: every step is
    dropped and the recorder stops the run while both workers still run.
    Their reports are taken before they are killed, so summary.json counts
    their examples, traffic and epochs, and the curve's last row (the
    summary's counts) does not fall back to zero."""
    problem = FaultyProblem(make_problem("logistic", dtype="float64"), "nan", rank=1, after=2)
    run = monsoon.train(problem, "sync", 2, engine="ray", shards=1, steps=10 ** 5, seed=0,
                        raise_on_divergence=False)
    summary = run.summary
    assert summary["status"] == "diverged"
    assert summary["updates"] == 2 and summary["dropped_updates"] > 100
    assert summary["examples"] >= 16 * (summary["updates"] + summary["dropped_updates"]) - 16
    assert summary["epochs"] == summary["examples"] / problem.n_examples > 0
    examples = [row["examples"] for row in run.history]
    assert examples == sorted(examples) and examples[-1] == summary["examples"], examples
    assert len(summary["bytes_sent_per_worker"]) == 2 and all(summary["bytes_sent_per_worker"])
    assert summary["bytes_sent"] == sum(summary["bytes_sent_per_worker"])


def test_local_sgd_counts_its_local_steps_apart_and_stops_when_most_are_dropped():
    """Worker 1's every third gradient after its third is NaN: its local
    steps are counted in local_updates and dropped_local_updates, every
    round is applied, and the run (more drops than rounds, far fewer than
    the local steps applied) finishes. Every worker's gradients NaN after
    the second: the driver's rows read the workers' local counts, and the
    recorder stops the run, its message counting what the summary counts."""
    from monsoon.record.recorder import DROPPED_LOCAL

    inner = make_problem("logistic", dtype="float64")
    healthy = monsoon.train(FaultyProblem(inner, "nan", rank=1, after=3, every=3), "local-sgd",
                            2, engine="ray", shards=1, steps=400, local_steps=8, seed=0).summary
    assert (healthy["updates"], healthy["dropped_updates"]) == (400 // 8, 0)
    assert healthy["local_updates"] + healthy["dropped_local_updates"] == 2 * 400
    assert healthy["dropped_local_updates"] == len(range(6, 401, 3))  # worker 1's calls
    assert healthy["status"] == "finished"
    diverging = monsoon.train(FaultyProblem(inner, "nan", rank=None, after=2), "local-sgd", 2,
                              engine="ray", shards=1, steps=20_000, local_steps=8, seed=0,
                              raise_on_divergence=False).summary
    assert diverging["status"] == "diverged"
    assert diverging["local_updates"] == 2 * 2
    assert diverging["stopped"] == DROPPED_LOCAL.format(
        dropped=diverging["dropped_local_updates"], updates=diverging["local_updates"])
    assert diverging["examples"] < 20_000 * 16


def test_a_non_finite_push_counts_as_sent_as_on_the_local_engine():
    """Async: worker 1's every other gradient is NaN. Ray drops such a push at
    the worker (its shards see only their slices), the local server on
    arrival; on both, every push is counted in bytes_sent, once, dense."""
    for engine in ("local", "ray"):
        inner = make_problem("logistic", dtype="float64")
        problem = FaultyProblem(inner, "nan", rank=1, after=2, every=2)
        options = {"shards": 1} if engine == "ray" else {}
        summary = monsoon.train(problem, "async", 2, engine=engine, steps=60, seed=0,
                                **options).summary
        pushes = summary["updates"] + summary["dropped_updates"]
        assert summary["dropped_updates"] > 5, (engine, summary["dropped_updates"])
        assert summary["bytes_sent"] == pushes * inner.n_params * 8, (engine, summary)


def test_a_push_dropped_at_the_worker_is_told_to_the_rule_as_on_the_local_engine(tmp_path,
                                                                                  monkeypatch):
    """Async: worker 1's every other gradient is NaN. The local engine's
    server tells the rule of each drop (``ServerCore.admits``); Ray's worker
    drops the push itself, and its shards' rules hear of it at the worker's
    next call (a read or a push; the run's end for the last): on both, the
    rule is told of every drop once, over the whole vector (shard by shard
    on Ray's two shards)."""
    from monsoon.rules import RULES

    from faulty import TellsDrops

    RULES._load()
    monkeypatch.setitem(RULES._plugins, "tells-drops", TellsDrops)
    inner = make_problem("logistic", dtype="float64")
    for engine in ("local", "ray"):
        told = tmp_path / f"{engine}.told"
        told.write_text("")
        problem = FaultyProblem(inner, "nan", rank=1, after=2, every=2)
        options = {"shards": 2} if engine == "ray" else {}
        summary = monsoon.train(problem, "async", 2, engine=engine, steps=60, seed=0,
                                rule="tells-drops", told_file=str(told), **options).summary
        sizes = [int(line) for line in told.read_text().split()]
        assert summary["dropped_updates"] > 5, (engine, summary["dropped_updates"])
        assert sum(sizes) == summary["dropped_updates"] * inner.n_params, (engine, sizes)


@pytest.mark.parametrize("end", ["lost", "stopped"])
def test_the_drops_of_a_worker_that_never_reports_are_told_and_counted(tmp_path, monkeypatch,
                                                                       end):
    """Async, a push dropped at the worker: its shards hear of it with the
    worker's next call, which a worker that does not end its run never
    makes. "lost": worker 1 (every other gradient NaN) is killed mid-run
    and the run carries on; "stopped": every gradient is NaN after the
    second, and the recorder stops the run while both workers go on. Either
    way every shard's rule (2 shards: a worker's last call may reach one
    before the driver's tell and the other after it) is told of every drop
    summary.json counts, and of no other; and the lost worker's examples
    count: worker 0's whole share (600 batches) and at least a batch of its."""
    from monsoon.rules import RULES

    from faulty import TellsDrops

    RULES._load()
    monkeypatch.setitem(RULES._plugins, "tells-drops", TellsDrops)
    told = tmp_path / "told"
    told.write_text("")
    inner = make_problem("logistic", dtype="float64")
    opts = dict(problem=FaultyProblem(inner, "nan", rank=1, after=2, every=2), steps=1200,
                run_name="dropslost")
    if end == "stopped":
        opts = dict(problem=FaultyProblem(inner, "nan", rank=None, after=2), steps=4000,
                    raise_on_divergence=False)
    thread, box = _train_in_background(strategy="async", workers=2, engine="ray", shards=2,
                                       seed=0, timeout=30, rule="tells-drops",
                                       told_file=str(told), **opts)
    if end == "lost":
        _kill_worker_when_running("monsoon-dropslost-worker-1", settle_s=0.15)
    thread.join(120)
    assert "error" not in box, box.get("error")
    summary = box["result"].summary
    if end == "lost":
        assert [f["worker"] for f in summary["failed_workers"]] == [1]
        assert summary["examples"] >= (600 + 1) * summary["batch_size"]
    else:
        assert summary["status"] == "diverged"
    sizes = [int(line) for line in told.read_text().split()]
    assert summary["dropped_updates"] > 0
    assert sum(sizes) == summary["dropped_updates"] * inner.n_params, (len(sizes), summary)


def test_async_pushes_dropped_at_the_worker_count_in_the_curve_rows_as_on_the_local_engine():
    """Async: every worker's gradients are NaN after its second. Ray drops
    such a push at the worker (``Worker.push``: its shards never see it),
    the local engine's worker likewise; on both, the curve's rows count
    those drops as summary.json does, so the recorder stops the run once
    most of its updates are dropped (long before its budget), its message
    saying the summary's counts."""
    from monsoon.record.recorder import DROPPED

    for engine in ("local", "ray"):
        problem = FaultyProblem(make_problem("logistic", dtype="float64"), "nan", rank=None,
                                after=2)
        options = {"shards": 1} if engine == "ray" else {}
        summary = monsoon.train(problem, "async", 2, engine=engine, steps=4000, seed=0,
                                raise_on_divergence=False, **options).summary
        assert summary["status"] == "diverged", (engine, summary)
        assert summary["stopped"] == DROPPED.format(dropped=summary["dropped_updates"],
                                                    updates=summary["updates"]), engine
        assert summary["updates"] + summary["dropped_updates"] < 4000, (engine, summary)


def test_sync_fails_fast_when_a_worker_actor_is_killed():
    thread, box = _train_in_background(problem="logistic", strategy="sync", workers=2,
                                       engine="ray", shards=1, steps=10 ** 6,
                                       run_name="killsync", timeout=20)
    _kill_worker_when_running("monsoon-killsync-worker-1")
    t0 = time.monotonic()
    thread.join(60)
    assert not thread.is_alive()
    assert isinstance(box.get("error"), WorkerError), box
    assert box["error"].worker == 1 and "worker 1" in str(box["error"])
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("shards", [1, 2])  # 2: shard 0 decides for both (sync_step.py)
def test_sync_with_a_backup_carries_on_when_a_worker_actor_is_killed(shards):
    thread, box = _train_in_background(problem="logistic", strategy="sync", workers=2,
                                       backup_workers=1, engine="ray", shards=shards, steps=300,
                                       batch_size=48, run_name=f"killbackup{shards}", timeout=20)
    _kill_worker_when_running(f"monsoon-killbackup{shards}-worker-0")
    thread.join(120)
    assert "error" not in box, box.get("error")
    summary = box["result"].summary
    assert [f["worker"] for f in summary["failed_workers"]] == [0]
    assert summary["updates"] == 300


def test_resume_from_a_checkpoint_ends_like_an_uninterrupted_run(tmp_path):
    # one shard: checkpoints_every_engine resumes a run of two shards bit-identical
    opts = dict(steps=20, batch_size=64, dtype="float64", seed=5, lr=0.05, shards=1)
    # the uninterrupted run, on the local engine: its two workers' gradients are the
    # Ray run's, summed in either order to the same floats, so the Ray run of one
    # shard ends bit-identical to it (and costs no actors)
    whole = monsoon.train("logistic", "sync", 2, backend="threads",
                          **{k: v for k, v in opts.items() if k != "shards"})
    crashing = FaultyProblem(make_problem("logistic", "float64"), "raise", rank=0, after=12)
    with pytest.raises(WorkerError):
        monsoon.train(crashing, "sync", 2, engine="ray", checkpoint_every=5,
                      out=tmp_path / "first", **opts)
    saved = sorted(p.name for p in (tmp_path / "first" / "checkpoints").iterdir())
    assert saved[-1] == "ckpt-000000000010.npz"  # the newest before the crash
    assert all(name.startswith("ckpt-") for name in saved)  # nothing half written
    resumed = monsoon.train("logistic", "sync", 2, engine="ray", resume=str(tmp_path / "first"),
                            out=tmp_path / "second", **opts)
    assert resumed.summary["resumed_from"].endswith("ckpt-000000000010.npz")
    assert resumed.summary["updates"] == 20 and resumed.summary["examples"] == 20 * 64
    np.testing.assert_array_equal(resumed.params, whole.params)
    assert resumed.history[0] == whole.history[0]  # the loss curve carries on


def test_async_resumes_from_its_workers_positions(tmp_path):
    from monsoon.record import checkpoints

    opts = dict(epochs=1, batch_size=128, shards=1, seed=0, timeout=30, evals=10)
    # 128 updates: checkpoints at 32, 64, 96 (and 128), the newest three kept; the
    # oldest kept is early enough that the workers' positions leave work to do
    first = monsoon.train("logistic", "async", 2, engine="ray", out=tmp_path / "a",
                          checkpoint_every=32, **opts)
    files = sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))
    assert len(files) >= 2
    for f in files[1:]:
        f.unlink()
    meta = checkpoints.read(files[0]).meta
    assert meta["exact"] is False and len(meta["positions"]) == 2
    assert meta["step"] % 32 == 0 and 0 < meta["step"] < first.summary["updates"]
    resumed = monsoon.train("logistic", "async", 2, engine="ray", resume=str(tmp_path / "a"),
                            **opts)
    assert resumed.summary["resumed_from"] == str(files[0])
    # the budget is not done again: the resumed run does the rest of it
    assert resumed.summary["examples"] == pytest.approx(first.summary["examples"], rel=0.15)
    assert resumed.summary["updates"] > meta["step"]
    assert resumed.summary["final_loss"] < 2 * first.summary["final_loss"] + 0.05


def test_a_resumed_runs_checkpoints_count_the_time_before_it_once(tmp_path):
    """A run resumed from a periodic checkpoint written at time_s T carries
    its clock on from T, once: its final checkpoint's time_s is its
    summary's wall time (which counts T), and its curve's rows run from T to
    it. (Counted twice, the checkpoint said T more, and a run resumed from
    it counted T twice in its wall time, its rows and examples_per_s.)"""
    import csv

    from monsoon.record import checkpoints

    opts = dict(steps=20, batch_size=64, shards=1, seed=0, timeout=30, evals=10)
    monsoon.train("logistic", "sync", 2, engine="ray", out=tmp_path / "a", checkpoint_every=5,
                  **opts)
    files = checkpoints.checkpoint_files(tmp_path / "a" / "checkpoints")  # newest first
    for newer in files[:-1]:  # as a run killed after its oldest kept one left it
        newer.unlink()
    before = checkpoints.read(files[-1]).meta
    assert before["reason"] == "periodic" and before["step"] < 20 and before["time_s"] > 0
    resumed = monsoon.train("logistic", "sync", 2, engine="ray", resume=str(tmp_path / "a"),
                            out=tmp_path / "b", checkpoint_every=5, **opts)
    wall = resumed.summary["wall_time_s"]
    final = checkpoints.read(checkpoints.checkpoint_files(tmp_path / "b" / "checkpoints")[0]).meta
    assert final["reason"] == "final" and final["step"] == 20
    assert final["time_s"] == pytest.approx(wall, abs=1e-6) and wall > before["time_s"]
    with open(tmp_path / "b" / "metrics.csv") as f:
        times = [float(row["time_s"]) for row in csv.DictReader(f)]
    after = [t for t in times if t > before["time_s"]]
    assert after and after == sorted(after) and after[-1] == pytest.approx(wall, abs=1e-5)


def test_resuming_private_copies_is_refused_before_ray_starts(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ConfigError, match="the ray engine keeps no checkpoints of local-sgd's "
                                          "private worker copies"):
        monsoon.train("exp", "local-sgd", 2, engine="ray", epochs=1, resume=str(tmp_path))


def test_a_worker_that_cannot_start_is_named():
    problem = UnshippableProblem(make_problem("logistic"))
    with pytest.raises(WorkerError, match="Ray worker 0 could not start.*cannot load"):
        monsoon.train(problem, "async", 2, engine="ray", shards=1, steps=4, timeout=30)


def test_hogwild_is_refused_on_ray():
    with pytest.raises(ConfigError, match="the ray engine cannot carry out Apply .*engines that run hogwild: local, sim$"):
        monsoon.train("exp", "hogwild", 2, engine="ray", epochs=1)


def test_a_push_to_two_shards_counts_its_staleness_once():
    """Each shard's reply to a push carries its slice's staleness; the
    histogram counts the push once (its stalest slice's), not once a shard."""
    s = monsoon.train("logistic", "async", 2, engine="ray", shards=2, steps=40, evals=0, seed=0,
                      timeout=60).summary
    assert s["shards"] == 2 and sum(s["staleness_counts"].values()) == s["updates"] == 40


@pytest.mark.parametrize("strategy", ["async", "ssp"])
def test_a_rows_examples_are_those_of_the_updates_its_parameters_hold(monkeypatch, strategy):
    """Each push carries 2 batches of 32 (n_push 2), so a row at updates k
    (shard 0's version) has 64 k examples, on two shards. The driver took
    the examples from the workers' figures, then the shards' parameters and
    versions: the pushes that landed in between were in the row's updates
    and not its examples, and those still on their way in its examples and
    not its updates (``late`` widens the gap, as a busy driver would). Now
    shard 0 counts the examples of the pushes it applies and hands them
    with its version."""
    from monsoon.engines.ray.engine import RayEngine

    params = RayEngine._params

    def late(self, *args, **kwargs):
        time.sleep(0.03)  # the workers' pushes land meanwhile
        return params(self, *args, **kwargs)

    monkeypatch.setattr(RayEngine, "_params", late)
    run = monsoon.train("logistic", strategy, 2, engine="ray", shards=2, steps=480,
                        batch_size=32, n_push=2, n_fetch=2, lr=0.1, seed=0, evals=24,
                        timeout=60, progress=False)
    rows = [(row["updates"], row["examples"]) for row in run.history]
    assert len(rows) >= 4 and rows[-1] == (240, 480 * 32), rows
    assert rows == [(k, 64 * k) for k, _ in rows]


def test_cli_trains_on_the_ray_engine(tmp_path):
    from monsoon.cli import main

    code = main(["train", "--engine", "ray", "--problem", "logistic", "--strategy", "async",
                 "--workers", "2", "--shards", "1", "--steps", "64", "--out",
                 str(tmp_path / "run"), "--quiet"])
    assert code == 0
    import json

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["engine"] == "ray" and summary["workers"] == 2
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["run_name"]  # actors were named after the run


def test_elastic_sync_regroups_without_a_lost_worker_and_takes_it_back(tmp_path):
    """sync --elastic: worker 1's process exits after 50 gradients; the
    other carries the step on with the whole batch, and the driver starts
    worker 1 again, which rejoins at a step boundary and trains to the end.
    Every step is the full-batch gradient, so the run ends where an
    uninterrupted one does."""
    # 1500 steps: worker 1's new actor joined within 600 steps of its exit at a load of 13
    opts = dict(steps=1500, batch_size=64, dtype="float64", seed=5, lr=0.05)
    whole = monsoon.train("logistic", "serial", **opts)  # sync's steps, on one worker
    dying = ExitOnce(make_problem("logistic", "float64"), tmp_path / "exited", rank=1, after=50)
    run = monsoon.train(dying, "sync", 2, engine="ray", elastic=True, timeout=30, shards=2,
                        **opts)  # every shard regroups
    s = run.summary
    events = s["membership"]
    assert [e["event"] for e in events] == ["left", "joined"], events
    assert all(e["worker"] == 1 for e in events)
    left, joined = events[0], events[1]
    assert left["members"] == [0] and joined["members"] == [0, 1]
    assert 50 <= left["step"] <= joined["step"] < 1500
    assert [f["worker"] for f in s["failed_workers"]] == [1]
    assert s["updates"] == 1500 and s["status"] == "finished"
    np.testing.assert_allclose(run.params, whole.params, rtol=1e-9, atol=1e-12)


def test_elastic_is_refused_where_the_engine_cannot_regroup():
    with pytest.raises(ConfigError, match="elastic membership.*engines that run sync: ray"):
        monsoon.train("exp", "sync", 2, engine="local", elastic=True, steps=4)
    with pytest.raises(ConfigError, match="choose one"):
        monsoon.train("exp", "sync", 2, engine="ray", elastic=True, backup_workers=1, steps=4)


TWO_RUNS = """
import monsoon, ray
for i in range(2):
    run = monsoon.train("logistic", "async", 2, engine="ray", steps=40, progress=False)
    print(run.summary["status"], ray.is_initialized(), flush=True)
"""


def test_a_second_run_in_one_process_starts_its_own_ray_again(tmp_path):
    """Where no Ray runs, each run starts a local instance and shuts it down
    at its end. The next run's instance numbers its job as the last one did:
    the pool must not lend it the idle hosts of the instance that is gone
    (it did: "Can't find actor ... from a different cluster"), as a notebook
    or ``monsoon compare --engine ray`` on a laptop trains twice."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run([sys.executable, "-c", TWO_RUNS], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["finished", "False"] * 2, proc.stdout


def test_a_run_without_an_address_starts_its_own_ray_beside_a_recorded_cluster(tmp_path):
    """A ``ray start`` on this machine records its address in
    RAY_TMPDIR/ray/ray_current_cluster, and ray.init(address=None) joins it:
    a run without --address (or RAY_ADDRESS) failed ("When connecting to an
    existing cluster, num_cpus and num_gpus must not be provided"). It starts
    a private instance, as promised, and stops it at its end. The recorded
    cluster is a fake one in a private RAY_TMPDIR (short: Ray's socket paths
    live under it), so nothing shared is touched."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="mr-", dir="/tmp"))
    try:
        (tmp / "ray").mkdir()
        (tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:6390\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_TMPDIR=str(tmp), PYTHONPATH=str(root))
        proc = subprocess.run([sys.executable, "-m", "monsoon", "train", "--engine", "ray",
                               "--problem", "logistic", "--strategy", "sync", "--workers", "2",
                               "--steps", "10", "--out", str(tmp_path / "run"), "--quiet"],
                              capture_output=True, text=True, env=env, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads((tmp_path / "run" / "summary.json").read_text())["updates"] == 10
        assert any((tmp / "ray").glob("session_*"))  # its own instance, under RAY_TMPDIR
        left = _processes_naming(str(tmp))
        deadline = time.monotonic() + 30
        while left and time.monotonic() < deadline:  # Ray's daemons end a moment after
            time.sleep(0.5)
            left = _processes_naming(str(tmp))
        for pid in left:  # stop what the run left, then say so
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        assert not left, f"the run left Ray's processes {left}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _processes_naming(text: str) -> list[int]:
    """The pids of the processes whose command line holds ``text``."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_ray_run_stops_at_its_target_before_its_budget():
    """--target-loss stops a Ray run as a local one (``test_target_stop.py``):
    the driver's rows are evaluated as they are taken, and the first at the
    target ends the run, with the parameters that check found."""
    run = monsoon.train("logistic", "async", 2, engine="ray", shards=1, steps=3000,
                        target_loss=0.45, progress=False)
    s = run.summary
    assert s["status"] == "reached target" and "stopped" not in s, s
    assert s["stopped_at_target"].startswith("reached the target loss 0.45"), s
    assert s["updates"] < 3000 and s["final_loss"] <= 0.45, s
    assert run.problem.loss(run.params) == pytest.approx(s["final_loss"], rel=1e-5)

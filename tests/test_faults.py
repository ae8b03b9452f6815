"""Bad gradients, failing and dying workers, divergence: nothing hangs or is lost."""
import os
import time

import numpy as np
import pytest

import monsoon
from monsoon.errors import Interrupted, TrainingDiverged, WorkerError
from monsoon.problems import make_problem

from faulty import FaultyProblem, SignalOnce


@pytest.mark.parametrize("strategy,workers", [("serial", 1), ("sync", 2), ("async", 2),
                                              ("hogwild", 2)])
def test_nan_gradient_is_dropped_and_counted(strategy, workers):
    rank = 0 if workers == 1 else 1
    problem = FaultyProblem(make_problem("exp"), "nan", rank=rank, after=3, every=5)
    run = monsoon.train(problem, strategy, workers, epochs=5, seed=0)
    assert run.summary["dropped_updates"] > 0
    assert np.isfinite(run.params).all()
    assert np.isfinite(run.summary["final_loss"])
    assert run.summary["status"] == "finished"


def test_sync_fails_fast_with_the_workers_error():
    problem = FaultyProblem(make_problem("exp"), "raise", rank=1, after=5)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker 1 failed.*injected failure on worker 1"):
        monsoon.train(problem, "sync", 2, epochs=50, timeout=20)
    assert time.monotonic() - t0 < 20


def test_a_failed_sync_run_keeps_the_curve_it_drew(tmp_path):
    """A worker's failure mid-run: the run folder's curve holds the rows
    taken before it, evaluated then (the snapshots were dropped unevaluated:
    metrics.csv had its header alone and summary.json 0 updates)."""
    import json

    problem = FaultyProblem(make_problem("exp"), "raise", rank=1, after=600)
    with pytest.raises(WorkerError, match="worker 1 failed"):
        monsoon.train(problem, "sync", 2, steps=2000, evals=40, timeout=20, progress=False,
                      out=tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = (tmp_path / "run" / "metrics.csv").read_text().strip().splitlines()[1:]
    assert summary["status"] == "failed" and len(rows) >= 2
    assert 0 < summary["updates"] <= 600 and summary["updates"] == int(rows[-1].split(",")[1])


@pytest.mark.parametrize("strategy", ["async", "hogwild"])
@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_async_and_hogwild_carry_on_without_a_failed_worker(strategy, mode):
    problem = FaultyProblem(make_problem("exp"), mode, rank=1, after=5)
    run = monsoon.train(problem, strategy, 3, epochs=6, seed=0, timeout=20)
    failed = run.summary["failed_workers"]
    assert [f["worker"] for f in failed] == [1]
    expected = "injected failure on worker 1" if mode == "raise" else "exit code 3"
    assert expected in failed[0]["error"]
    assert run.summary["status"] == "finished"
    # the two healthy workers did all of their share: two thirds of the budget, and more
    assert run.summary["examples"] > 0.6 * 6 * 256
    assert run.summary["final_loss"] < make_problem("exp").loss(make_problem("exp").initial_params(0))


@pytest.mark.slow
def test_sync_does_not_hang_when_a_worker_hangs(monkeypatch):
    # the workers' join, timed: a worker that is not stuck ends within a step of the abort,
    # so the hung one is killed after a few of its (millisecond) steps' time and the error
    # comes out: not after the timeout again, or a SIGTERM that workers ignore
    from monsoon.monitor.lifecycle import alive
    from monsoon.monitor.pool import WorkerPool

    joins, join = [], WorkerPool.join

    def timed_join(pool, wait_s):
        t = time.monotonic()
        join(pool, wait_s)
        joins.append((time.monotonic() - t, [h.pid for h in pool.handles]))

    monkeypatch.setattr(WorkerPool, "join", timed_join)
    problem = FaultyProblem(make_problem("exp"), "hang", rank=1, after=3)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="waited 3 s"):
        monsoon.train(problem, "sync", 2, epochs=50, timeout=3)
    assert time.monotonic() - t0 < 30
    [(took, pids)] = joins
    assert took < 3.5, f"the workers' join took {took:.1f} s after the run failed"
    assert not any(alive(pid) for pid in pids)


def test_sync_fails_when_a_worker_process_dies():
    problem = FaultyProblem(make_problem("exp"), "exit", rank=0, after=3)
    with pytest.raises(WorkerError, match="worker 0 failed.*exit code 3"):
        monsoon.train(problem, "sync", 2, epochs=50, timeout=20)


@pytest.fixture
def sleepy_monitor(monkeypatch):
    """The monitor sleeps up to 60 s between looks when it records nothing:
    only a worker's message or death can wake it in time."""
    from monsoon.engines.local import engine

    init = engine.LocalEngine.__init__
    monkeypatch.setattr(engine.LocalEngine, "__init__",
                        lambda self, *a, **k: init(self, *a, **{**k, "idle_s": 60.0}))


def test_an_idle_monitor_wakes_when_the_workers_finish(sleepy_monitor):
    t0 = time.monotonic()
    run = monsoon.train("exp", "sync", 2, epochs=2, evals=0, seed=0)
    assert run.summary["status"] == "finished"
    assert run.summary["wall_time_s"] < 10
    assert time.monotonic() - t0 < 40


def test_an_idle_monitor_wakes_when_a_worker_dies(sleepy_monitor):
    problem = FaultyProblem(make_problem("exp"), "exit", rank=1, after=3)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="worker 1 failed.*exit code 3"):
        monsoon.train(problem, "sync", 2, epochs=50, evals=0, timeout=60)
    assert time.monotonic() - t0 < 40


def test_an_idle_monitor_of_threads_wakes_on_a_stop_signal(sleepy_monitor):
    """Worker 1 sends the run SIGINT from its 500th gradient: the monitor of
    threads, asleep for up to 60 s, wakes on it and stops the workers long
    before the budget (32,000 updates) is done. It slept through it before,
    in a lock wait that a signal does not end, and the run went to the end."""
    stopper = SignalOnce(make_problem("exp"), os.getpid(), rank=1, after=500, pause=0)
    with pytest.raises(Interrupted) as info:
        monsoon.train(stopper, "async", 2, epochs=2000, evals=0, seed=0, timeout=20,
                      backend="threads", progress=False)
    assert info.value.exit_code == 130
    assert 500 <= info.value.result.summary["updates"] < 8000


def test_divergence_stops_with_advice(tmp_path):
    with pytest.raises(TrainingDiverged, match="lower the learning rate") as info:
        monsoon.train("exp", "serial", lr=1e6, epochs=200, out=tmp_path / "run")
    # the run folder is still written, and records why it stopped
    summary = (tmp_path / "run" / "summary.json").read_text()
    assert '"status": "diverged"' in summary
    assert info.value.result.summary["examples"] < 200 * 256


@pytest.mark.parametrize("options", [{}, {"backup_workers": 1}])
def test_the_divergence_message_says_the_summarys_counts(options):
    """The message counts what summary.json counts (the recorder's row that
    stopped the run is older than the workers' last counts)."""
    with pytest.raises(TrainingDiverged) as info:
        monsoon.train("exp", "sync", 2, lr=1e6, epochs=300, seed=0, **options)
    summary = info.value.result.summary
    said = (f"{summary['dropped_updates']} updates had non-finite gradients and were "
            f"dropped (only {summary['updates']} applied)")
    assert said in summary["stopped"]
    assert said in str(info.value)


def test_async_fails_when_every_worker_fails():
    problem = FaultyProblem(make_problem("exp"), "raise", rank=0, after=2)
    with pytest.raises(WorkerError, match="every worker failed"):
        monsoon.train(problem, "async", 1, epochs=5, timeout=20)


@pytest.mark.parametrize("backend", ["processes", "threads"])
def test_a_diverged_sync_run_returns_the_parameters_it_reached(tmp_path, backend):
    """A replicated sync step keeps the parameters in the workers' replicas:
    stopped by the divergence, worker 0 still hands its replica over, so the
    result, the final row and model.pt are the diverged parameters (as
    serial's are), not the initial ones; and the stop message counts what
    the summary counts."""
    import math

    problem = make_problem("exp")
    w0 = problem.initial_params(0)
    with pytest.raises(TrainingDiverged) as info:
        monsoon.train("exp", "sync", 2, lr=1e6, epochs=300, seed=0, backend=backend,
                      out=tmp_path / "run")
    result = info.value.result
    summary = result.summary
    assert summary["status"] == "diverged" and summary["sync_step"] == "replicated"
    assert not math.isfinite(summary["final_loss"])
    assert not math.isfinite(result.history[-1]["loss"])
    assert not np.array_equal(result.params, w0)
    assert not math.isfinite(problem.loss(result.params))
    if "non-finite gradients" in summary["stopped"]:
        assert (f"diverged: {summary['dropped_updates']} updates had non-finite gradients "
                f"and were dropped (only {summary['updates']} applied)") in summary["stopped"]
    assert summary["stopped"] in str(info.value)


def test_a_worker_that_cannot_be_set_up_leaves_no_thread_and_no_socket(monkeypatch):
    """A threads run whose worker 1 fails to start: worker 0, started
    already, ends with the run, and the inbox's sockets close (they stayed
    open, and worker 0 ran on against a closed store)."""
    import threading

    problem = make_problem("exp")
    made = type(problem).for_worker

    def for_worker(self, rank, workers):
        if rank == 1:
            raise RuntimeError("cannot copy")
        return made(self, rank, workers)

    monkeypatch.setattr(type(problem), "for_worker", for_worker)
    # Counted as "no more than before": a thread or file another test left
    # may end meanwhile; a leak adds at least one per run, three runs here.
    fds, threads = len(os.listdir("/proc/self/fd")), set(threading.enumerate())
    for _ in range(3):
        with pytest.raises(monsoon.MonsoonError):
            monsoon.train(problem, "async", 2, steps=10_000, backend="threads",
                          progress=False, evals=0)
    assert set(threading.enumerate()) <= threads
    assert len(os.listdir("/proc/self/fd")) <= fds


START_METHOD = """
import multiprocessing as mp
import monsoon
if __name__ == "__main__":
    monsoon.train("exp", "async", 2, steps=40, progress=False, evals=0)
    mp.set_start_method("spawn")
    print(mp.get_start_method())
"""


def test_a_run_on_processes_leaves_the_start_method_to_the_user(tmp_path):
    """Starting the fork server fixed the process's default start method,
    so a script's own ``set_start_method`` after a run raised "context has
    already been set"."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(START_METHOD)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "spawn"


def test_a_lost_workers_traffic_and_staleness_stay_counted():
    """Worker 1's process exits at its 51st gradient, after 50 pushes: the
    async run goes on without it, and its summary counts those 50 pushes'
    bytes and staleness beside worker 0's, one entry per worker. Before,
    only the workers that reported at the end were summed: staleness
    counts short of the updates, one byte entry for two workers, and a
    bytes_sent_per_update below any message's size."""
    problem = FaultyProblem(make_problem("exp"), "exit", rank=1, after=50)
    run = monsoon.train(problem, "async", 2, epochs=20, seed=0, timeout=20, progress=False)
    s = run.summary
    assert [f["worker"] for f in s["failed_workers"]] == [1]
    push = problem.n_params * np.dtype(problem.dtype).itemsize
    assert sum(s["staleness_counts"].values()) == s["updates"]
    assert s["bytes_sent_per_worker"] == [(s["updates"] - 50) * push, 50 * push]
    assert s["bytes_sent"] == s["updates"] * push
    assert s["bytes_sent_per_update"] == push

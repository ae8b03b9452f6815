"""A resumed run's summary counts the whole run, not its last attempt.

A run stopped by a signal writes a final checkpoint that carries the
counts its workers kept themselves (staleness counts, traffic, SSP's
clocks: ``RunTally.totals``); the resumed run's tally starts from them, so
its summary.json and metrics.csv's ``bytes_sent`` column equal an
uninterrupted run's. Synchronous runs replay exactly: every counted field
is equal. Async and SSP carry on rather than replay: the totals the budget
fixes (bytes sent per worker, gradients counted, clocks) are equal; how
the staleness is spread is not deterministic. A sync run's periodic
checkpoint carries every count at its step too; a snapshot strategy's
cannot (its workers hold them), so a run resumed from one counts from
there on and says so (``counted_from_update``), as from a checkpoint
without totals (an older monsoon's); no figure mixes two attempts."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import monsoon
from monsoon.errors import Interrupted
from monsoon.record import checkpoints

pytestmark = pytest.mark.slow

EPOCHS = 150  # 2,400 updates on exp with 2 workers: the signal lands after update 200


def interrupted_then_resumed(tmp_path, strategy, **options):
    """(folder, options, the stopped run's result): the run is stopped by
    SIGTERM once its first checkpoint is written."""
    opts = dict(seed=0, evals=5, epochs=EPOCHS, progress=False, **options)
    folder = tmp_path / "a"

    def signal_once_going():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if list((folder / "checkpoints").glob("ckpt-*.npz")):
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_once_going, daemon=True).start()
    with pytest.raises(Interrupted) as stopped:
        monsoon.train("exp", strategy, 2, out=folder, checkpoint_every=200, **opts)
    return folder, opts, stopped.value.result


def resume_and_compare(tmp_path, strategy, **options):
    folder, opts, _ = interrupted_then_resumed(tmp_path, strategy, **options)
    resumed = monsoon.train("exp", strategy, 2, resume=str(folder), **opts)
    whole = monsoon.train("exp", strategy, 2, **opts)
    return resumed, whole


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_an_interrupted_sync_runs_summary_counts_the_examples_of_its_applied_steps(tmp_path,
                                                                                 backend):
    """A sync worker counts a batch's examples at its gradient; one that the
    stop leaves with its step unapplied takes them out again, so the
    summary and the last row count what the final checkpoint does."""
    folder, _, stopped = interrupted_then_resumed(tmp_path, "sync", backend=backend)
    final = checkpoints.read(checkpoints.checkpoint_files(folder / "checkpoints")[0]).meta
    assert final["reason"] == "interrupted"
    assert stopped.summary["updates"] == final["updates"] == stopped.history[-1]["updates"]
    assert stopped.summary["examples"] == final["examples"] == stopped.history[-1]["examples"]
    assert stopped.summary["epochs"] * stopped.summary["n_examples"] == final["examples"]


def assert_bytes_column(result, per_update):
    """metrics.csv's bytes_sent at each row: its updates at the whole run's rate."""
    assert result.history and all(
        row["bytes_sent"] == int(round(row["updates"] * per_update)) for row in result.history)


@pytest.mark.parametrize("options", [dict(backend="threads"), dict(backend="processes"),
                                     dict(backend="threads", compress="topk:0.1")],
                         ids=["sync-threads", "sync-processes", "sync-topk"])
def test_a_resumed_sync_run_counts_every_field_as_the_uninterrupted_one(tmp_path, options):
    resumed, whole = resume_and_compare(tmp_path, "sync", **options)
    assert np.array_equal(resumed.params, whole.params)
    for key in ("updates", "examples", "bytes_sent", "bytes_received",
                "bytes_sent_uncompressed", "bytes_sent_per_update", "bytes_sent_per_worker",
                "bytes_received_per_worker", "compression_ratio", "residual_norm",
                "staleness_counts", "late_gradients", "dropped_updates"):
        assert resumed.summary[key] == whole.summary[key], key
    assert_bytes_column(resumed, whole.summary["bytes_sent_per_update"])


@pytest.mark.parametrize("strategy", ["async", "ssp"])
def test_a_resumed_racing_run_counts_the_whole_runs_traffic_gradients_and_clocks(tmp_path,
                                                                                strategy):
    resumed, whole = resume_and_compare(tmp_path, strategy, backend="threads")
    for key in ("updates", "examples", "bytes_sent", "bytes_sent_per_worker",
                "bytes_sent_per_update", "dropped_updates"):
        assert resumed.summary[key] == whole.summary[key], key
    assert sum(resumed.summary["staleness_counts"].values()) == \
        sum(whole.summary["staleness_counts"].values())
    if strategy == "ssp":  # every worker finished every clock, once
        assert resumed.summary["clocks"] == whole.summary["clocks"] == [EPOCHS * 8] * 2
        assert sum(resumed.summary["clock_staleness_counts"].values()) == \
            sum(whole.summary["clock_staleness_counts"].values())
    assert_bytes_column(resumed, whole.summary["bytes_sent_per_update"])


def test_a_checkpoint_without_totals_resumes_counting_from_its_step(tmp_path):
    folder, opts, _ = interrupted_then_resumed(tmp_path, "sync", backend="threads")
    newest = checkpoints.checkpoint_files(folder / "checkpoints")[0]
    saved = checkpoints.read(newest)
    assert saved.meta["totals"]["traffic"]
    meta = {k: v for k, v in saved.meta.items() if k not in ("totals", "format", "version")}
    checkpoints.save(folder / "checkpoints", meta["updates"], meta, saved.arrays)
    resumed = monsoon.train("exp", "sync", 2, resume=str(folder), **opts)
    assert resumed.summary["updates"] == EPOCHS * 16
    # this attempt's traffic alone: 2 workers x 196 bytes a step after the
    # checkpoint, and the figures per update over those steps, not the run's
    left = EPOCHS * 16 - int(meta["updates"])
    assert resumed.summary["bytes_sent"] == 2 * 196 * left
    assert resumed.summary["counted_from_update"] == meta["updates"]
    assert resumed.summary["bytes_sent_per_update"] == 2 * 196
    assert resumed.summary["staleness_counts"] == {0: left}
    assert_bytes_column(resumed, 2 * 196)


def test_a_resume_with_a_smaller_budget_than_its_checkpoint_is_refused_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    first = monsoon.train("exp", "sync", 2, epochs=4, seed=0, evals=0, progress=False,
                          backend="threads", out=tmp_path / "a", checkpoint_every=48)
    n = first.summary["n_examples"]
    done = checkpoints.read(checkpoints.checkpoint_files(tmp_path / "a" / "checkpoints")[0])
    assert done.meta["examples"] == 3 * n  # 16 updates an epoch: past what --epochs 2 asks
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "monsoon", "train", "--problem", "exp", "--strategy", "sync",
         "--workers", "2", "--epochs", "2", "--seed", "0", "--backend", "threads",
         "--resume", str(tmp_path / "a"), "--out", str(tmp_path / "b"), "--quiet"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--epochs 2" in lines[0] and "--epochs 3 or more" in lines[0]
    # nothing written (train's check that --out is writable leaves the folder, empty)
    assert not (tmp_path / "b").exists() or not list((tmp_path / "b").iterdir())
    # the same budget resumes (a finished run: nothing left to do)
    again = monsoon.train("exp", "sync", 2, epochs=4, seed=0, evals=0, progress=False,
                          backend="threads", resume=str(tmp_path / "a"))
    assert again.summary["updates"] == 4 * 16


def _keep_oldest(directory):
    """Remove every checkpoint in ``directory`` but the oldest kept one (a
    periodic one, early enough that a run resumed from it has work left),
    as a run killed after writing it would have left it; returns its meta."""
    files = checkpoints.checkpoint_files(directory)
    for newer in files[:-1]:
        newer.unlink()
    return checkpoints.read(files[-1]).meta


def test_a_serial_run_resumed_from_a_periodic_checkpoint_counts_the_whole_run(tmp_path):
    """Serial's one worker runs in the thread that writes the checkpoints:
    a periodic one holds every count at its step, so a run resumed from it
    (a crashed run's newest) counts all of them."""
    opts = dict(seed=0, evals=5, epochs=60, progress=False)
    whole = monsoon.train("exp", "serial", 1, out=tmp_path / "a", checkpoint_every=100, **opts)
    meta = _keep_oldest(tmp_path / "a" / "checkpoints")
    assert meta["reason"] == "periodic" and 0 < meta["updates"] < whole.summary["updates"]
    resumed = monsoon.train("exp", "serial", 1, resume=str(tmp_path / "a"), **opts)
    for key in ("updates", "examples", "bytes_sent", "bytes_received", "staleness_counts"):
        assert resumed.summary[key] == whole.summary[key], key
    assert sum(resumed.summary["staleness_counts"].values()) == whole.summary["updates"]


def test_a_run_that_ends_on_its_newest_snapshot_writes_it_again_with_its_counts(tmp_path,
                                                                               monkeypatch):
    """An async run whose last periodic snapshot holds its final state (the
    monitor's last look came after the last update) writes it again once
    the workers have reported, with their counts (reason "final"): resumed,
    the finished run has nothing to do and keeps its figures, rather than
    counting from its end (bytes 0, no per-update rate)."""
    from monsoon.engines.local.monitor import WorkerMonitor

    finish = WorkerMonitor.finish

    def last_look_writes_a_snapshot(self, wall, up):
        self.snapshot("periodic", wall)
        return finish(self, wall, up)

    monkeypatch.setattr(WorkerMonitor, "finish", last_look_writes_a_snapshot)
    opts = dict(seed=0, evals=5, epochs=20, progress=False, backend="threads")
    first = monsoon.train("exp", "async", 2, out=tmp_path / "a", checkpoint_every=200, **opts)
    monkeypatch.undo()
    newest = checkpoints.read(checkpoints.checkpoint_files(tmp_path / "a" / "checkpoints")[0])
    assert newest.meta["reason"] == "final"
    assert newest.meta["updates"] == first.summary["updates"]
    again = monsoon.train("exp", "async", 2, resume=str(tmp_path / "a"), **opts)
    for key in ("updates", "examples", "bytes_sent", "bytes_sent_per_update",
                "bytes_sent_per_worker", "staleness_counts"):
        assert again.summary[key] == first.summary[key], key
    assert "counted_from_update" not in again.summary


SYNC_COUNTS = ("updates", "examples", "bytes_sent", "bytes_received", "bytes_sent_per_update",
               "bytes_sent_per_worker", "bytes_received_per_worker", "compression_ratio",
               "staleness_counts")


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_a_sync_runs_periodic_checkpoint_carries_every_count_at_its_step(tmp_path, backend):
    """A sync run killed after a periodic checkpoint (the newest one left)
    resumes counting the whole run: the workers' byte counts at the
    checkpoint's step are in it (``checkpointing.save_traffic``)."""
    opts = dict(seed=0, evals=5, epochs=60, progress=False, backend=backend)
    whole = monsoon.train("exp", "sync", 2, out=tmp_path / "a", checkpoint_every=200, **opts)
    meta = _keep_oldest(tmp_path / "a" / "checkpoints")
    assert meta["reason"] == "periodic" and 0 < meta["updates"] < whole.summary["updates"]
    assert meta["totals"]["staleness"] == {"0": meta["updates"]}
    resumed = monsoon.train("exp", "sync", 2, resume=str(tmp_path / "a"), **opts)
    for key in SYNC_COUNTS:
        assert resumed.summary[key] == whole.summary[key], key
    assert "counted_from_update" not in resumed.summary
    assert_bytes_column(resumed, whole.summary["bytes_sent_per_update"])


def test_a_periodic_checkpoint_of_a_resumed_sync_run_carries_both_attempts_counts(tmp_path):
    """A run resumed from an interrupted run's final checkpoint writes
    periodic checkpoints holding what it carried and its own counts at
    their step: a run resumed from one of them counts the whole run."""
    first, opts, _ = interrupted_then_resumed(tmp_path, "sync", backend="threads")
    monsoon.train("exp", "sync", 2, resume=str(first), out=tmp_path / "b", checkpoint_every=200,
                  **opts)
    meta = _keep_oldest(tmp_path / "b" / "checkpoints")
    assert meta["reason"] == "periodic"
    third = monsoon.train("exp", "sync", 2, resume=str(tmp_path / "b"), **opts)
    whole = monsoon.train("exp", "sync", 2, **opts)
    for key in SYNC_COUNTS:
        assert third.summary[key] == whole.summary[key], key


def test_a_finished_sync_run_resumed_keeps_its_figures(tmp_path):
    """Resumed from the periodic checkpoint it ended on, a finished run has
    nothing left to do: its summary and bytes column stay as they were
    (they were zeros and nulls: the checkpoint held no counts)."""
    opts = dict(seed=0, evals=5, steps=400, progress=False, backend="threads")
    first = monsoon.train("exp", "sync", 2, out=tmp_path / "a", checkpoint_every=100, **opts)
    again = monsoon.train("exp", "sync", 2, resume=str(tmp_path / "a"), out=tmp_path / "a",
                          **opts)
    for key in SYNC_COUNTS:
        assert again.summary[key] == first.summary[key], key
    assert first.summary["bytes_sent"] == 400 * 2 * 196
    assert_bytes_column(again, 2 * 196)


def test_a_snapshot_checkpoint_restarts_the_counts_and_the_summary_says_where(tmp_path):
    """An async run's periodic checkpoint is a snapshot while its workers
    hold their counts: a run resumed from it counts from its updates on,
    says so, and its per-update figures are over those updates only."""
    opts = dict(seed=0, evals=5, epochs=60, progress=False, backend="threads")
    whole = monsoon.train("exp", "async", 2, out=tmp_path / "a", checkpoint_every=200, **opts)
    meta = _keep_oldest(tmp_path / "a" / "checkpoints")
    assert meta["totals"] == {"from_update": meta["updates"]}
    resumed = monsoon.train("exp", "async", 2, resume=str(tmp_path / "a"), **opts)
    counted = resumed.summary["updates"] - meta["updates"]
    assert resumed.summary["counted_from_update"] == meta["updates"]
    assert resumed.summary["bytes_sent_per_update"] == whole.summary["bytes_sent_per_update"]
    assert resumed.summary["bytes_sent"] == counted * whole.summary["bytes_sent_per_update"]
    assert_bytes_column(resumed, whole.summary["bytes_sent_per_update"])


@pytest.mark.parametrize("engine, problem", [
    pytest.param("ray", "logistic", marks=pytest.mark.ray),
    pytest.param("torch", "exp", marks=pytest.mark.torchrun)])
def test_a_run_that_ends_on_a_periodic_checkpoint_carries_its_whole_counts_on(
        engine, problem, tmp_path, request):
    """200 steps, a checkpoint every 50: the run ends on a step its periodic
    checkpoint already holds, with the counts it carried in only. Ray's
    driver and torch's rank 0 write it again once the workers' reports are
    in (reason "final"), so a run extended from it to 300 steps counts the
    staleness and traffic of all 300, as one 300-step run does."""
    if engine == "ray":
        pytest.importorskip("ray")
        request.getfixturevalue("local_ray")
    else:
        pytest.importorskip("torch")
    opts = dict(engine=engine, dtype="float64", seed=0, evals=0, progress=False, timeout=60)
    whole = monsoon.train(problem, "sync", 2, steps=300, **opts)
    monsoon.train(problem, "sync", 2, steps=200, out=tmp_path / "a", checkpoint_every=50, **opts)
    newest = checkpoints.checkpoint_files(tmp_path / "a" / "checkpoints")[0]
    assert checkpoints.read(newest).meta["updates"] == 200
    assert checkpoints.read(newest).meta["reason"] == "final"  # not "periodic": the run ended
    extended = monsoon.train(problem, "sync", 2, steps=300, resume=str(tmp_path / "a"), **opts)
    for key in ("bytes_sent", "staleness_counts", "updates"):
        assert extended.summary[key] == whole.summary[key], key


@pytest.mark.ray
def test_a_ray_run_resumed_from_a_periodic_checkpoint_counts_the_whole_run(tmp_path, request):
    """Sync on Ray, every fifth step dropped (worker 1's NaN), a checkpoint
    every 20 steps: a run resumed from a periodic one (a crashed run's
    newest, at step v) ends bit-identical, and its summary.json counts the
    whole run's updates, examples and dropped updates, which the shards'
    copies hold at v. The counts the workers keep until they report
    (staleness, traffic) restart at v, as ``engines/tally.py`` says: the
    first attempt's before it are not in the checkpoint."""
    import json

    from faulty import FaultyProblem
    from monsoon.problems import make_problem

    pytest.importorskip("ray")
    request.getfixturevalue("local_ray")

    def problem():
        return FaultyProblem(make_problem("logistic", dtype="float64"), "nan", rank=1, after=0,
                             every=5)

    opts = dict(engine="ray", dtype="float64", seed=0, evals=0, progress=False, timeout=60,
                shards=2, steps=100, batch_size=64)
    run = monsoon.train(problem(), "sync", 2, out=tmp_path / "a", checkpoint_every=20, **opts)
    whole = run.summary
    meta = _keep_oldest(tmp_path / "a" / "checkpoints")
    v = meta["step"]
    assert meta["reason"] == "periodic" and 0 < v < 100
    resumed = monsoon.train(problem(), "sync", 2, resume=str(tmp_path / "a"),
                            out=tmp_path / "b", **opts)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["dropped_updates"] == whole["dropped_updates"] == 20
    for key in ("updates", "examples", "dropped_updates"):
        assert summary[key] == whole[key], key
    assert np.array_equal(resumed.params, run.params)
    left = 100 - v  # the steps after the checkpoint, of 100
    # one count an update applied since v (a dropped step has none; the
    # checkpoint's steps count the dropped ones too)
    applied_at_v = v - meta["dropped"]
    assert sum(summary["staleness_counts"].values()) == summary["updates"] - applied_at_v > 0
    assert summary["bytes_sent"] * 100 == whole["bytes_sent"] * left

"""sync on Spark in one barrier stage (``engines/spark/barrier.py``): the
ranks all-reduce among themselves, the run is one job, it equals serial,
the driver writes its checkpoints, and a stalled rank fails it within
``--timeout``."""
import time

import numpy as np
import pytest

import monsoon
from monsoon.errors import MonsoonError
from monsoon.problems.linear import DenseLinear, synthetic
from spark_env import count_jobs, spark_session

pytestmark = [pytest.mark.spark]

KW = dict(lr=0.5, epochs=1, batch_size=64, seed=0, dtype="float64")


@pytest.fixture(scope="module")
def spark():
    with spark_session("local[2]") as session:
        yield session


@pytest.fixture
def jobs(spark, monkeypatch):
    return count_jobs(spark, monkeypatch)


def test_sync_is_one_barrier_job_and_equals_serial(spark, jobs):
    serial = monsoon.train("digits", strategy="serial", evals=0, **KW)
    sync = monsoon.train("digits", strategy="sync", workers=2, engine="spark", evals=5, **KW)
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)
    s = sync.summary
    assert s["spark_sync"] == "one barrier stage" and s["barrier_attempts"] == 1
    # the stage's launch (tasks, gloo group) is start-up, outside the run's clock
    assert s["startup_s"] >= s["barrier_launch_s"] > 0
    assert s["barrier_launch_s"] + s["wall_time_s"] <= s["barrier_stage_s"]
    # the share of the one job that was not training: launch, gloo group, teardown
    assert s["spark_jobs"] == 1
    assert s["spark_job_share"] == pytest.approx(
        1 - s["wall_time_s"] / s["barrier_stage_s"], abs=0.02)
    steps = serial.summary["updates"]
    assert s["updates"] == steps > 20
    assert jobs["jobs"] == 2  # the data's load, then the training: one job

    # the recorder followed the stage: rows at 0, in between, and the end
    assert len(sync.history) >= 3 and sync.history[-1]["updates"] == steps
    assert sync.history[-1]["loss"] == pytest.approx(serial.summary["final_loss"], rel=1e-9)


def test_the_executors_preflight_waits_at_least_the_default_timeout(spark, monkeypatch):
    """Starting the executors' Python is start-up, not a step: a run with a
    short --timeout still gives the preflight the default wait."""
    from monsoon.engines.options import TIMEOUT
    from monsoon.engines.spark import preflight

    waits, real = [], preflight.check_executors

    def check(sc, timeout, **kw):
        waits.append(timeout)
        return real(sc, timeout, **kw)

    monkeypatch.setattr(preflight, "check_executors", check)
    monsoon.train("digits", strategy="sync", workers=2, engine="spark", evals=0, timeout=4,
                  **KW)
    assert waits == [TIMEOUT.default]


def test_more_workers_than_slots_run_sync_on_the_driver(spark):
    # on the driver each step is one Spark job: 6 steps, not an epoch's 22
    kw = dict(KW, epochs=None, steps=6)
    serial = monsoon.train("digits", strategy="serial", evals=0, **kw)
    sync = monsoon.train("digits", strategy="sync", workers=3, engine="spark", evals=0, **kw)
    assert "spark_sync" not in sync.summary  # a barrier stage needs a slot per partition
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("workers", [2, 3])  # the barrier stage; on the driver
def test_a_rows_examples_are_those_of_the_steps_it_holds(spark, workers):
    """A row paired the parameters after k steps with the examples of k + 1
    (counted when the gradients were computed, before the step): ``train
    --engine spark --problem logistic --strategy sync --workers 2 --steps 6
    --batch-size 16384`` had rows (1 update, 32768 examples, epoch 2.0),
    then (5, 98304, epoch 6.0). Now a step's examples count when it is
    applied. Enough steps that the stage's rows, asked by the clock every
    10 ms, fall between steps on a loaded machine too; on the driver (a
    Spark job a step) each of 20 steps has its row."""
    steps = 80 if workers == 2 else 20  # within digits' first epoch
    kw = dict(KW, epochs=None, steps=steps, batch_size=16)
    sync = monsoon.train("digits", strategy="sync", workers=workers, engine="spark",
                         evals=steps, **kw)
    assert ("spark_sync" in sync.summary) == (workers == 2)
    assert len([row for row in sync.history if 0 < row["updates"] < steps]) >= 2, sync.history
    for row in sync.history:
        assert row["examples"] == row["updates"] * kw["batch_size"], row
    assert sync.summary["examples"] == steps * kw["batch_size"]


def test_each_rank_counts_the_bytes_of_its_all_reduces(spark):
    """A step's all-reduce takes each rank's gradient sum in and gives the
    ranks' sum back (torchrun counts its all-reduce so): per rank and step,
    the parameters' size sent and received. The summary had no byte fields
    and metrics.csv no bytes_sent column."""
    kw = dict(KW, epochs=None, steps=6)
    sync = monsoon.train("digits", strategy="sync", workers=2, engine="spark", evals=6, **kw)
    s = sync.summary
    assert s["spark_sync"] == "one barrier stage" and s["updates"] == 6
    grad = sync.params.size * 8  # float64
    assert s["bytes_sent_per_worker"] == s["bytes_received_per_worker"] == [6 * grad] * 2
    assert s["bytes_sent"] == s["bytes_sent_uncompressed"] == 12 * grad
    assert s["bytes_sent_per_update"] == 2 * grad
    assert sync.history[-1]["updates"] == 6  # rows come as rank 0 asks: at least 0 and 6
    assert [row["bytes_sent"] for row in sync.history] == \
        [2 * grad * row["updates"] for row in sync.history]


def test_the_driver_writes_the_stages_checkpoints_and_resume_is_exact(spark, tmp_path):
    kw = dict(strategy="sync", workers=2, engine="spark", evals=0, **KW)
    whole = monsoon.train("digits", **kw)
    first = monsoon.train("digits", checkpoint_every=10, out=tmp_path / "a", **kw)
    assert first.summary["spark_sync"] == "one barrier stage"
    files = sorted(p.name for p in (tmp_path / "a" / "checkpoints").glob("ckpt-*.npz"))
    assert files[:2] == ["ckpt-000000000010.npz", "ckpt-000000000020.npz"], files
    np.testing.assert_array_equal(first.params, whole.params)
    # resume from step 20 of a run cut there: the stage starts from it on every rank
    for name in files[2:]:
        (tmp_path / "a" / "checkpoints" / name).unlink()
    resumed = monsoon.train("digits", resume=str(tmp_path / "a"), out=tmp_path / "b", **kw)
    assert resumed.summary["spark_sync"] == "one barrier stage"
    np.testing.assert_array_equal(resumed.params, whole.params)
    assert resumed.summary["updates"] == whole.summary["updates"]
    # its checkpoints hold no traffic: the bytes are the updates' after step 20
    assert resumed.summary["counted_from_update"] == 20
    assert resumed.summary["bytes_sent_per_update"] == whole.summary["bytes_sent_per_update"]
    assert resumed.summary["bytes_sent"] == whole.summary["bytes_sent_per_update"] * (
        whole.summary["updates"] - 20)


def test_lbfgs_in_the_stage_equals_serial_and_resumes_exactly(spark, tmp_path):
    """The full-batch rule in the barrier stage: every rank applies it to
    the same all-reduced gradient and loss, so the run is serial's; its
    memory (the correction pairs) travels in the checkpoint."""
    kw = dict(rule="lbfgs", epochs=30, seed=0, dtype="float64", evals=0)
    serial = monsoon.train("digits", strategy="serial", **kw)
    sync = dict(strategy="sync", workers=2, engine="spark", **kw)
    whole = monsoon.train("digits", **sync)
    assert whole.summary["spark_sync"] == "one barrier stage"
    assert whole.summary["updates"] == 30
    # L-BFGS's line search and pairs amplify the reduction order's rounding
    np.testing.assert_allclose(whole.params, serial.params, rtol=1e-6, atol=1e-9)
    first = monsoon.train("digits", checkpoint_every=10, out=tmp_path / "a", **sync)
    np.testing.assert_array_equal(first.params, whole.params)
    for name in sorted(p.name for p in (tmp_path / "a" / "checkpoints").glob("ckpt-*"))[2:]:
        (tmp_path / "a" / "checkpoints" / name).unlink()
    resumed = monsoon.train("digits", resume=str(tmp_path / "a"), out=tmp_path / "b", **sync)
    np.testing.assert_array_equal(resumed.params, whole.params)


class StallsOnce(DenseLinear):
    """Partition 1 stalls in its 5th gradient (a hung executor)."""

    def gradient(self, w, indices, out=None, accumulate=False):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 1:
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == 5:
                time.sleep(60)
        return super().gradient(w, indices, out, accumulate)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_stalled_rank_fails_the_run_within_timeout(spark):
    problem = synthetic("logistic", n=2000, features=10, dtype="float64")
    problem.__class__ = StallsOnce
    began = time.monotonic()
    with pytest.raises(MonsoonError) as err:
        monsoon.train(problem, strategy="sync", workers=2, engine="spark", lr=0.5, steps=50,
                      batch_size=64, evals=0, timeout=8)
    assert time.monotonic() - began < 8 + 40
    assert "\n" not in str(err.value).strip()
    assert "waited 8 s" in str(err.value) or "sync stage failed" in str(err.value)


def test_a_message_split_by_a_slow_link_arrives_whole():
    """The driver's idle wait is a short socket timeout; a message whose
    bytes stall mid-way past it is still read whole (not split, which
    would leave the stream out of step)."""
    import socket
    import threading

    from monsoon.engines.spark.barrier import receive, send

    a, b = socket.socketpair()
    b.settimeout(0.05)
    with pytest.raises(socket.timeout):
        receive(b)  # nothing sent: the idle wait's timeout
    w = np.arange(100_000, dtype=np.float64)

    class Recording:  # what send writes, kept
        def sendall(self, data):
            self.data = data

    out = Recording()
    send(out, ("record", 1.5, 3, 64, w, 0))

    def slowly():
        a.sendall(out.data[:1000])
        time.sleep(0.3)  # six of the reader's timeouts
        a.sendall(out.data[1000:])

    threading.Thread(target=slowly).start()
    kind, now, updates, examples, got, dropped = receive(b, patience=10)
    assert (kind, now, updates, examples, dropped) == ("record", 1.5, 3, 64, 0)
    np.testing.assert_array_equal(got, w)
    a.close()
    b.close()

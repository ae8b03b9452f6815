"""The local engine's two synchronous steps (engines/local/synchronous.py):
replicated (small models, one barrier) and sharded (three barriers) compute
the same update; replicas that drift apart fail the run."""
import csv
import json
import os
import signal
import threading
import time

import numpy as np
import pytest

import monsoon
from monsoon.server import shards
from monsoon.engines.local import synchronous
from monsoon.errors import WorkerError
from monsoon.problems import make_problem
from monsoon.rules.sgd import SGD

from faulty import FaultyProblem


@pytest.fixture(params=["replicated", "sharded"])
def sync_step(request, monkeypatch):
    if request.param == "sharded":  # every model counts as large
        monkeypatch.setattr(shards, "REPLICATE_MAX_BYTES", 0)
    return request.param


@pytest.mark.parametrize("rule", ["sgd", "momentum", "adam"])
def test_both_steps_equal_serial(sync_step, rule):
    opts = dict(steps=15, batch_size=256, dtype="float64", seed=2, lr=0.05, rule=rule)
    serial = monsoon.train("exp", "serial", **opts)
    sync = monsoon.train("exp", "sync", 3, **opts)
    assert sync.summary["sync_step"] == sync_step
    assert sync.summary["updates"] == 15
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype,workers,batch", [("float64", 2, 64), ("float32", 3, 63),
                                                ("float32", 3, 64)])
def test_replicated_step_matches_the_simulator_bit_for_bit(dtype, workers, batch):
    # float32 with 3 workers: the mean's scale, 1/3, must round as float32
    # (a batch of 64 splits 21/21/22: the unequal-weight path)
    opts = dict(steps=20, batch_size=batch, dtype=dtype, seed=4, lr=0.05, rule="momentum")
    local = monsoon.train("exp", "sync", workers, **opts)
    sim = monsoon.train("exp", "sync", workers, engine="sim", **opts)
    assert local.summary["sync_step"] == "replicated"
    assert np.array_equal(local.params, sim.params)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("parts", [1, 2, 3, 5])
def test_compiled_mean_has_the_bits_of_weighted_mean(dtype, parts):
    from monsoon.server.kernels import equal_mean_finite_for
    from monsoon.server.reduce import WeightedMean, finite

    kernel = equal_mean_finite_for(dtype)
    rng = np.random.default_rng(parts)
    for n in (1, 7, 49, 1000):
        # magnitudes up to 1e40 overflow float32 to inf on purpose
        slots = (rng.standard_normal((parts, n)) * 10.0 ** rng.uniform(-40, 40, (parts, n)))
        with np.errstate(over="ignore"):
            slots = slots.astype(dtype)
        if n == 7:
            slots[-1, 3] = np.nan
        out, ref = np.empty(n, dtype), np.empty(n, dtype)
        ok = kernel(slots, np.full(parts, 8), out, np.dtype(dtype).type(1 / parts))
        expected = WeightedMean(list(slots), ref, np.empty(n, dtype))([8] * parts)
        assert ok == int(finite(expected))
        assert out.tobytes() == expected.tobytes()
    untouched = np.full(3, 7, dtype)
    # unequal or zero examples: nothing written, the caller falls back
    assert kernel(slots[:, :3], np.arange(1, parts + 1) if parts > 1 else np.zeros(1),
                  untouched, np.dtype(dtype).type(1)) == -1
    assert (untouched == 7).all()
    assert equal_mean_finite_for(np.float16)(slots, np.full(parts, 8), out, 1.0) == -1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_both_steps_match_the_simulator_bit_for_bit_with_two_workers(sync_step, dtype):
    """Two workers, equal halves: the sharded step's compiled pass per shard
    and the replicated step's mean give the simulator's bits."""
    opts = dict(steps=20, batch_size=64, dtype=dtype, seed=4, lr=0.05, rule="momentum")
    local = monsoon.train("exp", "sync", 2, **opts)
    sim = monsoon.train("exp", "sync", 2, engine="sim", **opts)
    assert local.summary["sync_step"] == sync_step
    assert np.array_equal(local.params, sim.params)


def test_large_models_and_backup_workers_use_the_sharded_step():
    big = monsoon.train("quadratic", "sync", 2, steps=3, evals=0)
    assert big.summary["sync_step"] == "sharded"
    backup = monsoon.train("exp", "sync", 3, backup_workers=1, steps=5, evals=0)
    assert backup.summary["sync_step"] == "sharded"


def test_nan_gradient_is_dropped_by_both_steps(sync_step):
    problem = FaultyProblem(make_problem("exp"), "nan", rank=1, after=3, every=5)
    run = monsoon.train(problem, "sync", 2, epochs=3, batch_size=16, seed=0)
    assert run.summary["sync_step"] == sync_step
    assert run.summary["dropped_updates"] > 0
    assert run.summary["updates"] + run.summary["dropped_updates"] == 3 * 256 // 16
    assert np.isfinite(run.params).all()


def test_a_failing_worker_fails_both_steps_fast(sync_step):
    problem = FaultyProblem(make_problem("exp"), "raise", rank=1, after=5)
    with pytest.raises(WorkerError, match="injected failure on worker 1"):
        monsoon.train(problem, "sync", 2, epochs=50, timeout=20)


def test_replicated_step_publishes_once_when_nothing_is_recorded():
    """With no loss curve (evals=0) worker 0 publishes its replica only at
    the end: the result is still the last step's, equal to serial's."""
    opts = dict(steps=15, batch_size=32, dtype="float64", seed=2, lr=0.05, evals=0)
    serial = monsoon.train("exp", "serial", **opts)
    sync = monsoon.train("exp", "sync", 2, **opts)
    assert sync.summary["sync_step"] == "replicated"
    assert not np.array_equal(sync.params, make_problem("exp").initial_params(2))
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("evals", [0, 100])
def test_replicas_that_drift_apart_fail_the_run(monkeypatch, evals):
    """A rule whose result depends on the worker breaks replication: the
    run must say so, not return worker 0's replica as if all agreed."""
    plain = SGD.apply

    def worker_dependent(self, w, g, state, info):
        plain(self, w, g, state, info)
        if info.worker == 1:
            w[0] += 1e-6

    monkeypatch.setattr(SGD, "apply", worker_dependent)
    with pytest.raises(WorkerError, match="replica of the parameters differs"):
        monsoon.train("exp", "sync", 2, steps=5, evals=evals, backend="threads", timeout=20)


def test_loss_curve_snapshots_take_a_bounded_share_of_worker_0s_time(monkeypatch):
    """Worker 0 of a replicated run copies its replica for the loss curve
    only when the last copy took at most SNAP_SHARE of the time since: with
    a share no copy can meet, one snapshot is taken instead of ~100, and
    the run still ends with its final row."""
    opts = dict(steps=400, batch_size=16, seed=0, lr=0.01, backend="threads", progress=False)
    full = monsoon.train("exp", "sync", 2, **opts)
    assert full.summary["sync_step"] == "replicated" and len(full.history) >= 50
    monkeypatch.setattr(synchronous, "SNAP_SHARE", 1e-12)
    bounded = monsoon.train("exp", "sync", 2, **opts)
    assert 2 <= len(bounded.history) <= 4
    assert bounded.history[-1]["updates"] == 400
    np.testing.assert_array_equal(bounded.params, full.params)


def test_a_dropped_step_is_told_to_the_rule_by_every_step(sync_step, monkeypatch):
    """A rule hears of each dropped step (``Rule.on_dropped``: L-BFGS backs
    off its trial point), on the replicated and the sharded step and on the
    sim alike: the rule's state must not depend on the engine's layout."""
    from monsoon.rules.sgd import SGD

    told = []
    monkeypatch.setattr(SGD, "on_dropped", lambda self, w, state: told.append(w.size))
    opts = dict(epochs=2, batch_size=16, seed=0, evals=0)
    # the sim computes every gradient on the one problem, whose rank is 0
    for engine, extra, rank in (("local", {"backend": "threads"}, 1), ("sim", {}, 0)):
        told.clear()
        problem = FaultyProblem(make_problem("exp"), "nan", rank=rank, after=3, every=5)
        run = monsoon.train(problem, "sync", 2, engine=engine, **opts, **extra)
        dropped = run.summary["dropped_updates"]
        assert dropped > 0, engine
        # each dropped step told once over the whole vector (shard by shard,
        # or at once), by each of the local engine's replicas where it has them
        copies = 2 if engine == "local" and sync_step == "replicated" else 1
        assert sum(told) == copies * dropped * problem.n_params, (engine, told)


def test_with_backup_workers_no_worker_joins_the_step_the_run_stops_at():
    """Backup workers: the first N arrivals count. Once a worker has stopped
    at a step boundary (``STOP_AT``), a worker arriving at that step must
    not count: the other counted one may have left already, and it would
    wait for its sums until the timeout, then end aborted, with no final
    checkpoint. It stops there too, and leaves the step's counts alone."""
    from types import SimpleNamespace

    from monsoon.engines.local.store import ARRIVED, STEP, STOP, STOP_AT, ParameterStore

    store = ParameterStore(np.zeros(8), SGD(0.1), 3, 1, sync_slots=True, backend="threads")
    try:
        runtime = SimpleNamespace(store=store, rank=2, workers=3, start_step=5,
                                  checkpoint_every=0, timeout=1.0, _spin=False, _hot_turns=0,
                                  strategy=SimpleNamespace(backup_workers=1))
        step = synchronous.ShardedStep(runtime)
        store.sync[STEP] = 5
        store.sync[ARRIVED], store.contributors[0] = 1, 0  # worker 0 arrived, then left
        store.control[STOP] = 1
        store.control[STOP_AT] = 5  # worker 1 stopped at step 5
        with pytest.raises(synchronous.Stopped):
            step.contribute(16)
        assert store.sync[ARRIVED] == 1 and step.step == 5
    finally:
        store.close()


def test_a_worker_stopped_before_its_step_hands_over_its_sender_from_before_that_step():
    """Compressed sync: a worker encodes its message of a step before it
    arrives there (``compressing``). One that leaves the arrival wait
    because another stopped at that step's boundary (``STOP_AT``) holds the
    message of a step no one applies: the state it hands over for the final
    checkpoint (error-feedback residual, random stream) is the one from
    before that message, which the resumed run sends again."""
    from types import SimpleNamespace

    from monsoon.compressors.messages import Compression, Sender
    from monsoon.engines.local import checkpointing
    from monsoon.engines.local.store import STOP, STOP_AT, ParameterStore

    n, compression = 8, Compression("randk", 0.5)
    store = ParameterStore(np.zeros(n), SGD(0.1), 2, 1, sync_slots=True, backend="threads",
                           extra_layout=checkpointing.sender_slots(compression, n, "float64", 2))
    try:
        sender = Sender(compression, 1)
        sender.keep_previous = checkpointing.hands_over_senders(store)
        runtime = SimpleNamespace(store=store, rank=1, workers=2, start_step=5,
                                  checkpoint_every=0, timeout=1.0, _spin=False, _hot_turns=0,
                                  sender=sender, strategy=SimpleNamespace(backup_workers=0),
                                  undo_step=lambda: None)
        step = synchronous.ShardedStep(runtime)
        rng = np.random.default_rng(0)
        sender.send(rng.standard_normal(n))  # step 4's message, applied
        at_boundary = sender.state(n, np.float64)
        sender.send(rng.standard_normal(n))  # step 5's
        assert not np.array_equal(sender.state(n, np.float64)["residual"],
                                  at_boundary["residual"])
        store.control[STOP] = 1
        store.control[STOP_AT] = 5  # worker 0 stopped at step 5's boundary
        with pytest.raises(synchronous.Stopped):
            step.contribute(4)
        step.on_stop()
        arrays = store.memory.arrays
        assert arrays[checkpointing.TAG][checkpointing.STOP_ROW, 1] == 5
        for name, value in at_boundary.items():
            assert np.array_equal(arrays["ckpt.sender." + name][checkpointing.STOP_ROW, 1],
                                  value), name
    finally:
        store.close()


def _backup_step(store, rank=2, sender=None):
    """Worker ``rank``'s sharded step of a run with one backup worker."""
    from types import SimpleNamespace

    runtime = SimpleNamespace(store=store, rank=rank, workers=3, start_step=5,
                              checkpoint_every=0, timeout=5.0, _spin=False, _hot_turns=0,
                              counters=store.counters[rank], sender=sender,
                              strategy=SimpleNamespace(backup_workers=1))
    return synchronous.ShardedStep(runtime)


def test_a_worker_late_to_an_open_step_joins_the_next_whatever_its_wake_up():
    """Backup workers, as the sim's: a worker that arrives while its step is
    still open (the N counted ones are summing it) is late, and joins the
    step after it, even where the others have completed that one too by
    the time it wakes: it would otherwise skip a batch it was never slow
    for (on steps of microseconds, often the run's last)."""
    import threading

    from monsoon.engines.local.store import ARRIVED, LATE, STEP, ParameterStore

    store = ParameterStore(np.zeros(8), SGD(0.1), 3, 1, sync_slots=True, backend="threads")
    try:
        step = _backup_step(store)
        store.sync[STEP] = 5
        store.sync[ARRIVED], store.contributors[:2] = 2, (0, 1)  # the counted two, summing
        # they apply step 5, then do step 6 too, before worker 2 wakes
        timer = threading.Timer(0.05, lambda: store.sync.__setitem__(STEP, 7))
        timer.start()
        assert step.contribute(5) == 0  # no step skipped
        assert step.step == 6 and store.counters[2, LATE] == 1
        # late again at step 6, which was applied before it arrived: it skips to the current one
        store.sync[ARRIVED] = 0
        assert step.contribute(5) == 0 and step.step == 7
        store.sync[STEP] = 9
        step.step = 7
        assert step.contribute(5) == 1 and step.step == 9  # step 8 done without it: skipped
        assert store.counters[2, LATE] == 3
    finally:
        timer.cancel()
        timer.join()
        store.close()


def test_a_late_worker_takes_its_dropped_message_back_from_its_sender():
    """Compressed sync with a backup worker: the step is full when worker 2
    arrives, so its message is dropped; its sender's residual and random
    stream go back to before that message (error feedback keeps nothing of
    a message no one applied), not on to what applying it would leave."""
    import threading

    from monsoon.compressors.messages import Compression, Sender
    from monsoon.engines.local.store import ARRIVED, LATE, STEP, ParameterStore

    n = 8
    store = ParameterStore(np.zeros(n), SGD(0.1), 3, 1, sync_slots=True, backend="threads")
    sender = Sender(Compression("randk", 0.5), 2)
    sender.keep_previous = True  # as the local engine sets it with backup workers
    rng = np.random.default_rng(0)
    sender.send(rng.standard_normal(n))  # step 4's message, applied
    before = sender.state(n, np.float64)
    sender.send(rng.standard_normal(n))  # step 5's, late
    timer = threading.Timer(0.05, lambda: store.sync.__setitem__(STEP, 6))
    try:
        step = _backup_step(store, sender=sender)
        store.sync[STEP] = 5
        store.sync[ARRIVED], store.contributors[:2] = 2, (0, 1)  # the counted two
        timer.start()
        assert step.contribute(4) == 0 and store.counters[2, LATE] == 1
        after = sender.state(n, np.float64)
        for name, value in before.items():
            assert np.array_equal(after[name], value), name
        assert sender.messages == 2  # its bytes stay counted
    finally:
        timer.cancel()
        timer.join()
        store.close()


def test_backup_workers_start_the_first_step_together():
    """With backup workers the first N arrivals count: a worker waits until
    every other has left the start signal's wait before its first op, so
    that the first to wake do not run the steps of a short run on their own."""
    import threading
    import time

    from monsoon.engines.local.store import READY, RUNNING, ParameterStore

    store = ParameterStore(np.zeros(8), SGD(0.1), 3, 1, sync_slots=True, backend="threads")
    try:
        step = _backup_step(store, rank=0)
        store.status[:] = (RUNNING, READY, RUNNING)  # worker 1 has not woken yet
        timer = threading.Timer(0.1, lambda: store.status.__setitem__(1, RUNNING))
        timer.start()
        t0 = time.monotonic()
        step.begin()
        assert time.monotonic() - t0 >= 0.09
        store.status[:] = (RUNNING, READY, RUNNING)  # bounded: a worker that never wakes
        step.rt.timeout = 0.2
        with pytest.raises(Exception, match="every worker to start"):
            step.begin()
    finally:
        timer.cancel()
        timer.join()
        store.close()


def test_curve_rows_count_the_examples_of_the_steps_applied(monkeypatch):
    """Worker 0 copies a step's parameters into the snapshot ring after the
    other worker may have counted its next batch: the row's examples are
    still those of the steps applied, updates x batch."""
    snapshot = synchronous.ReplicatedStep._snapshot

    def late(self, *args, **kwargs):
        time.sleep(0.005)  # the other worker counts its next batch meanwhile
        return snapshot(self, *args, **kwargs)

    monkeypatch.setattr(synchronous.ReplicatedStep, "_snapshot", late)
    run = monsoon.train("logistic", "sync", 2, steps=200, batch_size=16, seed=0, evals=20,
                        backend="threads", progress=False)
    assert run.summary["sync_step"] == "replicated" and len(run.history) > 10
    assert [row["examples"] for row in run.history] == \
        [16 * row["updates"] for row in run.history]


def test_curve_rows_count_unequal_parts_and_an_epochs_short_batch():
    """Batch 15 splits 7 + 8 between two workers (the weighted mean, not
    the compiled equal one), and each epoch ends on a shorter batch: worker
    0's rows still count the examples of the steps applied, every worker's
    part of each."""
    n = make_problem("logistic").n_examples
    full, tail = divmod(n, 15)
    sizes = ([15] * full + [tail] * bool(tail)) * 3  # three epochs of batches
    run = monsoon.train("logistic", "sync", 2, steps=len(sizes), batch_size=15, seed=0,
                        evals=20, backend="processes", progress=False)
    assert run.summary["sync_step"] == "replicated" and len(run.history) > 10
    assert [row["examples"] for row in run.history] == \
        [sum(sizes[:row["updates"]]) for row in run.history]
    assert run.summary["examples"] == sum(sizes)


def test_a_long_runs_curve_has_a_row_every_half_second_from_the_start(monkeypatch, tmp_path):
    """Worker 0's ring rows come every 1/evals of the budget in steps; a
    row the clock makes due (max(0.5 s, 1/evals of the time so far)) is
    asked of it too: a run of two million steps stopped 3 s after its
    workers start has rows every half second, not only its first and last."""
    from monsoon.engines.local.monitor import WorkerMonitor
    from monsoon.errors import Interrupted

    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    release = WorkerMonitor.release

    def release_then_time(self):
        release(self)
        timer.start()

    monkeypatch.setattr(WorkerMonitor, "release", release_then_time)
    try:
        with pytest.raises(Interrupted):
            monsoon.train("logistic", "sync", 2, steps=2_000_000, batch_size=16, seed=0,
                          progress=False, out=str(tmp_path / "run"))
    finally:
        timer.cancel()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["sync_step"] == "replicated" and summary["updates"] > 0
    with open(tmp_path / "run" / "metrics.csv") as f:
        times = [float(row["time_s"]) for row in csv.DictReader(f)]
    assert len(times) >= 4 and max(np.diff(times[:-1])) < 1.5, times

"""The loss curve is recorded from snapshots and evaluated after the run."""
import time

import numpy as np
import pytest

import monsoon
from monsoon.engines.local.monitor import WorkerMonitor
from monsoon.problems import make_problem
from monsoon.record import Recorder


def counting(problem):
    """Make a real problem's ``loss`` note whether the run was over when it ran."""
    inner = problem.loss
    problem.during_run = problem.after_run = 0
    problem.run_over = False

    def loss(w):
        if problem.run_over:
            problem.after_run += 1
        else:
            problem.during_run += 1
        return inner(w)

    problem.loss = loss
    return problem


@pytest.mark.parametrize("strategy,workers,backend", [
    ("serial", 1, "processes"), ("sync", 2, "threads"), ("async", 2, "threads"),
    ("hogwild", 2, "threads")])
def test_no_evaluation_happens_while_the_run_goes(monkeypatch, strategy, workers, backend):
    problem = counting(make_problem("linear"))
    settle = Recorder.settled_rows  # the first evaluation after the run

    def settle_marking(self, *args, **kwargs):
        problem.run_over = True
        return settle(self, *args, **kwargs)

    monkeypatch.setattr(Recorder, "settled_rows", settle_marking)
    # compiled Hogwild! threads finish an epoch of this problem in ~20 ms, less
    # than the monitor's first few polls on a loaded machine (5 epochs once gave
    # too few rows at load 8): give it 20; async threads once recorded 3 rows of
    # an epoch while other tests ran beside it, and 4 of 5 epochs (0.19 s) in a
    # CI run: 15
    epochs = {"hogwild": 20, "async": 15}.get(strategy, 1)
    result = monsoon.train(problem, strategy, workers, epochs=epochs, backend=backend, seed=0,
                           progress=False, evals=20)
    assert problem.during_run == 0
    assert problem.after_run == len(result.history) >= 5
    losses = [row["loss"] for row in result.history]
    assert losses[-1] < losses[0] / 10
    assert result.summary["final_loss"] == losses[-1]
    assert all(a["examples"] <= b["examples"] for a, b in zip(result.history, result.history[1:]))


@pytest.mark.parametrize("strategy", ["async", "hogwild"])
def test_a_row_taken_after_a_slow_checkpoint_has_the_counts_of_its_parameters(
        monkeypatch, tmp_path, strategy):
    """The monitor copies the live parameters for a row; a checkpoint
    written in the same wake (made slow here) must not leave the row with
    the time and counts read before it: a hogwild row once held the final
    parameters labelled 8 epochs early."""
    ends, rows = [], []  # each checkpoint's end (time, examples); each row's
    snapshot, record = WorkerMonitor.snapshot, Recorder.record

    def slow(self, *args, **kwargs):  # the workers go on meanwhile
        snapshot(self, *args, **kwargs)
        time.sleep(0.1)
        # a row's examples: async's, those its parameters hold (``store.landed``,
        # which the workers' counters can be a push ahead of); hogwild's, the counters
        done = self.store.landed[0] if strategy == "async" else self.store.totals()[0]
        ends.append((time.perf_counter() - self.t0, int(done)))

    def noting(self, now, updates, examples, *args, **kwargs):
        rows.append((len(ends), now, examples))
        return record(self, now, updates, examples, *args, **kwargs)

    monkeypatch.setattr(WorkerMonitor, "snapshot", slow)
    monkeypatch.setattr(Recorder, "record", noting)
    monkeypatch.setattr(Recorder, "due", lambda self, now, examples: True)  # a row every wake
    monsoon.train("linear", strategy, 2, epochs=8, backend="threads", seed=0, progress=False,
                  out=str(tmp_path / "run"), checkpoint_every=100)
    after = [(ends[k - 1], now, ex) for k, now, ex in rows if k]
    assert after and ends[0][1] < 8 * 16384  # a checkpoint mid-run, and rows after it
    for (end_s, end_ex), now, ex in after:
        assert now >= end_s and ex >= end_ex


@pytest.mark.slow
def test_replicated_sync_serves_snapshots_on_request():
    # long enough that the snapshots' cost spacing (50x a copy) leaves 10 rows under load
    result = monsoon.train("exp", "sync", 2, steps=4000, seed=0, progress=False, evals=50)
    assert result.summary["sync_step"] == "replicated"
    rows = result.history
    assert len(rows) >= 10
    # every snapshot is a real step's parameters: the curve falls, and the
    # final row is the final parameters' loss
    assert rows[-1]["loss"] < rows[0]["loss"] / 5
    assert rows[-1]["loss"] == result.summary["final_loss"]
    assert len({row["updates"] for row in rows}) == len(rows)


def test_snapshot_pool_is_bounded_and_stays_evenly_spread():
    problem = make_problem("linear")
    w = problem.initial_params(0)
    budget = 20 * w.nbytes
    rec = Recorder(problem, total_examples=10_000, evals=1000, max_bytes=budget, progress=False)
    rec.start(w)
    for i in range(1, 10_001):
        if rec.due(i * 1e-3, i):
            rec.record(i * 1e-3, i, i, w + i)
    assert sum(s[3].nbytes for s in rec.snapshots) <= budget + w.nbytes
    kept = [s[2] for s in rec.snapshots]
    assert kept[0] == 0 and len(kept) >= 8
    gaps = np.diff(kept[1:])
    assert gaps.max() <= 2.5 * np.median(gaps)
    rec.finish(10.0, 10_000, 10_000, w)
    assert len(rec.rows) == len(kept) + 1 and not rec.snapshots


def test_a_slow_evaluation_thins_the_curve_evenly_within_its_share(monkeypatch):
    """Each evaluation takes 20 ms and the run took 2 s: with a 10% share
    (0.2 s) the curve keeps about 10 of its 41 snapshots, the first and the
    last among them and evenly spread, and says how many it dropped; on a
    simulated clock every snapshot is evaluated."""

    from monsoon.record import recorder as rec_module

    monkeypatch.setattr(rec_module, "EVAL_MIN_S", 0.0)
    problem = make_problem("linear")
    w = problem.initial_params(0)
    slow = problem.loss
    monkeypatch.setattr(problem, "loss", lambda v: (time.sleep(0.02), slow(v))[1])
    for cost_aware in (True, False):
        rec = Recorder(problem, total_examples=None, evals=100, progress=False,
                       cost_aware=cost_aware, eval_share=0.1)
        rec.snapshots = [(i * 0.05, i, i, w + i) for i in range(41)]  # 0 .. 2 s
        began = time.perf_counter()
        rows = rec.settled_rows()
        kept = [r["updates"] for r in rows]
        if not cost_aware:
            assert kept == list(range(41)) and rec.rows_dropped == 0
            continue
        assert time.perf_counter() - began < 0.2 + 0.1  # the share, and one evaluation over
        assert 4 <= len(kept) <= 11 and kept[0] == 0 and kept[-1] == 40
        assert rec.rows_dropped == 41 - len(kept)
        gaps = np.diff(kept)
        assert gaps.max() <= 3 * gaps.min()


def test_an_evaluation_that_gets_faster_still_thins_the_curve_evenly(monkeypatch):
    """The first three evaluations take 30 ms and the rest 3 ms (a busy
    machine that quiets down, or caches that warm): the time left then
    covers part of a level. Those points are spread over that level, and
    no finer level's point is added beside its gaps (gaps of 2 and 10
    updates on one curve, in a full run; of 1 and 5 here). Their cost is
    read off a clock only they advance, so a busy machine's own slowness
    does not change which points are kept."""
    import types

    from monsoon.record import recorder as rec_module

    monkeypatch.setattr(rec_module, "EVAL_MIN_S", 0.0)
    clock = [0.0]
    monkeypatch.setattr(rec_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    problem = make_problem("linear")
    w = problem.initial_params(0)
    slow, calls = problem.loss, []

    def loss(v):
        calls.append(1)
        clock[0] += 0.03 if len(calls) <= 3 else 0.003
        return slow(v)

    monkeypatch.setattr(problem, "loss", loss)
    rec = Recorder(problem, total_examples=None, evals=100, progress=False, cost_aware=True,
                   eval_share=0.1)
    rec.snapshots = [(i * 0.05, i, i, w + i) for i in range(41)]  # 0 .. 2 s: a 0.2 s share
    kept = [r["updates"] for r in rec.settled_rows()]
    assert 5 <= len(kept) < 41 and kept[0] == 0 and kept[-1] == 40, (kept, len(calls))
    gaps = np.diff(kept)
    assert gaps.max() <= 3 * gaps.min(), kept


def test_a_problem_that_evaluates_many_points_at_once_is_budgeted_per_call(monkeypatch):
    """Data in Spark: a level of snapshots is one job of about the same cost
    whatever its size. With 50 ms a call and a 0.36 s share, the curve keeps
    whole levels (6 or 7 calls: 33 rows or more), where a per-point estimate
    thins the later levels (about 26 rows), within the share."""

    from monsoon.record import recorder as rec_module

    monkeypatch.setattr(rec_module, "EVAL_MIN_S", 0.0)
    problem = make_problem("linear")
    w = problem.initial_params(0)
    calls = []

    def evaluate_many(ws):
        calls.append(len(ws))
        time.sleep(0.05)
        return [{"loss": problem.loss(v)} for v in ws]

    problem.evaluate_many = evaluate_many
    rec = Recorder(problem, total_examples=None, evals=100, progress=False,
                   cost_aware=True, eval_share=0.12)
    rec.snapshots = [(i * 0.075, i, i, w + i) for i in range(41)]  # 0 .. 3 s
    began = time.perf_counter()
    kept = [r["updates"] for r in rec.settled_rows()]
    assert time.perf_counter() - began < 0.36 + 0.06   # the share, and one call over
    assert calls[0] == 2 and sum(calls) == len(kept) >= 33
    assert kept[0] == 0 and kept[-1] == 40 and rec.rows_dropped == 41 - len(kept)


@pytest.mark.parametrize("off", [0.0, 1e-3])
def test_losses_a_full_batch_step_computed_are_the_curve_not_evaluated_again(off):
    """A full-batch step's loss is the full-data loss at the parameters the
    snapshot before it holds (``target_met``): the curve takes it, and the
    evaluation after the run costs the ends and the final point. Where the
    ends show the step's loss is another figure (``off``), every snapshot is
    evaluated as before."""
    problem = make_problem("linear")
    w0 = problem.initial_params(0)
    evaluated = []

    def evaluate_many(ws):
        evaluated.extend(ws)
        return [{"loss": problem.loss(v)} for v in ws]

    problem.evaluate_many = evaluate_many
    rec = Recorder(problem, total_examples=None, evals=100, progress=False, cost_aware=False)
    rec.record(0.0, 0, 0, w0)
    for u in range(20):
        w = w0 + 0.01 * u
        if u:
            rec.record(0.1 * u, u, 64 * u, w)
        rec.target_met(problem.loss(w) * (1 + off), u)  # the next step's loss, at w
    final = w0 + 0.2
    rec.finish(2.0, 20, 1280, final)
    want = [problem.loss(w0 + 0.01 * u) for u in range(20)] + [problem.loss(final)]
    np.testing.assert_allclose([r["loss"] for r in rec.rows], want, rtol=1e-12)
    assert [r["updates"] for r in rec.rows] == list(range(21))
    assert len(evaluated) == (2 if off == 0 else 20)  # the ends (the final is evaluate's)


def test_snapshots_are_copies():
    problem = make_problem("linear")
    w = problem.initial_params(0)
    rec = Recorder(problem, total_examples=100, evals=10, progress=False)
    rec.start(w)
    loss0 = problem.loss(w)
    w += 100.0
    rec.finish(1.0, 1, 100, w)
    assert rec.rows[0]["loss"] == loss0 != rec.rows[1]["loss"]


@pytest.mark.parametrize("settled", [False, True], ids=["two-snapshots", "settled-by-a-checkpoint"])
def test_the_final_row_is_the_one_row_at_its_update_count(settled):
    """Snapshots at the final update count (two taken there; or one already
    settled into a row, as an interrupted run's final checkpoint does) give
    way to the final row, with the final parameters."""
    problem = make_problem("linear")
    w = problem.initial_params(0)
    rec = Recorder(problem, total_examples=1000, evals=10, progress=False)
    rec.start(w)
    rec.record(0.5, 50, 500, w + 1.0)
    rec.record(0.9, 100, 1000, w + 2.0)
    if settled:
        rec.settled_rows()
    else:
        rec.record(0.95, 100, 1000, w + 2.0)
    rec.finish(1.0, 100, 1000, w + 3.0)
    assert [r["updates"] for r in rec.rows] == [0, 50, 100]
    assert rec.rows[-1]["time_s"] == 1.0 and rec.rows[-1]["loss"] == problem.loss(w + 3.0)


def test_non_finite_parameters_stop_the_run_as_diverged():
    with pytest.raises(monsoon.TrainingDiverged, match="lower the learning rate"):
        monsoon.train("linear", "sync", 2, epochs=2, lr=1e6, backend="threads", seed=0,
                      progress=False)


def test_snapshots_keep_clear_of_their_own_cost():
    """On a real clock, a snapshot is not due again before 50x its own cost
    has passed, however many rows the budget asks for."""
    problem = make_problem("linear")
    big = np.zeros(4_000_000)  # 32 MB: a copy and a check take ~30 ms
    rec = Recorder(problem, total_examples=100, evals=100, progress=False)
    rec.record(0.0, 0, 0, big)
    assert not rec.due(1e-4, 50)  # 50 rows' worth of examples later, 0.1 ms later
    assert rec.due(10.0, 50)
    virtual = Recorder(problem, total_examples=100, evals=100, progress=False, cost_aware=False)
    virtual.record(0.0, 0, 0, big)
    assert virtual.due(1e-4, 50)  # a simulated clock owes nothing to the copy's real cost


def test_a_snapshot_that_costs_more_than_its_size_says_waits_longer(monkeypatch):
    """The spacing follows what the copy cost the recording thread (first
    touches of fresh memory cost ~10x a copy on some VMs), not only its size."""
    from monsoon.record import recorder

    problem = make_problem("linear")
    small = np.zeros(1000)  # by its size, ~1 us
    clock = iter([5.0, 5.1])  # this thread's CPU clock around the copy: 0.1 s
    monkeypatch.setattr(recorder.time, "thread_time", lambda: next(clock))
    rec = Recorder(problem, total_examples=100, evals=100, progress=False)
    rec.record(0.0, 0, 0, small)
    assert rec._earliest == pytest.approx(recorder.COST_SPACING * 0.1)
    assert not rec.due(4.9, 50) and rec.due(5.0, 50)


def test_thinned_snapshots_lend_their_buffers_to_the_next():
    """When the pool fills, every other snapshot is dropped and its buffer
    takes a later copy (memory already touched), with that copy's values;
    the pool stays bounded, and ``finish`` lets the spares go."""
    problem = make_problem("linear")
    w = np.zeros_like(problem.initial_params(0))
    rec = Recorder(problem, total_examples=10**6, evals=10**6, progress=False,
                   cost_aware=False, max_bytes=5 * w.nbytes)
    for k in range(6):  # the 6th overflows the pool: 0, 2, 4 kept; 1, 3, 5 spare
        rec.record(float(k), k, k, w + k)
    assert [s[1] for s in rec.snapshots] == [0, 2, 4] and len(rec._spares) == 3
    spare_ids = {id(b) for b in rec._spares}
    rec.record(6.0, 6, 6, w + 6)
    newest = rec.snapshots[-1][3]
    assert id(newest) in spare_ids and np.all(newest == 6) and len(rec._spares) == 2
    assert all(np.all(s[3] == s[1]) for s in rec.snapshots)  # no copy overwrote a kept one
    assert sum(s[3].nbytes for s in rec.snapshots) + sum(b.nbytes for b in rec._spares) \
        <= 6 * w.nbytes
    rec.finish(7.0, 7, 7, w + 7)
    assert rec._spares == []


def test_the_monitor_sleeps_through_a_snapshots_cost_spacing():
    """A row held back by the last copy's cost is not due sooner than that:
    the monitor sleeps until then instead of polling every millisecond
    (on a 7 MiB model that polling cost sync x2 about 5% of its speed)."""
    problem = make_problem("linear")
    big = np.zeros(4_000_000)  # 32 MB: held back for 50 x 32 ms = 1.6 s
    rec = Recorder(problem, total_examples=100, evals=100, progress=False)
    rec.record(0.0, 0, 0, big)
    wait = rec.seconds_to_due(1e-3, 50)  # the examples say a row is overdue
    assert wait == pytest.approx(rec._earliest - 1e-3) and wait > 1.0
    assert not rec.due(1e-3 + 0.9 * wait, 50) and rec.due(1e-3 + wait, 50)
    virtual = Recorder(problem, total_examples=100, evals=100, progress=False, cost_aware=False)
    virtual.record(0.0, 0, 0, big)
    assert virtual.seconds_to_due(1e-3, 50) == 0.0


def test_a_young_runs_pace_is_not_trusted_for_a_long_sleep():
    """A run's first batch (16 examples at 10 ms, the workers' start in it)
    says next to nothing of its pace: the monitor sleeps no longer than the
    run has lasted, and so wakes again in time for the first rows. It slept
    half a second on that pace, and a short async run's curve had its
    second row with 60% of the budget done (time_to_target_s 12x late).
    Once the run has a pace, the row's time at that pace is the sleep."""
    problem = make_problem("linear")
    rec = Recorder(problem, total_examples=131_072, evals=100, progress=False)
    rec.record(0.0, 0, 0, problem.initial_params(0))
    assert rec.seconds_to_due(0.0104, 16) == pytest.approx(0.0104)
    assert rec.seconds_to_due(0.2, 400) == pytest.approx(0.2)  # the pace says 0.46 s
    # 1,111 examples in 0.4 s: the row due at 1,310.72 examples is 0.072 s away
    assert rec.seconds_to_due(0.4, 1_111) == pytest.approx((1310.72 - 1111) * 0.4 / 1111)


def test_serial_runs_a_small_model_on_one_torch_thread():
    import torch

    problem = make_problem("exp")
    seen = []
    inner = problem.gradient

    def gradient(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return inner(*args, **kwargs)

    problem.gradient = gradient
    before = torch.get_num_threads()
    monsoon.train(problem, "serial", steps=5, seed=0, progress=False)
    assert set(seen) == {1}
    assert torch.get_num_threads() == before


def test_a_run_that_ends_above_its_start_says_so(tmp_path, capsys):
    """Too high a rate on least squares: the loss ends above where it began.
    The run is not marked diverged (its loss is finite) but warned of, with
    the divergence advice, in summary.json, on stderr and in report.md."""
    import json

    from monsoon.record.report import comparison_rows, report_markdown

    kw = dict(strategy="sync", workers=2, engine="local", steps=4, batch_size=64,
              dtype="float64", progress=False)
    run = monsoon.train("linear", lr=3.0, out=tmp_path / "run", **kw)
    warning = run.summary["warning"]
    assert run.summary["final_loss"] > run.history[0]["loss"]
    assert "above its starting loss" in warning and "lower the learning rate (--lr)" in warning
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["warning"] == warning
    assert warning in capsys.readouterr().err
    assert warning in report_markdown("linear", comparison_rows([[run.summary]]), None)
    calm = monsoon.train("linear", lr=0.1, **kw)
    assert calm.summary["final_loss"] < calm.history[0]["loss"] and "warning" not in calm.summary


def test_the_constant_predictors_loss_is_the_bias_alone_at_its_best():
    """``constant_loss`` (the bar a run must beat) is the loss of weights 0
    and the best bias, for each loss a sparse linear problem takes."""
    import scipy.sparse as sp

    from monsoon.problems.sparse_linear import SparseLinear
    from monsoon.record.recorder import worse_than_start

    rng = np.random.default_rng(0)
    X = sp.random(500, 30, density=0.1, random_state=1, format="csr")
    y = (rng.random(500) < 0.3).astype(float)
    for kind, bias in (("logistic", np.log(y.mean() / (1 - y.mean()))), ("hinge", -1.0),
                       ("squared", y.mean())):
        problem = SparseLinear(X, y, kind)
        w = np.zeros(problem.n_params)
        w[-1] = bias
        assert problem.constant_loss() == pytest.approx(problem.loss(w), rel=1e-12), kind
        for nudge in (-0.1, 0.1):  # and no other bias does better
            w[-1] = bias + nudge
            assert problem.loss(w) >= problem.constant_loss() - 1e-12, kind
    rows = [{"updates": 0, "loss": 0.69}]
    assert "a constant predictor's" in worse_than_start(rows, 0.65, 0.61)
    assert worse_than_start(rows, 0.60, 0.61) is None
    assert worse_than_start(rows, float("nan"), 0.61) is None  # marked diverged instead


def test_above_a_constant_predictor_the_advice_follows_the_curve():
    """Above a constant predictor's loss, "lower the learning rate" was the
    advice even for a run whose loss was still falling at its end (MF with
    a small lr: 4.84 against 0.43, a step too small, not too large). A curve
    that ends at its lowest says train longer or raise the rate; one that was
    lower before and rose again, or rose above its start on the way (and
    came down again, a step too large that the run survived: "still
    falling" before), says lower it."""
    from monsoon.record.recorder import worse_than_start

    falling = [{"updates": u, "loss": v} for u, v in ((0, 9.0), (10, 7.0), (20, 5.0))]
    warning = worse_than_start(falling, 5.0, 0.4)
    assert "still falling" in warning and "raise the learning rate (--lr)" in warning
    assert "lower the learning rate" not in warning
    rose = [{"updates": u, "loss": v} for u, v in ((0, 9.0), (10, 0.5), (20, 0.9))]
    warning = worse_than_start(rose, 0.9, 0.4)
    assert "lower the learning rate (--lr)" in warning and "still falling" not in warning
    assert "having been down to 0.5 before" in warning
    spiked = [{"updates": u, "loss": v} for u, v in ((0, 9.0), (10, 12.0), (20, 5.0))]
    warning = worse_than_start(spiked, 5.0, 0.4)
    assert warning == ("did not converge: the loss ended at 5, above a constant predictor's "
                       "(0.4), having risen to 12 on the way; lower the learning rate (--lr)")
    assert worse_than_start(falling, 0.3, 0.4) is None


def test_a_loss_that_barely_moved_says_raise_the_learning_rate():
    """A loss that barely moved (MF at a per-example lr on mini-batches: a
    step 64 times too small; here 1e-9, whose steps float32 parameters do
    not even take) was told to lower the learning rate, above a constant
    predictor's loss or a hair above its own start. Its curve shows no rise
    beyond evaluation noise: raise the rate or train longer."""
    from monsoon.record.recorder import worse_than_start

    name = "mf-synthetic:users=60,items=40,ratings=3000,rank=3"
    for lr in (1e-9, 0.002):
        run = monsoon.train(name, "sync", 2, lr=lr, seed=0, progress=False, epochs=2)
        losses = [r["loss"] for r in run.history]
        assert max(losses) - min(losses) < 1e-4 * losses[0] and run.problem.constant_loss() \
            < run.summary["final_loss"], (lr, losses)
        warning = run.summary["warning"]
        assert warning.endswith(", and barely moved from 0.425495: raise the learning rate "
                                "(--lr) or train longer (--epochs)"), (lr, warning)
        assert "a constant predictor's" in warning and "lower" not in warning
    flat = [{"updates": u, "loss": v} for u, v in ((0, 2.3127439), (10, 2.3127436),
                                                   (20, 2.3127441))]
    warning = worse_than_start(flat, 2.3127441, None)  # above its start, by float noise
    assert warning == ("did not converge: the loss ended at 2.31274, above its starting loss "
                       "(2.31274), and barely moved from 2.31274: raise the learning rate "
                       "(--lr) or train longer (--epochs)")


@pytest.mark.parametrize("kind, label", [("logistic", 1.0), ("logistic", 0.0),
                                         ("hinge", 1.0), ("squared", 0.1)])
def test_labels_all_one_value_have_no_constant_predictor_to_beat(kind, label, tmp_path):
    """A libsvm file of one class warned on every run "did not converge: the
    loss ended at 0.25, above a constant predictor's (-0)": that bar is the
    labels' entropy, 0, reached only as the bias grows without bound. No
    comparison where the labels are all one value (squared: float32 ones
    too), and no "-0" in any warning."""
    import scipy.sparse as sp

    from monsoon.problems.sparse_linear import SparseLinear
    from monsoon.record.recorder import worse_than_start

    X = sp.csr_matrix(np.array([[0.5, 0.0], [0.0, 1.0], [0.3, 0.0]]))
    problem = SparseLinear(X, np.full(3, label), kind, dtype="float32")
    assert problem.constant_loss() is None
    run = monsoon.train(problem, "serial", epochs=5, progress=False, out=tmp_path / "run")
    assert "warning" not in run.summary, run.summary["warning"]
    assert "(0)" in worse_than_start([], 0.25, -0.0)


def test_tol_stops_once_the_best_loss_gains_less_than_tol_over_an_epoch():
    """``tol`` (an engine that evaluates while it runs: ``check_target``):
    the stop comes only once an epoch of examples separates two evaluations,
    and only when the best loss fell by less than tol of itself between them;
    a noisy rise does not count as progress, nor does it stop a run that
    still gains."""
    problem = make_problem("linear")
    losses = iter([10.0, 8.0, 6.0, 5.0, 5.5, 4.9, 4.899, 4.9, 4.898])
    problem.evaluate = lambda w: {"loss": next(losses)}
    rec = Recorder(problem, total_examples=None, evals=100, progress=False, cost_aware=False,
                   tol=0.01)
    rec.check_target = True
    n = problem.n_examples
    stops = []
    for k in range(9):  # half an epoch apart
        rec._target_next = 0.0  # evaluate at every record
        stops.append(rec.record(float(k + 1), k + 1, (k + 1) * n // 2, np.zeros(problem.n_params)))
    # bests: 10 8 6 5 5 4.9 4.899 4.899 4.898; an epoch back: -, -, 10, 8, 6, 5, 5, 4.9, 4.899
    assert stops[:7] == [None] * 7
    assert stops[7] is not None and stops[7].startswith("converged: the loss fell by less than 0.01")
    assert "(4.9 to 4.899 after 8 updates)" in stops[7]
    without = Recorder(problem, total_examples=None, progress=False, cost_aware=False)
    without.check_target = True  # neither tol nor a target: nothing evaluated while it runs
    problem.evaluate = lambda w: pytest.fail("evaluated during the run")
    without.record(1.0, 1, n, np.zeros(problem.n_params))


def test_a_run_stopped_at_its_target_keeps_the_parameters_that_met_it():
    """Pushes may land between the in-run check that met the target and the
    stop: the recorder keeps a copy of what the check evaluated, which the
    run returns (``api._train``), not the live array that moved on."""
    problem = make_problem("linear")
    problem.evaluate = lambda w: {"loss": float(w[0])}
    rec = Recorder(problem, total_examples=None, target_loss=0.5, progress=False,
                   cost_aware=False)
    rec.check_target = True
    w = np.ones(problem.n_params)
    assert rec.record(1.0, 1, 10, w) is None and rec.target_params is None
    w[0] = 0.4
    assert rec.record(2.0, 2, 20, w).startswith("reached the target loss 0.5")
    w[0] = 0.9  # a push after the check
    assert rec.target_params[0] == 0.4 and rec.target_params is not w



@pytest.mark.parametrize("strategy,backend", [("async", "threads"), ("ssp", "threads"),
                                              ("async", "processes")])
def test_a_local_async_rows_examples_are_those_of_the_updates_its_parameters_hold(
        monkeypatch, strategy, backend):
    """Each push carries 2 batches of 32 (n_push 2), so a row at k updates
    has 64 k examples. A worker counts a push's examples before the push
    lands, and its update after: a row read from those counts could hold
    one push more in its examples than in its updates. Shard 0 counts the
    pushes it applies, with their examples, under its lock, and the
    monitor reads them with the parameters (a row at every wake here; a
    thread's push is held up on its way, as a busy machine would)."""
    from monsoon.engines.local.runtime import WorkerRuntime

    send_push = WorkerRuntime.send_push

    def late(self, *args, **kwargs):
        time.sleep(0.0005)
        return send_push(self, *args, **kwargs)

    monkeypatch.setattr(WorkerRuntime, "send_push", late)
    monkeypatch.setattr(Recorder, "due", lambda self, now, examples: True)
    run = monsoon.train("logistic", strategy, 2, steps=3000, batch_size=32, n_push=2,
                        lr=0.1, seed=0, backend=backend, progress=False, evals=1000)
    rows = [(row["updates"], row["examples"]) for row in run.history]
    assert len(rows) >= 20 and rows[-1] == (1500, 3000 * 32), rows[-3:]
    assert rows == [(k, 64 * k) for k, _ in rows]

"""The full-batch L-BFGS rule (``rules/lbfgs.py``) and what runs it.

The rule is checked against SciPy's L-BFGS-B on the same logistic
objective (it must reach the same optimum), its line search against a
step that overshoots, its state across a pickle (a checkpoint), and the
configuration against what cannot give it a full-batch loss.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.optimize as so
import scipy.sparse as sp

import monsoon
from monsoon.errors import ConfigError
from monsoon.problems.sparse_linear import SparseLinear, inverse_variance
from monsoon.rules import UpdateInfo, make_rule


def logistic(seed=0, rows=400, features=60):
    """Sparse rows with features of very different scales (what makes
    the metric matter), labels from a planted model."""
    rng = np.random.default_rng(seed)
    X = sp.random(rows, features, density=0.1, random_state=seed, format="csr")
    X = X @ sp.diags(np.exp(rng.uniform(-3, 2, features)))
    y = (rng.random(rows) < 1 / (1 + np.exp(-(X @ rng.standard_normal(features))))).astype(float)
    return SparseLinear(sp.csr_matrix(X), y, lam=1e-2, shuffle=False)


def run_rule(problem, rule, steps, w=None):
    w = problem.initial_params(0) if w is None else w
    state = rule.init(w.size, w.dtype)
    every = np.arange(problem.n_examples)
    losses = []
    for t in range(steps):
        loss, g = problem.gradient(w, every)
        losses.append(loss)
        rule.apply(w, g.copy(), state, UpdateInfo(step=t, loss=loss))
    return w, state, losses


def scipy_optimum(problem):
    every = np.arange(problem.n_examples)

    def f(w):
        loss, g = problem.gradient(w, every)
        return loss, g.copy()

    return so.minimize(f, problem.initial_params(0), jac=True, method="L-BFGS-B",
                       options={"maxiter": 1000, "gtol": 1e-12, "ftol": 1e-15}).fun


@pytest.mark.parametrize("preconditioned", [False, True])
def test_reaches_scipys_optimum(preconditioned):
    problem = logistic()
    rule = make_rule("lbfgs", 1.0)
    if preconditioned:
        rule.precondition(problem.inverse_variance())
    _, _, losses = run_rule(problem, rule, 300)
    best = scipy_optimum(problem)
    assert min(losses) <= best * (1 + 1e-6)
    # the loss of an accepted point never rises: each trial is judged by Armijo
    accepted = np.minimum.accumulate(losses)
    assert losses[-1] == pytest.approx(accepted[-1], rel=1e-6)


def test_metric_speeds_up_badly_scaled_features():
    problem = logistic(seed=1)
    plain, scaled = make_rule("lbfgs", 1.0), make_rule("lbfgs", 1.0)
    scaled.precondition(problem.inverse_variance())
    target = scipy_optimum(problem) * 1.01
    first = [next(t for t, v in enumerate(run_rule(problem, r, 200)[2]) if v <= target)
             for r in (plain, scaled)]
    assert first[1] < first[0]


def test_overshooting_step_backs_off_and_keeps_the_loss_down():
    problem = logistic()
    rule = make_rule("lbfgs", 1e4)   # the first trial step is far too long
    w = problem.initial_params(0)
    state = rule.init(w.size, w.dtype)
    every = np.arange(problem.n_examples)
    loss0, g = problem.gradient(w, every)
    rule.apply(w, g.copy(), state, UpdateInfo(loss=loss0))
    trial, _ = problem.gradient(w, every)
    assert trial > loss0   # overshot
    halvings = 0
    while True:
        loss, g = problem.gradient(w, every)
        before = state.scalars[1]
        rule.apply(w, g.copy(), state, UpdateInfo(loss=loss))
        if state.scalars[1] >= before and state.scalars[4] == 0:
            break   # accepted: a new direction, a fresh trial step
        halvings += 1
    assert halvings >= 5 and loss < loss0


def test_state_survives_a_pickle_exactly():
    problem = logistic()
    rule = make_rule("lbfgs", 1.0)
    w, state, _ = run_rule(problem, rule, 15)
    copy_w, copy_state = w.copy(), pickle.loads(pickle.dumps(state))
    again = pickle.loads(pickle.dumps(rule))
    every = np.arange(problem.n_examples)
    for _ in range(10):
        for r, ww, st in ((rule, w, state), (again, copy_w, copy_state)):
            loss, g = problem.gradient(ww, every)
            r.apply(ww, g.copy(), st, UpdateInfo(loss=loss))
    np.testing.assert_array_equal(w, copy_w)


def test_without_a_loss_it_says_where_to_run():
    rule = make_rule("lbfgs", 1.0)
    state = rule.init(3, np.float64)
    with pytest.raises(ConfigError, match="full-batch loss"):
        rule.apply(np.zeros(3), np.ones(3), state, UpdateInfo())


def test_inverse_variance_is_mllibs_standardization():
    X = sp.csr_matrix(np.array([[1.0, 0, 2], [3, 0, 2], [0, 0, 2], [4, 0, 2]]))
    got = inverse_variance(np.asarray(X.sum(0)).ravel(),
                           np.asarray(X.multiply(X).sum(0)).ravel(), 4)
    dense = X.toarray()
    assert got[0] == pytest.approx(1 / dense[:, 0].var(ddof=1))
    assert got[1] == 0 and got[2] == 0   # a feature that never varies stays put
    assert got[3] == 1.0                 # the bias


def test_serial_run_on_the_local_engine_meets_the_optimum(tmp_path):
    problem = logistic(seed=2)
    run = monsoon.train(problem, "serial", 1, rule="lbfgs", epochs=200, progress=False)
    assert run.summary["batch_size"] == problem.n_examples
    assert run.summary["updates"] == 200
    assert run.summary["final_loss"] <= scipy_optimum(problem) * (1 + 1e-6)


@pytest.mark.parametrize("strategy,workers,extra,match", [
    ("sync", 2, {}, "local does not give it to sync"),
    ("async", 2, {}, "does not give it to async"),
    ("serial", 1, {"batch_size": 10}, "takes the full batch"),
])
def test_refused_where_no_full_batch_loss(strategy, workers, extra, match):
    with pytest.raises(ConfigError, match=match):
        monsoon.train(logistic(), strategy, workers, rule="lbfgs", progress=False, **extra)


def test_a_full_batch_rule_goes_where_the_strategy_declares_whole_steps(monkeypatch):
    """Engines hand the step's loss to strategies by their declaration
    (``Strategy.full_batch_steps``), never by name: a renamed serial takes
    lbfgs and meets serial's result; Hogwild! with one worker, the same
    loop undeclared, is refused, and the refusal lists the pairs that work."""
    from monsoon.strategies import STRATEGIES
    from monsoon.strategies.hogwild import Hogwild
    from monsoon.strategies.serial import Serial

    class Renamed(Serial):
        name = "my-serial"

    STRATEGIES._load()
    monkeypatch.setitem(STRATEGIES._plugins, "my-serial", Renamed)
    problem = logistic(seed=2)
    mine = monsoon.train(problem, "my-serial", 1, rule="lbfgs", epochs=20, progress=False)
    theirs = monsoon.train(problem, "serial", 1, rule="lbfgs", epochs=20, progress=False)
    assert mine.summary["final_loss"] == theirs.summary["final_loss"]
    assert issubclass(Serial, Hogwild) and not Hogwild.full_batch_steps
    with pytest.raises(ConfigError, match=r"local does not give it to hogwild: use --engine "
                                          r"local --strategy my-serial or serial; --engine spark "
                                          r"--strategy my-serial or serial or sync"):
        monsoon.train(problem, "hogwild", 1, rule="lbfgs", progress=False)


def test_an_engine_declaring_strategy_names_keeps_working():
    """A plug-in engine written against the older declaration, ``gives_loss``
    as a set of strategy names, keeps working: a non-empty set hands the loss
    to the strategies that declare whole steps (never by their names), an
    empty one to none."""
    from monsoon.engines.local.engine import LocalEngine
    from monsoon.strategies.hogwild import Hogwild
    from monsoon.strategies.serial import Serial
    from monsoon.strategies.sync import Sync

    class Named(LocalEngine):
        gives_loss = frozenset({"sync"})

    class Silent(LocalEngine):
        gives_loss = frozenset()

    assert Named.gives_loss(Sync) and Named().gives_loss(Serial)
    assert not Named.gives_loss(Hogwild) and not Silent.gives_loss(Sync)


def test_default_budget_is_a_hundred_full_batch_steps():
    run = monsoon.train(logistic(), "serial", 1, rule="lbfgs", progress=False)
    assert run.summary["updates"] == 100


class NanBeyond(SparseLinear):
    """A gradient that is NaN where the weights are large (an overflow)."""

    def gradient(self, w, indices, out=None, accumulate=False):
        loss, g = super().gradient(w, indices, out, accumulate)
        if np.abs(w).max() > 50:
            g[...] = np.nan
        return loss, g


def test_a_trial_point_with_a_non_finite_gradient_is_backed_off_from():
    base = logistic(seed=3)
    problem = NanBeyond(base.X, base.y, lam=1e-2, shuffle=False)
    run = monsoon.train(problem, "serial", 1, rule="lbfgs", lr=1e4, epochs=200,
                        progress=False)
    assert run.summary["dropped_updates"] >= 1   # the first trial step overflowed
    assert run.summary["final_loss"] <= scipy_optimum(base) * (1 + 1e-6)


def test_a_run_ends_on_an_accepted_point_not_an_unjudged_trial():
    """With a first step far too long, each of the first steps is a trial
    that overshoots; the run's result is the last accepted point."""
    problem = logistic()
    start = problem.loss(problem.initial_params(0))
    for steps in (1, 2, 3):
        run = monsoon.train(problem, "serial", 1, rule="lbfgs", lr=1e3, steps=steps,
                            progress=False)
        assert run.summary["final_loss"] <= start


def test_inverse_variance_holds_in_float32():
    """A feature with mean 1000 and std 1: float32 sums of squares would
    cancel to nothing and freeze its weight."""
    rng = np.random.default_rng(0)
    col = (1000 + rng.standard_normal(100_000)).astype(np.float32)
    X = sp.csr_matrix(col.reshape(-1, 1))
    problem = SparseLinear(X, (rng.random(100_000) < 0.5).astype(np.float32), lam=0.0,
                           dtype="float32", shuffle=False)
    assert problem.inverse_variance()[0] == pytest.approx(1 / col.astype(float).var(ddof=1),
                                                          rel=1e-3)


def test_serial_resume_mid_run_is_exact(tmp_path):
    problem = logistic(seed=4)
    kw = dict(rule="lbfgs", epochs=30, progress=False, evals=0)
    whole = monsoon.train(problem, "serial", 1, **kw)
    monsoon.train(problem, "serial", 1, checkpoint_every=10, out=tmp_path / "a", **kw)
    saved = sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*"))
    assert saved and saved[0].name == "ckpt-000000000010.npz"
    for path in saved[1:]:   # cut after step 10: the pairs half filled
        path.unlink()
    resumed = monsoon.train(problem, "serial", 1, resume=str(tmp_path / "a"),
                            out=tmp_path / "b", **kw)
    np.testing.assert_array_equal(resumed.params, whole.params)

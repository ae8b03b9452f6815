"""Update rules, one table through one suite (in the spirit of optax's tests).

Every rule is checked against a hand-written NumPy reference of its update
equations (written here, independent of monsoon) and, where PyTorch has the same
optimizer, against ``torch.optim`` on the same recorded gradient sequence. The
rest of the suite checks what the engines rely on: ``g`` is read-only, sharded
application is exact, float32 stays float32, and rules survive pickling.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch

from monsoon import rules
from monsoon.errors import ConfigError
from monsoon.rules import UpdateInfo, slice_state

N = 7
STEPS = 20
LR = 0.05
SHARDS = [(0, 2), (2, 5), (5, N)]   # uneven on purpose


# --- references: the update equations, written out in plain NumPy -------------

def sgd_reference(w, grads, lr, gamma=1.0, step_size=1):
    trajectory = []
    for t, g in enumerate(grads):
        w = w - lr * gamma ** np.floor(t / step_size) * g
        trajectory.append(w)
    return np.array(trajectory)


def momentum_reference(w, grads, lr, mu):
    v = np.zeros_like(w)
    trajectory = []
    for g in grads:
        v = mu * v + g
        w = w - lr * v
        trajectory.append(w)
    return np.array(trajectory)


def adagrad_reference(w, grads, lr, eps=1e-10):
    s = np.zeros_like(w)
    trajectory = []
    for g in grads:
        s = s + g * g
        w = w - lr * g / (np.sqrt(s) + eps)
        trajectory.append(w)
    return np.array(trajectory)


def nesterov_reference(w, grads, lr, mu):
    v = np.zeros_like(w)
    trajectory = []
    for g in grads:
        v = mu * v + g
        w = w - lr * (g + mu * v)
        trajectory.append(w)
    return np.array(trajectory)


def adam_reference(w, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    m, v = np.zeros_like(w), np.zeros_like(w)
    trajectory = []
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        w = w - lr * m_hat / (np.sqrt(v_hat) + eps)
        trajectory.append(w)
    return np.array(trajectory)


# --- the table ----------------------------------------------------------------

@dataclass
class Case:
    rule_args: dict                          # keyword arguments of make_rule
    reference: Callable                      # (w0, grads) -> trajectory
    torch_optimizer: Callable                # [param] -> (optimizer, lr scheduler or None)

    def make(self):
        return rules.make_rule(**self.rule_args)


def _step_lr(optimizer):
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=6, gamma=0.5)


CASES = {
    "sgd": Case(
        dict(name="sgd", lr=LR),
        lambda w, gs: sgd_reference(w, gs, LR),
        lambda p: (torch.optim.SGD(p, lr=LR), None)),
    "sgd-step": Case(
        dict(name="sgd", lr=LR, schedule="step", gamma=0.5, step_size=6),
        lambda w, gs: sgd_reference(w, gs, LR, gamma=0.5, step_size=6),
        lambda p: _step_lr(torch.optim.SGD(p, lr=LR))),
    "momentum": Case(
        dict(name="momentum", lr=LR, momentum=0.9),
        lambda w, gs: momentum_reference(w, gs, LR, mu=0.9),
        lambda p: (torch.optim.SGD(p, lr=LR, momentum=0.9), None)),
    "adagrad": Case(
        dict(name="adagrad", lr=LR),
        lambda w, gs: adagrad_reference(w, gs, LR, eps=1e-10),
        lambda p: (torch.optim.Adagrad(p, lr=LR, eps=1e-10, initial_accumulator_value=0), None)),
    "nesterov": Case(
        dict(name="nesterov", lr=LR, momentum=0.9),
        lambda w, gs: nesterov_reference(w, gs, LR, mu=0.9),
        lambda p: (torch.optim.SGD(p, lr=LR, momentum=0.9, nesterov=True), None)),
    "adam": Case(
        dict(name="adam", lr=LR),
        lambda w, gs: adam_reference(w, gs, LR),
        lambda p: (torch.optim.Adam(p, lr=LR), None)),
}

each_rule = pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())


@pytest.fixture
def recorded():
    """A starting point and a recorded sequence of gradients, with per-step
    scales spread over two decades so AdaGrad's accumulator matters."""
    rng = np.random.default_rng(20240611)
    w0 = rng.standard_normal(N)
    grads = rng.standard_normal((STEPS, N)) * np.logspace(-1, 1, STEPS)[:, None]
    return w0, grads


def run_rule(rule, w0, grads, dtype=np.float64):
    """Apply ``rule`` to the gradient sequence; return the weights after each update."""
    w = w0.astype(dtype)
    state = rule.init(N, dtype)
    trajectory = []
    for t, g in enumerate(grads.astype(dtype)):
        rule.apply(w, g, state, UpdateInfo(step=t))
        trajectory.append(w.copy())
    return np.array(trajectory), state


def run_torch(make_optimizer, w0, grads):
    param = torch.tensor(w0, dtype=torch.float64, requires_grad=True)
    optimizer, scheduler = make_optimizer([param])
    trajectory = []
    for g in grads:
        param.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        trajectory.append(param.detach().numpy().copy())
    return np.array(trajectory)


# --- the suite ----------------------------------------------------------------

@each_rule
def test_matches_numpy_reference(case, recorded):
    w0, grads = recorded
    got, _ = run_rule(case.make(), w0, grads)
    np.testing.assert_allclose(got, case.reference(w0, grads), rtol=1e-12, atol=0)


@each_rule
def test_matches_torch(case, recorded):
    w0, grads = recorded
    got, _ = run_rule(case.make(), w0, grads)
    np.testing.assert_allclose(got, run_torch(case.torch_optimizer, w0, grads), rtol=1e-12, atol=0)


@each_rule
def test_apply_leaves_gradient_untouched(case, recorded):
    w0, grads = recorded
    rule, w = case.make(), w0.copy()
    state = rule.init(N, np.float64)
    for t, g in enumerate(grads):
        g_before = g.copy()
        rule.apply(w, g, state, UpdateInfo(step=t))
        np.testing.assert_array_equal(g, g_before)
    assert not np.array_equal(w, w0)   # the update did happen


@each_rule
def test_sharded_apply_equals_whole(case, recorded):
    """The sharded parameter server applies a rule to slices of w, g and the
    state; since every rule is per coordinate this must be exact. The state
    slices are views, so the shards' updates must land in the whole state."""
    w0, grads = recorded
    expected, expected_state = run_rule(case.make(), w0, grads)

    rule, w = case.make(), w0.copy()
    state = rule.init(N, np.float64)
    for t, g in enumerate(grads):
        for a, b in SHARDS:
            rule.apply(w[a:b], g[a:b], slice_state(state, a, b), UpdateInfo(step=t))
        np.testing.assert_array_equal(w, expected[t])
    for got, want in zip(state, expected_state):
        np.testing.assert_array_equal(got, want)


@each_rule
def test_float32_stays_float32(case, recorded):
    w0, grads = recorded
    got, state = run_rule(case.make(), w0, grads, dtype=np.float32)
    assert got.dtype == np.float32
    assert all(a.dtype == np.float32 for a in state)
    np.testing.assert_allclose(got, case.reference(w0, grads), rtol=1e-5, atol=1e-5)


@each_rule
def test_pickled_rule_gives_identical_updates(case, recorded):
    """Workers receive their rule by pickle, possibly mid-run (scratch buffer
    already allocated)."""
    w0, grads = recorded
    rule, w = case.make(), w0.copy()
    state = rule.init(N, np.float64)
    for t in range(5):
        rule.apply(w, grads[t], state, UpdateInfo(step=t))
    copy = pickle.loads(pickle.dumps(rule))
    assert copy.describe() == rule.describe()

    w_copy, state_copy = w.copy(), type(state)(*(a.copy() for a in state))
    for t in range(5, STEPS):
        rule.apply(w, grads[t], state, UpdateInfo(step=t))
        copy.apply(w_copy, grads[t], state_copy, UpdateInfo(step=t))
    np.testing.assert_array_equal(w_copy, w)
    np.testing.assert_allclose(w, case.reference(w0, grads)[-1], rtol=1e-12, atol=0)


# --- make_rule validation -------------------------------------------------------

def test_unknown_rule_name_lists_valid_names():
    with pytest.raises(ConfigError, match="rmsprop") as excinfo:
        rules.make_rule("rmsprop", lr=0.1)
    for name in ("adagrad", "momentum", "sgd", "nesterov", "adam", "adarevision", "dcasgd"):
        assert name in str(excinfo.value)


@pytest.mark.parametrize("lr", [0.0, -0.1, float("nan")])
def test_non_positive_learning_rate_is_refused(lr):
    with pytest.raises(ConfigError, match="learning rate"):
        rules.make_rule("sgd", lr=lr)


def test_unknown_schedule_is_refused():
    with pytest.raises(ConfigError, match="cosine"):
        rules.make_rule("sgd", lr=0.1, schedule="cosine")


# --- AdaGrad on standardized rare features (standardize_below, the spark data's) --

def _binary_features(rows=300, features=20, seed=0):
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    freq = np.geomspace(0.5, 0.01, features)  # common to rare, as click data
    X = sp.csr_matrix((rng.random((rows, features)) < freq).astype(float))
    y = (X @ rng.normal(size=features) + 0.3 * rng.normal(size=rows) > 0.2).astype(float)
    return X, y


@pytest.mark.parametrize("below", [1.0, 0.2])
def test_standardized_adagrad_is_adagrad_on_standardized_features(below):
    """Rate j times s_j = max(1, c / sigma_j) is AdaGrad run on the features
    x_j * s_j with its weights mapped back (w = s w'), up to AdaGrad's eps
    (1e-10, added to sqrt(sum) in one space and to sqrt(sum) / s_j in the
    other); the bias is not scaled. c = 1 standardizes every feature here (all
    deviations are below 0.5), c = 0.2 only the rarer ones. Unscaled, the run
    ends elsewhere."""
    import scipy.sparse as sp

    import monsoon
    from monsoon.problems.sparse_linear import SparseLinear

    X, y = _binary_features()
    raw = SparseLinear(X, y, "logistic", lam=0.0, dtype="float64", shuffle=False)
    scale = np.maximum(1.0, below * np.sqrt(raw.inverse_variance()))
    assert scale[-1] == 1.0 and (scale[:-1] > 1).any()
    assert below == 1.0 or (scale[:-1] == 1).any()
    scaled = SparseLinear((X @ sp.diags(scale[:-1])).tocsr(), y, "logistic", lam=0.0,
                          dtype="float64", shuffle=False)
    opts = dict(rule="adagrad", lr=0.05, epochs=3, batch_size=32, seed=0, evals=0,
                progress=False)
    mine = monsoon.train(raw, "serial", standardize_below=below, **opts)
    theirs = monsoon.train(scaled, "serial", **opts)
    np.testing.assert_allclose(mine.params, theirs.params * scale, rtol=1e-7, atol=1e-12)
    plain = monsoon.train(raw, "serial", **opts)
    assert np.abs(plain.params - mine.params).max() > 0.1


def test_standardized_adagrad_shards_its_scales_with_its_sums():
    """A sharded server applies the rule slice by slice: the scales travel in
    the state, so a sliced application equals the whole one."""
    rule = rules.make_rule("adagrad", LR, standardize_below=1.0)
    rule.precondition(np.linspace(0.5, 4.0, N))
    g = np.random.default_rng(1).normal(size=(STEPS, N))
    whole_w, whole = np.ones(N), rule.init(N, np.float64)
    parts_w, parts = np.ones(N), rule.init(N, np.float64)
    for t in range(STEPS):
        rule.apply(whole_w, g[t], whole, UpdateInfo(step=t))
        for a, b in SHARDS:
            rule.apply(parts_w[a:b], g[t, a:b], slice_state(parts, a, b), UpdateInfo(step=t))
    np.testing.assert_array_equal(parts_w, whole_w)
    assert not np.allclose(whole_w, 1.0)  # it moved


def test_standardize_on_a_problem_without_feature_variances_is_refused():
    import monsoon

    with pytest.raises(ConfigError, match="drop --standardize-below"):
        monsoon.train("exp", "serial", rule="adagrad", standardize_below=0.01, steps=2,
                      evals=0)

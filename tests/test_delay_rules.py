"""Delay-tolerant rules against NumPy references of ALGORITHMS.md, on a
recorded sequence of reads and updates with known delays."""
import numpy as np
import pytest

from monsoon import rules
from monsoon.rules import UpdateInfo

N, WORKERS = 6, 3
# (kind, worker): each worker reads, others update, then it updates: delays 0..2
EVENTS = [("read", 0), ("read", 1), ("read", 2), ("update", 0), ("update", 2), ("read", 0),
          ("read", 2), ("update", 1), ("update", 2), ("read", 1), ("read", 2), ("update", 0),
          ("update", 2), ("read", 0), ("read", 2), ("update", 1), ("update", 2), ("update", 0),
          ("read", 0), ("read", 1), ("read", 2), ("update", 0), ("update", 1), ("update", 2)]


@pytest.fixture
def recorded():
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal(N)
    grads = rng.standard_normal((sum(k == "update" for k, _ in EVENTS), N))
    return w0, grads


def run_monsoon(rule, w0, grads, events=EVENTS):
    """Drive ``rule`` as a parameter server does: on_read at reads, apply at updates."""
    w = w0.copy()
    state = rule.init(N, np.float64)
    readers = [rule.init_reader(N, np.float64) for _ in range(WORKERS)]
    version, read_version, updates = 0, [0] * WORKERS, iter(grads)
    staleness = []
    for kind, m in events:
        if kind == "read":
            read_version[m] = version
            rule.on_read(w, state, readers[m])
        else:
            tau = version - read_version[m]
            staleness.append(tau)
            rule.apply(w, next(updates), state,
                       UpdateInfo(step=version, staleness=tau, worker=m, reader=readers[m]))
            version += 1
    return w, staleness


def adarevision_reference(w0, grads, alpha, events=EVENTS):
    x = w0.copy()
    gbar, z, zmax = np.zeros(N), np.ones(N), np.ones(N)
    gbar_old = [np.zeros(N) for _ in range(WORKERS)]
    updates = iter(grads)
    for kind, m in events:
        if kind == "read":
            gbar_old[m] = gbar.copy()
            continue
        g = next(updates)
        g_bck = gbar - gbar_old[m]
        eta_old = alpha / np.sqrt(zmax)
        z = z + g * g + 2 * g * g_bck
        zmax = np.maximum(zmax, z)
        eta = alpha / np.sqrt(zmax)
        x = x - eta * g + (eta_old - eta) * g_bck
        gbar = gbar + g
    return x


def dcasgd_reference(w0, grads, lr, lam=0.04, adaptive=False, m=0.95, eps=1e-7):
    w = w0.copy()
    w_bak = [np.zeros(N) for _ in range(WORKERS)]
    M = np.zeros(N)
    updates = iter(grads)
    for kind, k in EVENTS:
        if kind == "read":
            w_bak[k] = w.copy()
            continue
        g = next(updates)
        if adaptive:
            M = m * M + (1 - m) * g * g
            lam_t = lam / np.sqrt(M + eps)
        else:
            lam_t = lam
        w = w - lr * (g + lam_t * g * g * (w - w_bak[k]))
    return w


def staleness_sgd_reference(w0, grads, lr, staleness):
    w = w0.copy()
    for g, tau in zip(grads, staleness):
        w = w - (lr / tau if tau >= 1 else lr) * g
    return w


def test_the_recorded_sequence_has_real_delays(recorded):
    _, staleness = run_monsoon(rules.make_rule("sgd", 0.1), *recorded)
    assert min(staleness) == 0 and max(staleness) == 2


def test_adarevision_matches_reference(recorded):
    w, _ = run_monsoon(rules.make_rule("adarevision", 0.1), *recorded)
    np.testing.assert_allclose(w, adarevision_reference(*recorded, alpha=0.1), rtol=1e-12)


@pytest.mark.parametrize("adaptive,name,lam", [(False, "dcasgd", 0.04), (True, "dcasgd-a", 2.0)])
def test_dcasgd_matches_reference(recorded, adaptive, name, lam):
    w, _ = run_monsoon(rules.make_rule(name, 0.1), *recorded)
    expected = dcasgd_reference(*recorded, lr=0.1, lam=lam, adaptive=adaptive)
    np.testing.assert_allclose(w, expected, rtol=1e-12)


def test_dcasgd_compensation_changes_the_result(recorded):
    plain, _ = run_monsoon(rules.make_rule("sgd", 0.1), *recorded)
    dc, _ = run_monsoon(rules.make_rule("dcasgd", 0.1, lam=1.0), *recorded)
    assert not np.allclose(plain, dc)


def test_staleness_aware_learning_rate(recorded):
    w, staleness = run_monsoon(rules.make_rule("sgd", 0.1, staleness_lr=True), *recorded)
    np.testing.assert_allclose(w, staleness_sgd_reference(*recorded, 0.1, staleness),
                               rtol=1e-12)


def test_adarevision_without_delay_is_adagrad(recorded):
    """Every update read just before it: g_bck = 0, and AdaRevision is AdaGrad
    with the same alpha and initial accumulator (and no eps)."""
    w0, grads = recorded
    no_delay = [e for _ in grads for e in (("read", 0), ("update", 0))]
    w, staleness = run_monsoon(rules.make_rule("adarevision", 0.1), w0, grads, no_delay)
    assert set(staleness) == {0}
    adagrad = rules.make_rule("adagrad", 0.1, eps=0.0, initial_accumulator=1.0)
    v, state = w0.copy(), adagrad.init(N, np.float64)
    for t, g in enumerate(grads):
        adagrad.apply(v, g, state, UpdateInfo(step=t))
    np.testing.assert_allclose(w, v, rtol=1e-12)


@pytest.mark.parametrize("name", ["adarevision", "dcasgd", "dcasgd-a"])
def test_no_reader_means_no_delay(recorded, name):
    """Serial and sync pass reader=None: the rule must act as if just read."""
    w0, grads = recorded
    rule_a, rule_b = rules.make_rule(name, 0.05), rules.make_rule(name, 0.05)
    a, b = w0.copy(), w0.copy()
    sa, sb = rule_a.init(N, np.float64), rule_b.init(N, np.float64)
    reader = rule_b.init_reader(N, np.float64)
    for t, g in enumerate(grads):
        rule_a.apply(a, g, sa, UpdateInfo(step=t))
        rule_b.on_read(b, sb, reader)
        rule_b.apply(b, g, sb, UpdateInfo(step=t, reader=reader))
    np.testing.assert_allclose(a, b, rtol=1e-12)

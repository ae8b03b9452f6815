"""The plain-NumPy problems: their gradients are their objectives' derivatives,
and worker copies share the data but not the gradient buffer."""
import numpy as np
import pytest

from monsoon.problems import make_problem
from monsoon.problems.quadratic import Quadratic


@pytest.mark.parametrize("name", ["linear", "logistic"])
def test_dense_linear_gradient(name):
    p = make_problem(name, "float64")
    w = np.random.default_rng(0).standard_normal(p.n_params) * 0.3
    loss, g = p.gradient(w, np.arange(p.n_examples))
    assert loss == pytest.approx(p.loss(w), rel=1e-12)
    for j in [0, 5, p.n_params - 1]:
        e = np.zeros_like(w)
        e[j] = 1e-6
        assert g[j] == pytest.approx((p.loss(w + e) - p.loss(w - e)) / 2e-6, abs=1e-7)


def test_quadratic_gradient_and_batch_loss_are_exact():
    p = Quadratic(n_params=1000, n_examples=64, dtype="float64")
    w = np.random.default_rng(1).standard_normal(p.n_params)
    idx = np.array([3, 9, 40])
    loss, g = p.gradient(w, idx)
    per_example = [w - p.target - p.offsets[i] * p.direction for i in idx]
    np.testing.assert_allclose(g, np.mean(per_example, axis=0), rtol=1e-12)
    assert loss == pytest.approx(np.mean([0.5 * r @ r for r in per_example]), rel=1e-12)
    full = np.mean([0.5 * np.sum((w - p.target - c * p.direction) ** 2) for c in p.offsets])
    assert p.loss(w) == pytest.approx(full, rel=1e-10)


@pytest.mark.parametrize("name", ["linear", "rcv1-like:rows=500,features=100",
                                  "mf-synthetic:users=20,items=10,ratings=200"])
def test_worker_copies_share_data_not_gradients(name):
    p = make_problem(name, "float64")
    a, b = p.for_worker(0, 2), p.for_worker(1, 2)
    data = {"linear": "X", "rcv1": "X", "mf": "ratings"}[name.split("-")[0].split(":")[0]]
    assert getattr(a, data) is getattr(p, data) is getattr(b, data)
    assert a._grad is not b._grad and a._grad is not p._grad

"""learning_rate="adagrad": per-feature steps eta0 / sqrt(sum of squared
slopes) (Duchi, Hazan and Singer 2011) in the same lock-free kernel, for
power-law sparse data where one global schedule suits neither the frequent
features nor the rare ones (see bench/hogwild_vs_vw.py)."""
import numpy as np
import pytest
from sklearn.metrics import log_loss

from monsoon.sklearn import HogwildClassifier, HogwildRegressor
from monsoon.sklearn.plain_sgd import LayoutChooser
from sklearn_data import power_law

PARAMS = dict(loss="log_loss", learning_rate="adagrad", eta0=1.0, alpha=1e-7, max_iter=5,
              tol=None, random_state=0)


@pytest.fixture(scope="module")
def data():
    return power_law(20_000, 10_000, 30, seed=2)


def _loss(clf, X, y):
    return log_loss(y, clf.predict_proba(X)[:, 1])


def test_adagrad_is_accepted_and_beats_the_optimal_schedule(data):
    """Under scikit-learn's parameter checks, and on power-law data, 5
    epochs of it reach a lower training log-loss than 'optimal' does in
    5 (the scikit-learn default) or 20."""
    X, y = data
    ada = HogwildClassifier(**PARAMS).fit(X, y)
    assert ada.get_params()["learning_rate"] == "adagrad"
    for epochs in (5, 20):
        optimal = HogwildClassifier(loss="log_loss", alpha=1e-7, max_iter=epochs, tol=None,
                                    random_state=0).fit(X, y)
        assert _loss(ada, X, y) < 0.95 * _loss(optimal, X, y)
    with pytest.raises(ValueError, match="learning_rate"):
        HogwildClassifier(learning_rate="adagradd").fit(X, y)


def test_adagrad_on_two_threads_is_one_threads(data, monkeypatch):
    monkeypatch.setattr(LayoutChooser, "next", lambda self: "threads" if self.threads else "one")
    X, y = data
    one = _loss(HogwildClassifier(n_jobs=1, **PARAMS).fit(X, y), X, y)
    for _ in range(3):
        assert _loss(HogwildClassifier(n_jobs=2, **PARAMS).fit(X, y), X, y) <= 1.01 * one


def test_adagrad_sums_go_on_across_partial_fit_and_start_again_at_fit(data):
    """Five partial_fit calls are one fit of five epochs (same shuffle
    seeds aside: the same log-loss within 1%); a second fit starts afresh
    and gives the first fit's model to the bit."""
    X, y = data
    fit = HogwildClassifier(**PARAMS).fit(X, y)
    first = fit.coef_.copy()
    steps = HogwildClassifier(**{**PARAMS, "max_iter": 1})
    for _ in range(5):
        steps.partial_fit(X, y, classes=[0, 1])
    assert abs(_loss(steps, X, y) / _loss(fit, X, y) - 1) < 0.01
    np.testing.assert_array_equal(fit.fit(X, y).coef_, first)


def test_adagrad_regressor_fits_a_linear_model():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 10))
    y = X @ np.arange(1.0, 11.0) + 0.5
    reg = HogwildRegressor(learning_rate="adagrad", eta0=1.0, alpha=0.0, max_iter=20, tol=None,
                           random_state=0).fit(X, y)
    assert reg.score(X, y) > 0.999

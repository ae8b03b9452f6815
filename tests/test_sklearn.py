"""monsoon.sklearn: scikit-learn's own estimator checks, and real use."""
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from monsoon.problems.sparse_linear import rcv1_like
from monsoon.sklearn import HogwildClassifier, HogwildRegressor


@parametrize_with_checks([HogwildClassifier(), HogwildRegressor()])
def test_sklearn_estimator_conventions(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def text_data():
    p = rcv1_like(rows=6000, features=2000, nnz=25, noise=0.02)
    return train_test_split(p.X, p.y.astype(int), test_size=0.25, random_state=0)


def test_pipeline_with_grid_search_on_sparse_text(text_data):
    X_train, X_test, y_train, y_test = text_data
    pipe = Pipeline([("scale", StandardScaler(with_mean=False)),
                     ("clf", HogwildClassifier(n_jobs=2, max_iter=5, random_state=0))])
    search = GridSearchCV(pipe, {"clf__alpha": [1e-5, 1e-3], "clf__loss": ["log_loss", "hinge"]},
                          cv=3)
    search.fit(X_train, y_train)
    assert set(search.best_params_) == {"clf__alpha", "clf__loss"}
    from sklearn.linear_model import SGDClassifier

    peer = Pipeline([("scale", StandardScaler(with_mean=False)),
                     ("clf", SGDClassifier(random_state=0))]).fit(X_train, y_train)
    score = search.score(X_test, y_test)
    assert score > 0.72  # chance is 0.5
    assert score > peer.score(X_test, y_test) - 0.08
    proba = search.best_estimator_.predict_proba(X_test) if \
        search.best_params_["clf__loss"] == "log_loss" else None
    if proba is not None:
        np.testing.assert_allclose(proba.sum(axis=1), 1.0)


def test_multiclass_one_vs_rest_on_digits():
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, random_state=0)
    clf = HogwildClassifier(max_iter=10, random_state=0).fit(X_train, y_train)
    assert clf.coef_.shape == (10, 64) and list(clf.classes_) == list(range(10))
    assert clf.score(X_test, y_test) > 0.9
    assert clf.predict_proba(X_test).shape == (len(X_test), 10)


def test_partial_fit_continues_and_threads_agree(text_data):
    X_train, X_test, y_train, y_test = text_data
    clf = HogwildClassifier(random_state=0)
    clf.partial_fit(X_train, y_train, classes=[0, 1])
    first = clf.score(X_test, y_test)
    for _ in range(4):
        clf.partial_fit(X_train, y_train)
    assert clf.score(X_test, y_test) >= first
    parallel = HogwildClassifier(n_jobs=2, random_state=0).fit(X_train, y_train)
    serial = HogwildClassifier(n_jobs=1, random_state=0).fit(X_train, y_train)
    assert abs(parallel.score(X_test, y_test) - serial.score(X_test, y_test)) < 0.02


def test_regressor_fits_a_linear_model():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 10))
    y = X @ np.arange(1.0, 11.0) + 0.5 + 0.01 * rng.standard_normal(3000)
    reg = HogwildRegressor(learning_rate=0.01, alpha=0.0, max_iter=10, random_state=0).fit(X, y)
    np.testing.assert_allclose(reg.coef_, np.arange(1.0, 11.0), atol=0.05)
    assert reg.score(X, y) > 0.999


def test_beta_is_the_per_epoch_step_decay(text_data):
    X_train, _, y_train, _ = text_data
    a = HogwildClassifier(beta=0.9, random_state=0).fit(X_train, y_train)
    b = HogwildClassifier(beta=0.5, random_state=0).fit(X_train, y_train)
    assert not np.allclose(a.coef_, b.coef_)

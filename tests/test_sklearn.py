"""monsoon.sklearn: scikit-learn's own estimator checks, the drop-in promise
(every SGDClassifier parameter, same scores), and real use."""
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_digits, make_classification
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils._test_common.instance_generator import _get_expected_failed_checks
from sklearn.utils.estimator_checks import parametrize_with_checks

from monsoon.problems.sparse_linear import rcv1_like
from monsoon.sklearn import HogwildClassifier, HogwildRegressor
from monsoon.sklearn import plain_sgd
from monsoon.sklearn.plain_sgd import REPROBE, LayoutChooser, run_epoch

ROOT = Path(__file__).resolve().parents[1]

# the checks scikit-learn itself expects SGDClassifier/SGDRegressor to fail
_XFAIL = {HogwildClassifier: _get_expected_failed_checks(SGDClassifier()),
          HogwildRegressor: _get_expected_failed_checks(SGDRegressor())}


@parametrize_with_checks([HogwildClassifier(max_iter=5), HogwildRegressor(max_iter=5),
                          HogwildClassifier(max_iter=5, n_jobs=2)],
                         expected_failed_checks=lambda est: _XFAIL[type(est)])
def test_sklearn_estimator_conventions(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def text_data():
    p = rcv1_like(rows=6000, features=2000, nnz=25, noise=0.02)
    return train_test_split(p.X, p.y.astype(int), test_size=0.25, random_state=0)


@pytest.fixture(scope="module")
def small():
    X, y = make_classification(3000, 20, n_informative=8, class_sep=1.5, random_state=0)
    return train_test_split(StandardScaler().fit_transform(X), y, test_size=0.3, random_state=0)


# every SGDClassifier parameter the issue names, at a non-default value
PARAMS = {
    "loss": [dict(loss="log_loss"), dict(loss="modified_huber"), dict(loss="squared_hinge"),
             dict(loss="perceptron")],
    "penalty": [dict(penalty="l1"), dict(penalty="elasticnet", l1_ratio=0.5),
                dict(penalty=None)],
    "alpha": [dict(alpha=1e-3)],
    "fit_intercept": [dict(fit_intercept=False)],
    "max_iter": [dict(max_iter=3, tol=None)],
    "tol": [dict(tol=1e-1, n_iter_no_change=2)],
    "learning_rate": [dict(learning_rate="constant", eta0=0.01),
                      dict(learning_rate="invscaling", eta0=0.05, power_t=0.3),
                      dict(learning_rate="adaptive", eta0=0.05)],
    "class_weight": [dict(class_weight="balanced"), dict(class_weight={0: 1.0, 1: 3.0})],
    "warm_start": [dict(warm_start=True)],
    "average": [dict(average=True), dict(average=100)],
    "early_stopping": [dict(early_stopping=True, validation_fraction=0.2)],
    "shuffle": [dict(shuffle=False)],
    "verbose": [dict(verbose=1)],
    "n_jobs": [dict(n_jobs=2)],
}


@pytest.mark.parametrize("params", [p for ps in PARAMS.values() for p in ps],
                         ids=[f"{k}-{i}" for k, ps in PARAMS.items() for i in range(len(ps))])
def test_each_sgdclassifier_parameter_scores_as_sklearn(small, params, capsys):
    """Accepted under sklearn's name, and as good: the mean test accuracy over
    three seeds (SGD's own spread between seeds is about 2%) within 0.02."""
    X_train, X_test, y_train, y_test = small
    key = next(iter(params))
    scores = {}
    for cls in (HogwildClassifier, SGDClassifier):
        runs = []
        for seed in range(3):
            est = cls(random_state=seed, **params)
            assert est.get_params()[key] == params[key]
            est.fit(X_train, y_train)
            if params.get("warm_start"):
                est.fit(X_train, y_train)  # goes on from the first fit
            runs.append(est.score(X_test, y_test))
        scores[cls.__name__] = np.mean(runs)
    assert abs(scores["HogwildClassifier"] - scores["SGDClassifier"]) <= 0.02, scores
    if params.get("verbose"):
        assert "-- Epoch 1" in capsys.readouterr().out


def test_defaults_are_sklearns():
    assert HogwildClassifier().get_params() == SGDClassifier().get_params()
    ours, theirs = HogwildRegressor().get_params(), SGDRegressor().get_params()
    assert ours.pop("n_jobs") is None and ours == theirs


OLD_SKLEARN = """
import sklearn
sklearn.__version__ = "1.7.2"  # what an older install reports
import monsoon.sklearn
"""


def test_an_older_scikit_learn_is_refused_on_import_in_one_line():
    """The estimators override private methods whose arguments changed in
    scikit-learn 1.8; under 1.7 every fit failed mid-fit
    (``_fit_binary() got an unexpected keyword argument 'C'``), though
    pyproject.toml allowed 1.3. Now the import refuses, naming the version
    and the pip command."""
    proc = subprocess.run([sys.executable, "-c", OLD_SKLEARN], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ImportError: monsoon.sklearn needs scikit-learn >= 1.8, and 1.7.2 is installed: "
        "pip install 'scikit-learn>=1.8'")
    from monsoon.sklearn import require_sklearn
    with pytest.raises(ImportError, match="1.3.0 is installed"):
        require_sklearn("1.3.0")
    with pytest.raises(ImportError, match=r"installed: scikit-learn 1.8 needs Python 3.11 or "
                                          r"newer, and this is Python 3.10$"):
        require_sklearn("1.7.2", python=(3, 10))  # where pip cannot install 1.8
    for version in ("1.8.0", "1.8.dev0", "1.10.1", "2.0rc1"):
        require_sklearn(version)


@pytest.mark.parametrize("ours, theirs", [(HogwildClassifier, SGDClassifier),
                                           (HogwildRegressor, SGDRegressor)])
def test_fit_routes_sample_weight_as_scikit_learns(ours, theirs):
    """``fit`` takes scikit-learn's parameters by name, so metadata routing
    finds them: ``set_fit_request(sample_weight=True)`` raised "Unexpected
    args: {'sample_weight'} in fit" (``fit(self, X, y, *args, **kwargs)``,
    with no docstring). A routed grid search scores as scikit-learn's."""
    import inspect

    import sklearn
    X, y = make_classification(600, 8, random_state=0)
    if ours is HogwildRegressor:
        y = X @ np.arange(1.0, 9.0) + np.random.default_rng(0).standard_normal(600)
    weights = np.random.RandomState(0).rand(600)
    assert inspect.signature(ours.fit) == inspect.signature(theirs.fit)
    assert ours.fit.__doc__ == theirs.fit.__doc__
    best = []
    with sklearn.config_context(enable_metadata_routing=True):
        for cls in (ours, theirs):
            est = cls(random_state=0).set_fit_request(sample_weight=True)
            search = GridSearchCV(est.set_score_request(sample_weight=False),
                                  {"alpha": [1e-4, 1e-3]}, cv=3)
            best.append(search.fit(X, y, sample_weight=weights).best_score_)
    assert best[0] == pytest.approx(best[1], rel=1e-9, abs=1e-12), best


def test_n_jobs_reads_as_scikit_learns():
    """A positive count is the threads; None and negative counts as joblib
    reads them, a ``parallel_config`` included."""
    from joblib import cpu_count, parallel_config

    from monsoon.sklearn.estimators import _jobs
    assert _jobs(HogwildClassifier(n_jobs=3)) == 3 and _jobs(HogwildClassifier()) == 1
    assert _jobs(HogwildRegressor(n_jobs=-1)) == cpu_count()
    with parallel_config(n_jobs=2):
        assert _jobs(HogwildClassifier()) == 2


def test_n_jobs_0_does_what_sgdclassifier_does():
    """scikit-learn fits two classes without joblib, so n_jobs=0 fits them
    (on one thread here); its one-vs-rest fit hands 0 to joblib, which
    refuses it. Ours raised joblib's ValueError on every fit."""
    X, y = make_classification(400, 6, random_state=0)
    ours = HogwildClassifier(n_jobs=0, random_state=0).fit(X, y)
    theirs = SGDClassifier(n_jobs=0, random_state=0).fit(X, y)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ours.intercept_, theirs.intercept_, rtol=1e-9, atol=1e-9)
    y3 = np.arange(len(y)) % 3
    refusals = []
    for cls in (HogwildClassifier, SGDClassifier):
        with pytest.raises(ValueError) as exc:
            cls(n_jobs=0, random_state=0).fit(X, y3)
        refusals.append(str(exc.value))
    assert refusals[0] == refusals[1], refusals
    rng = np.random.default_rng(0)
    Xr = rng.standard_normal((300, 4))
    yr = Xr @ np.arange(1.0, 5.0)
    np.testing.assert_allclose(HogwildRegressor(n_jobs=0, random_state=3).fit(Xr, yr).coef_,
                               SGDRegressor(random_state=3).fit(Xr, yr).coef_,
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("params", [dict(), dict(loss="log_loss", penalty="elasticnet"),
                                    dict(average=True), dict(learning_rate="adaptive", eta0=0.1),
                                    dict(penalty="l1", class_weight="balanced"),
                                    dict(early_stopping=True, validation_fraction=0.2)])
def test_one_thread_is_sklearns_update_sequence(params, sparse, shuffle):
    """One thread visits the rows in scikit-learn's order (its shuffle, from
    the same seed) and makes its updates: the fit is scikit-learn's to
    rounding, shuffled or not."""
    X, y = make_classification(800, 15, weights=[0.7], random_state=1)
    X = sp.csr_matrix(X) if sparse else X
    ours = HogwildClassifier(shuffle=shuffle, random_state=0, **params).fit(X, y)
    theirs = SGDClassifier(shuffle=shuffle, random_state=0, **params).fit(X, y)
    assert ours.n_iter_ == theirs.n_iter_
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ours.intercept_, theirs.intercept_, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("loss", ["squared_error", "huber", "epsilon_insensitive",
                                  "squared_epsilon_insensitive"])
def test_regressor_one_thread_is_sklearns(loss):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 8))
    y = X @ np.arange(1.0, 9.0) + 0.1 * rng.standard_normal(600)
    ours = HogwildRegressor(loss=loss, random_state=3).fit(X, y)
    theirs = SGDRegressor(loss=loss, random_state=3).fit(X, y)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("ours, theirs", [(HogwildRegressor, SGDRegressor),
                                           (HogwildClassifier, SGDClassifier)])
def test_a_random_state_instance_goes_on_as_scikit_learns(ours, theirs):
    """A RandomState instance is drawn from by every fit: the regressor took
    only the epochs' seed, not the draw scikit-learn's ``make_dataset``
    takes after it, so from the second ``partial_fit`` on its seeds, and
    its model, were another's (0.18 apart in a coefficient)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 8))
    y = X @ np.arange(1.0, 9.0) + 0.1 * rng.standard_normal(600)
    extra = {}
    if ours is HogwildClassifier:
        y, extra = (y > 0).astype(int), {"classes": [0, 1]}
    mine = ours(random_state=np.random.RandomState(0), n_jobs=1)
    reference = theirs(random_state=np.random.RandomState(0))
    for _ in range(4):
        mine.partial_fit(X, y, **extra)
        reference.partial_fit(X, y, **extra)
    np.testing.assert_allclose(mine.coef_, reference.coef_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(mine.intercept_, reference.intercept_, rtol=1e-9, atol=1e-9)


def test_a_value_it_cannot_honour_is_refused():
    X, y = make_classification(100, 5, random_state=0)
    with pytest.raises(ValueError, match="learning_rate"):
        HogwildClassifier(learning_rate="pa1").fit(X, y)
    with pytest.raises(TypeError, match="beta"):
        HogwildClassifier(beta=0.9)


def test_fit_reads_csr_in_place(text_data):
    """No copy of the data: the fit leaves X's arrays as they were, unsorted
    indices included, and gives the same model as on the sorted copy."""
    X_train, _, y_train, _ = text_data
    X = X_train.copy()
    perm = np.random.default_rng(0).permutation  # unsort each row's indices
    for i in range(X.shape[0]):
        s = slice(X.indptr[i], X.indptr[i + 1])
        p = perm(s.stop - s.start)
        X.indices[s], X.data[s] = X.indices[s][p], X.data[s][p]
    X.has_sorted_indices = False
    before = X.indices.copy()
    a = HogwildClassifier(loss="log_loss", shuffle=False, max_iter=3, tol=None).fit(X, y_train)
    b = HogwildClassifier(loss="log_loss", shuffle=False, max_iter=3, tol=None).fit(
        X_train, y_train)
    assert np.array_equal(X.indices, before)
    np.testing.assert_allclose(a.coef_, b.coef_, atol=1e-9)


def test_pipeline_with_grid_search_on_sparse_text(text_data):
    X_train, X_test, y_train, y_test = text_data
    pipe = Pipeline([("scale", StandardScaler(with_mean=False)),
                     ("clf", HogwildClassifier(n_jobs=2, max_iter=5, random_state=0))])
    search = GridSearchCV(pipe, {"clf__alpha": [1e-5, 1e-3], "clf__loss": ["log_loss", "hinge"]},
                          cv=3)
    search.fit(X_train, y_train)
    assert set(search.best_params_) == {"clf__alpha", "clf__loss"}
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
    clf = HogwildClassifier(loss="log_loss", n_jobs=2, random_state=0).fit(X_train, y_train)
    assert clf.coef_.shape == (10, 64) and list(clf.classes_) == list(range(10))
    assert clf.score(X_test, y_test) > 0.9
    assert clf.predict_proba(X_test).shape == (len(X_test), 10)


def test_layout_is_set_by_every_fit_one_vs_rest_too():
    """``layout_`` was set only by a fit of one problem: missing after a
    multi-class fit or partial_fit, and a binary fit's after a multi-class
    refit. One-vs-rest shares the classes out, each on one thread."""
    X, y = make_classification(600, 8, n_classes=3, n_informative=4, random_state=0)
    clf = HogwildClassifier(n_jobs=2, random_state=0)
    assert clf.fit(X, y == 0).layout_ in ("one", "threads")
    assert clf.fit(X, y).layout_ == "one-vs-rest"
    assert clf.fit(X, y == 0).layout_ in ("one", "threads")
    fresh = HogwildClassifier(n_jobs=2, random_state=0).partial_fit(X, y, classes=[0, 1, 2])
    assert fresh.layout_ == "one-vs-rest"


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


@pytest.mark.parametrize("cls", [HogwildClassifier, HogwildRegressor])
def test_partial_fit_calls_go_on_with_one_layout_chooser(monkeypatch, cls):
    """Each ``partial_fit`` call made a new LayoutChooser and ran as a fit's
    epoch 0, on one thread: at ``n_jobs=2`` the threads never ran, however
    many calls (docs/sklearn.md advises ``n_jobs=2`` with ``partial_fit``).
    Now the calls go on with one chooser (its epochs, time and probes);
    ``fit`` and ``clone`` start it afresh, as they do the 'adagrad' sums."""
    from sklearn.base import clone

    from sklearn_data import power_law
    layouts, original = [], plain_sgd.run_epoch

    def spy(layout, *args, **kwargs):
        layouts.append(layout)
        return original(layout, *args, **kwargs)
    monkeypatch.setattr(plain_sgd, "run_epoch", spy)
    monkeypatch.setattr(plain_sgd, "PROBE_AFTER", 0.0)  # a probe once epoch 0 has run
    X, y = power_law(4000, 1000, 10)
    extra = dict(classes=[0, 1]) if cls is HogwildClassifier else {}
    est = cls(learning_rate="adagrad", eta0=1.0, alpha=1e-7, tol=None, n_jobs=2,
              random_state=0)
    for _ in range(3):
        est.partial_fit(X, y, **extra)
    assert layouts == ["one", "probe", est.layout_]
    layouts.clear()
    clone(est).partial_fit(X, y, **extra)
    est.set_params(max_iter=2).fit(X, y)
    assert layouts == ["one", "one", "probe"]


def test_two_threads_reach_one_threads_loss_on_power_law_features(monkeypatch):
    """Power-law features (some in most rows, written by both threads at
    nearly every example): the two threads' model, forced to run every epoch
    on the threads, is as good as one thread's.

    The threads' interleaving is the machine's, so one fit's loss varies with
    the load (up to 2% over one thread's on a busy machine). The test compares
    the mean over three seeds, with a bound above that noise and far below
    what a lost-update race costs (a thread overwriting the other's writes)."""
    from sklearn.metrics import log_loss
    p = rcv1_like(rows=20000, features=5000, nnz=30, exponent=1.4, noise=0.02)
    X, y = p.X, p.y.astype(int)
    monkeypatch.setattr(LayoutChooser, "next", lambda self: "threads" if self.threads else "one")
    ran = []
    original = plain_sgd.LayoutChooser.took
    monkeypatch.setattr(LayoutChooser, "took",
                        lambda self, layout, t, s: (ran.append(layout),
                                                    original(self, layout, t, s)))
    losses = {1: [], 2: []}
    for jobs in (1, 2):
        ran.clear()
        for seed in range(3):
            clf = HogwildClassifier(loss="log_loss", n_jobs=jobs, random_state=seed).fit(X, y)
            losses[jobs].append(log_loss(y, clf.predict_proba(X)[:, 1]))
    assert set(ran) == {"threads"}
    assert np.mean(losses[2]) <= np.mean(losses[1]) * 1.02, losses


def test_layout_chooser_probes_and_keeps_the_faster():
    long = plain_sgd.PROBE_AFTER  # an epoch that long: the first probe comes at once
    c = LayoutChooser(threads=True)
    ran = []
    for _ in range(2 * REPROBE + 2):
        layout = c.next()
        ran.append(layout)
        c.took(layout, {"one": 2e-6, "threads": 1e-6} if layout == "probe" else {layout: 1e-6},
               long)
    # warm-up on one thread, a probe, then the faster until the next probe
    assert ran[:3] == ["one", "probe", "threads"] and c.best == "threads"
    assert ran[2:REPROBE + 1] == ["threads"] * (REPROBE - 1)
    assert ran[REPROBE + 1] == "probe"
    c = LayoutChooser(threads=True)
    c.took(c.next(), {"one": 1e-6}, long)
    c.took(c.next(), {"one": 1.02e-6, "threads": 1e-6}, long)  # a tie within MARGIN
    assert c.best == "one" and c.next() == "one"
    assert LayoutChooser(threads=False).next() == "one"
    # short epochs: one thread until they add up to PROBE_AFTER, then the probe
    c, ran = LayoutChooser(threads=True), []
    for _ in range(8):
        layout = c.next()
        ran.append(layout)
        c.took(layout, {"one": 1e-6, "threads": 2e-6} if layout == "probe" else {layout: 1e-6},
               long / 4.5)
    assert ran == ["one"] * 5 + ["probe", "one", "one"]
    # threads clearly slower at a probe: the next waits twice as long as the
    # last did; a closer call brings the interval back to REPROBE
    c, probes = LayoutChooser(threads=True), []
    for epoch in range(1 + REPROBE * 14 + 1):
        layout = c.next()
        if layout == "probe":
            probes.append(epoch)
        close = len(probes) == 4
        threads = 1.2e-6 if close and layout == "probe" else 3e-6
        c.took(layout, {"one": 1e-6, "threads": threads} if layout == "probe" else {layout: 1e-6},
               long)
    assert probes == [1, 1 + 2 * REPROBE, 1 + 6 * REPROBE, 1 + 14 * REPROBE]
    assert c.interval == REPROBE and c.best == "one"


def test_a_probe_runs_half_an_epoch_alone_then_the_threads_until_judged_slower():
    """``run_epoch`` on a clock that advances by each part's examples at one
    thread's 100 ns or the threads' ``rate`` times that: a probe runs its
    first half on one thread, then the threads judged against it; where
    they stop early one thread runs the rest, and the threads' speed is
    their time over the examples they ran. Other layouts run whole."""
    def epoch(layout, n, rate, stop_at=None):
        ran, now = [], [0.0]

        def run_part(part, lo, hi, judge):
            ran.append((part, lo, hi, judge))
            reached = hi if part == "one" or stop_at is None else stop_at
            now[0] += (reached - lo) * 1e-7 * (rate if part == "threads" else 1.0)
            return reached
        per_example = run_epoch(layout, run_part, n, clock=lambda: now[0])
        return ran, per_example

    ran, per = epoch("probe", 16000, 0.5)
    assert ran == [("one", 0, 8000, 0.0), ("threads", 8000, 16000, pytest.approx(1e-7))]
    assert per == pytest.approx({"one": 1e-7, "threads": 0.5e-7})
    ran, per = epoch("probe", 16000, 3.0, stop_at=8500)
    assert ran[1:] == [("threads", 8000, 16000, pytest.approx(1e-7)), ("one", 8500, 16000, 0.0)]
    assert per == pytest.approx({"one": 1e-7, "threads": 3e-7})
    ran, per = epoch("threads", 16000, 3.0)
    assert ran == [("threads", 0, 16000, 0.0)] and per == pytest.approx({"threads": 3e-7})


def _log_epoch_parts(monkeypatch, judged=None) -> list:
    """Every part an epoch runs (``run_epoch``'s ``run_part``), as (layout,
    lo, hi, position reached), appended to the list returned; and to
    ``judged``, for each part on the threads, how many examples the judge
    counted (0: the helper was not in before the part ended)."""
    parts, original, counters = [], plain_sgd.run_epoch, []
    kernel_run = plain_sgd.K.sgd_run

    def sgd_run(*args):
        counters[:] = [args[15]]  # the claims and the judge's counter
        return kernel_run(*args)
    monkeypatch.setattr(plain_sgd.K, "sgd_run", sgd_run)

    def spy(layout, run_part, n, clock=time.perf_counter):
        def logged(part, lo, hi, judge):
            reached = run_part(part, lo, hi, judge)
            parts.append((part, lo, hi, reached))
            if part == "threads" and judged is not None:
                judged.append(int(counters[0][plain_sgd.K.K_DONE]))
            return reached
        return original(layout, logged, n, clock)
    monkeypatch.setattr(plain_sgd, "run_epoch", spy)
    return parts


def _examples_so_far(verbose_log: str) -> list[int]:
    """The step count ``T`` of each epoch's line in a verbose fit's log."""
    return [int(line.split("T: ")[1].split(",")[0]) for line in verbose_log.splitlines()
            if "T: " in line]


@pytest.mark.parametrize("slower", [True, False])
def test_judged_threads_stop_where_slower_and_every_example_runs_once(monkeypatch, capsys,
                                                                      slower):
    """The kernel's judge on real threads, every epoch a probe: with a bar
    no run can meet (any time is slower than 0x one thread's) the threads
    stop after their first chunks and one thread runs the rest of the
    epoch; with a bar no run can miss they run to its end. Either way each
    example runs exactly once an epoch (the verbose log's count of examples
    is epochs x rows) and the model is as good as scikit-learn's."""
    monkeypatch.setattr(LayoutChooser, "next", lambda self: "probe")
    bar = 0.0 if slower else 1e9
    monkeypatch.setattr(plain_sgd, "CLEARLY_SLOWER", bar)
    monkeypatch.setattr(plain_sgd, "SLOWER", bar)
    monkeypatch.setattr(plain_sgd, "JUDGE_SLACK", 0.0)
    judged = []
    parts = _log_epoch_parts(monkeypatch, judged)
    n = 400_000
    X, y = make_classification(n, 30, random_state=0)
    params = dict(loss="log_loss", max_iter=4, tol=None, random_state=0)
    clf = HogwildClassifier(n_jobs=2, verbose=1, **params).fit(X, y)
    counts = _examples_so_far(capsys.readouterr().out)
    assert counts == [n * e for e in range(1, 5)]
    threads = [part for part in parts if part[0] == "threads"]
    assert len(threads) == 4  # every epoch a probe
    # the helper wakes within ~0.1-0.4 ms on a quiet machine, the half takes
    # ~10 ms (80,000 rows took 2 ms: under a neighbour's load, no helper came
    # in before its end): judged at least once
    assert any(judged), judged
    for (part, lo, hi, reached), counted in zip(threads, judged):
        assert (lo, hi) == (n // 2, n)
        if slower and counted:  # stopped at the first judged chunk
            assert lo < reached < hi, reached
            assert ("one", reached, hi, hi) in parts
        else:  # never judged slower (or the helper was not in before the end)
            assert reached == hi
    sk = SGDClassifier(**params).fit(X, y)
    assert clf.score(X, y) > sk.score(X, y) - 0.02


def test_the_judges_bar_falls_from_clearly_to_somewhat_slower():
    """``kernel.judged_slower`` on plain numbers (ns): far slower is judged
    at once, beyond the slack; somewhat slower only after a while; at 1.05x
    never; from JUDGE_LONG on, anything beyond SLOWER."""
    K = plain_sgd.K
    cfg = np.zeros(K.N_CFG)
    cfg[[K.C_JUDGE_SLACK_NS, K.C_JUDGE_LONG_NS, K.C_JUDGE_CLEARLY, K.C_JUDGE_SLOWER]] = [
        50e3, 2e6, 1.5, 1.1]

    def slower(elapsed_us, ratio):
        return bool(K.judged_slower(elapsed_us * 1e3, elapsed_us * 1e3 / ratio, cfg))
    assert not slower(40, 100.0)          # within the slack, however slow
    assert slower(60, 10.0) and not slower(120, 2.0) and slower(250, 2.0)
    assert not slower(200, 1.68) and slower(500, 1.68)   # was ~2 ms under a fixed 1.5x bar
    assert not slower(1000, 1.25) and slower(1900, 1.25)
    assert slower(2000, 1.15) and not slower(2000, 1.05)
    assert not any(slower(t, 1.05) for t in (10, 100, 1000, 1999, 5000))


def test_the_judge_starts_its_clock_once_every_thread_is_in(monkeypatch, capsys):
    """A helper the OS has not woken yet (here: never handed its share)
    leaves the fit's own thread running at full speed; that time must not
    count against the threads. With a bar no judged run can meet, the lone
    thread still runs every probe's second half to its end, and each
    example runs exactly once an epoch."""
    from monsoon.sklearn.helper_threads import HelperThreads

    monkeypatch.setattr(LayoutChooser, "next", lambda self: "probe")
    for name in ("CLEARLY_SLOWER", "SLOWER", "JUDGE_SLACK"):
        monkeypatch.setattr(plain_sgd, name, 0.0)
    monkeypatch.setattr(HelperThreads, "start", lambda self, calls: None)
    parts = _log_epoch_parts(monkeypatch)
    X, y = make_classification(4000, 10, random_state=0)
    HogwildClassifier(n_jobs=2, verbose=1, loss="log_loss", max_iter=3, tol=None,
                      random_state=0).fit(X, y)
    counts = _examples_so_far(capsys.readouterr().out)
    assert counts == [4000 * e for e in range(1, 4)]
    assert [p for p in parts if p[0] == "threads"] == [("threads", 2000, 4000, 4000)] * 3


def test_helper_threads_start_at_the_first_probe_only(monkeypatch):
    """A fit too short to probe, on fewer rows than a shared log-loss needs,
    starts no other thread; one that probes starts its helpers once, at the
    first probe, and ends them."""
    from monsoon.sklearn import helper_threads

    made, closed = [], []
    init, close = helper_threads.HelperThreads.__init__, helper_threads.HelperThreads.close
    monkeypatch.setattr(helper_threads.HelperThreads, "__init__",
                        lambda self, n: (made.append(n), init(self, n))[1])
    monkeypatch.setattr(helper_threads.HelperThreads, "close",
                        lambda self: (closed.append(1), close(self))[1])
    X, y = make_classification(2000, 10, random_state=0)
    params = dict(loss="log_loss", max_iter=3, tol=None, random_state=0)
    HogwildClassifier(n_jobs=2, **params).fit(X, y)  # ~1 ms of epochs: no probe
    assert made == [] and closed == []
    monkeypatch.setattr(plain_sgd, "PROBE_AFTER", 0.0)  # a probe at epoch 1, again at 1 + 16
    HogwildClassifier(n_jobs=2, **dict(params, max_iter=20)).fit(X, y)
    assert made == [1] and closed == [1]


def _helpers_never_late(monkeypatch):
    """The fit's thread waits for a helper to take the log-loss it offered
    (it takes it back where the helper has not started, as on a busy core:
    ``test_a_claimable_runs_once_where_first_claimed``)."""
    from monsoon.sklearn.helper_threads import Claimable
    result = Claimable.result
    monkeypatch.setattr(Claimable, "result",
                        lambda self: (self._ran.wait(10), result(self))[1])


@pytest.mark.parametrize("params", [
    dict(),  # tol=1e-3: stops by the rule, after epochs judged late
    dict(n_iter_no_change=2, tol=1e-2),
    dict(n_iter_no_change=1),  # every verdict may stop: none is judged late
    dict(learning_rate="adaptive", eta0=0.5, tol=1e-2, max_iter=40),  # eta / 5, no stop
    dict(tol=None, max_iter=8),
    dict(penalty="elasticnet", average=10),
])
def test_the_log_loss_a_helper_sums_gives_one_threads_fit(monkeypatch, params):
    """On one thread with a helper (no probe), an epoch whose verdict cannot
    stop the fit is judged an epoch late, its log-loss summed by the helper
    while the next epoch runs: the fit is ``n_jobs=1``'s to the bit, with
    the same number of epochs."""
    import threading

    monkeypatch.setattr(plain_sgd, "PROBE_AFTER", float("inf"))
    _helpers_never_late(monkeypatch)
    where, original = [], plain_sgd.log_loss_sum
    monkeypatch.setattr(plain_sgd, "log_loss_sum",
                        lambda m: (where.append(threading.get_ident()), original(m))[1])
    X, y = make_classification(plain_sgd.SHARE_LOSS_ROWS, 20, flip_y=0.1, random_state=0)
    params = dict(loss="log_loss", random_state=0, **params)
    fits = {}
    for jobs in (1, 2):
        where.clear()
        fits[jobs] = HogwildClassifier(n_jobs=jobs, **params).fit(X, y)
        helped = sum(ident != threading.get_ident() for ident in where)
        # each epoch's sum, but for a last one judged late (at max_iter: nothing to judge)
        assert fits[jobs].n_iter_ - (jobs > 1) <= len(where) <= fits[jobs].n_iter_
        if jobs == 1 or params.get("n_iter_no_change") == 1:
            assert helped == 0
        else:  # all but the epochs whose verdict could stop it (or cut eta)
            assert helped >= fits[jobs].n_iter_ // 2
    assert fits[2].n_iter_ == fits[1].n_iter_
    np.testing.assert_array_equal(fits[2].coef_, fits[1].coef_)
    np.testing.assert_array_equal(fits[2].intercept_, fits[1].intercept_)


def test_a_helpers_error_ends_the_fit(monkeypatch):
    """An error in the helper's sum reaches ``fit``; the helper is closed."""
    import threading

    from monsoon.sklearn import helper_threads

    main, closed = threading.get_ident(), []
    original, close = plain_sgd.log_loss_sum, helper_threads.HelperThreads.close

    def log_loss_sum(margins):
        if threading.get_ident() != main:
            raise FloatingPointError("in the helper")
        return original(margins)
    monkeypatch.setattr(plain_sgd, "log_loss_sum", log_loss_sum)
    monkeypatch.setattr(helper_threads.HelperThreads, "close",
                        lambda self: (closed.append(1), close(self))[1])
    monkeypatch.setattr(plain_sgd, "PROBE_AFTER", float("inf"))
    _helpers_never_late(monkeypatch)
    X, y = make_classification(plain_sgd.SHARE_LOSS_ROWS, 20, random_state=0)
    with pytest.raises(FloatingPointError, match="in the helper"):
        HogwildClassifier(loss="log_loss", n_jobs=2, random_state=0).fit(X, y)
    assert closed == [1]


def test_helper_threads_run_their_calls_and_report_errors():
    """``wait`` returns once every handed call has run, and re-raises a
    call's error; closed helpers exit."""
    import threading

    from monsoon.sklearn.helper_threads import HelperThreads

    helpers = HelperThreads(2)
    ran, lock = [], threading.Lock()

    def call(k):
        with lock:
            ran.append((k, threading.get_ident()))
    helpers.start([lambda: call(1), lambda: call(2)])
    helpers.wait()
    assert sorted(k for k, _ in ran) == [1, 2]
    assert threading.get_ident() not in {ident for _, ident in ran}

    def fail():
        raise ValueError("in a helper")
    helpers.start([fail, lambda: call(3)])
    with pytest.raises(ValueError, match="in a helper"):
        helpers.wait()
    assert (3, ran[-1][1]) == ran[-1]  # the other call ran all the same
    helpers.close()


def test_a_claimable_runs_once_where_first_claimed():
    """Offered to a free helper, the call runs there; to a busy one, the
    caller runs it itself and the helper skips it later; an error reaches
    ``result``. ``wait`` counts only the calls handed by ``start``."""
    import threading

    from monsoon.sklearn.helper_threads import Claimable, HelperThreads

    helpers, main = HelperThreads(1), threading.get_ident()
    runs = []

    def call():
        runs.append(threading.get_ident())
        return len(runs)
    free = Claimable(call)
    helpers.offer(free)
    assert free._ran.wait(10)
    assert free.result() == 1 and runs[-1] != main

    gate = threading.Event()
    helpers.start([lambda: gate.wait(10)])  # the helper is busy
    busy = Claimable(call)
    helpers.offer(busy)
    assert busy.result() == 2 and runs[-1] == main
    gate.set()
    helpers.wait()  # the blocker only
    probe = Claimable(lambda: None)
    helpers.offer(probe)  # queued behind ``busy``: the helper has passed it by then
    assert probe._ran.wait(10) and len(runs) == 2

    def fail():
        raise KeyError("in the call")
    failing = Claimable(fail)
    helpers.offer(failing)
    assert failing._ran.wait(10)
    with pytest.raises(KeyError, match="in the call"):
        failing.result()
    helpers.close()


def test_switching_layouts_between_epochs_keeps_the_model(monkeypatch):
    """Every epoch is a probe (half on one thread, half on the threads), and
    wscale is folded mid-epoch on both (alpha * eta = 5e-4: every ~41k
    steps, two epochs): the intercept, weights and scalars carry over, and
    the model is as good as scikit-learn's (mean over 6 seeds; one seed's
    score spreads by ~0.015)."""
    X, y = make_classification(20000, 20, random_state=0)
    params = dict(alpha=1e-2, learning_rate="constant", eta0=0.05, max_iter=6, tol=None)
    monkeypatch.setattr(LayoutChooser, "next", lambda self: "probe")
    seen = []
    original = plain_sgd.LayoutChooser.took
    monkeypatch.setattr(LayoutChooser, "took",
                        lambda self, layout, t, s: (seen.append(sorted(t)),
                                                    original(self, layout, t, s)))
    fits = [HogwildClassifier(random_state=s, n_jobs=2, **params).fit(X, y) for s in range(6)]
    assert seen[0] == ["one", "threads"] and len(seen) == 36
    assert all(np.isfinite(f.coef_).all() for f in fits)
    ours = np.mean([f.score(X, y) for f in fits])
    sk = np.mean([SGDClassifier(random_state=s, **params).fit(X, y).score(X, y)
                  for s in range(6)])
    assert ours > sk - 0.03, (ours, sk)


def test_two_threads_fold_wscale_mid_epoch(monkeypatch):
    """alpha * eta = 0.005: wscale falls below 1e-9 every ~4,100 steps (5
    times an epoch), so the threads stop, the weights are folded, and they
    go on from the counter; the model is no worse than scikit-learn's (mean
    over 6 seeds: one seed's score spreads by 0.01 here, 0.03 for
    scikit-learn's)."""
    monkeypatch.setattr(LayoutChooser, "next", lambda self: "threads")
    X, y = make_classification(20000, 20, random_state=0)
    params = dict(alpha=0.1, learning_rate="constant", eta0=0.05, max_iter=3, tol=None)
    scores = {}
    for cls, extra in ((HogwildClassifier, dict(n_jobs=2)), (SGDClassifier, {})):
        fits = [cls(random_state=s, **params, **extra).fit(X, y) for s in range(6)]
        assert all(np.isfinite(f.coef_).all() for f in fits)
        scores[cls.__name__] = np.mean([f.score(X, y) for f in fits])
    assert scores["HogwildClassifier"] > scores["SGDClassifier"] - 0.04, scores


def test_regressor_fits_a_linear_model():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 10))
    y = X @ np.arange(1.0, 11.0) + 0.5 + 0.01 * rng.standard_normal(3000)
    reg = HogwildRegressor(learning_rate="constant", eta0=0.01, alpha=0.0, max_iter=10,
                           random_state=0, n_jobs=2).fit(X, y)
    np.testing.assert_allclose(reg.coef_, np.arange(1.0, 11.0), atol=0.05)
    assert reg.score(X, y) > 0.999


@pytest.mark.parametrize("jobs", [1, 2])
def test_weights_that_overflow_end_the_fit_as_scikit_learns_do(monkeypatch, jobs):
    """A step that writes inf into the weights (no intercept, so only the
    weights can show it) ends the fit with scikit-learn's error, on one
    thread and on the threads. Weights beyond 1e154, whose squares overflow
    but which are finite, go on as they do in scikit-learn (the kernel
    checks the sum of squares a step writes; ``plain_sgd`` then scans the
    whole vector)."""
    monkeypatch.setattr(LayoutChooser, "next", lambda self: "threads" if self.threads else "one")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 20))
    y = X @ rng.standard_normal(20)
    params = dict(learning_rate="constant", eta0=1e300, alpha=0.0, penalty=None,
                  fit_intercept=False, max_iter=5, tol=None)
    for cls, extra in ((SGDRegressor, {}), (HogwildRegressor, dict(n_jobs=jobs))):
        with pytest.raises(ValueError, match="under-/overflow occurred at epoch #1"):
            cls(**params, **extra).fit(X, y)
    big = np.full(20, 1e160)
    params = dict(max_iter=3, tol=None, shuffle=False, random_state=0)
    sk = SGDRegressor(**params).fit(X, y, coef_init=big)
    ours = HogwildRegressor(n_jobs=jobs, **params).fit(X, y, coef_init=big)
    assert np.isfinite(ours.coef_).all() and np.abs(ours.coef_).min() > 1e159
    if jobs == 1:
        np.testing.assert_allclose(ours.coef_, sk.coef_, rtol=1e-9)


def test_an_epochs_log_loss_from_its_margins_is_the_loops():
    """``log_loss_sum``, numpy's vectorised log-loss over the signed margins
    the kernel kept (-p where y = 1), is the sum of ``loss_value`` over the
    epoch's examples to rounding, on both sides of every branch of it,
    across blocks, and for margins far beyond exp's range (floored)."""
    from monsoon.sklearn import kernel as K
    from monsoon.sklearn.plain_sgd import log_loss_sum
    rng = np.random.default_rng(0)
    p = np.concatenate([np.linspace(-45, 45, 3601), [-37.0, 0.0, 18.0, 33.3],
                        [-1e5, -800.0, -745.5, -710.0, -101.0, 101.0, 710.0, 800.0, 1e5]])
    y = rng.integers(0, 2, len(p)).astype(float)
    order = rng.permutation(len(p))
    margins = np.where(y == 1, -p, p)[order]  # margins[k] is the example order[k]'s
    loop = sum(K.loss_value(K.LOG, 0.0, y[i], p[i]) for i in order)
    assert log_loss_sum(margins, block=1000) == pytest.approx(loop, rel=1e-12)


def _sklearn_shuffle(n, seed):
    """scikit-learn's ``SequentialDataset.shuffle`` and ``our_rand_r``,
    transcribed to plain Python: the reference for ``kernel.shuffle``."""
    ind = list(range(n))
    for i in range(n - 1):
        if seed == 0:
            seed = 1
        seed ^= (seed << 13) & 0xFFFFFFFF
        seed ^= seed >> 17
        seed ^= (seed << 5) & 0xFFFFFFFF
        j = i + (seed % (2 ** 31)) % (n - i)
        ind[i], ind[j] = ind[j], ind[i]
    return ind


@pytest.mark.parametrize("n, seed", [(10, 0), (1000, 1), (1000, 2 ** 31 - 2), (5, 123456)])
def test_the_epoch_shuffle_is_sklearns(n, seed):
    """``kernel.shuffle`` permutes as scikit-learn does, from the same seed,
    and again on the order it left (as scikit-learn's next epoch does)."""
    from monsoon.sklearn import kernel as K

    a = np.arange(n, dtype=np.int64)
    K.shuffle(a, seed)
    assert a.tolist() == _sklearn_shuffle(n, seed)
    K.shuffle(a, seed)
    once = _sklearn_shuffle(n, seed)
    assert a.tolist() == [once[k] for k in once]

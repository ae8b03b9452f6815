"""HogwildClassifier and HogwildRegressor: scikit-learn's SGDClassifier and
SGDRegressor, trained on ``n_jobs`` cores by Hogwild!.

They ARE those estimators (subclasses): the constructor, its parameters,
defaults and validation, ``fit``/``partial_fit``, ``class_weight``,
``sample_weight``, ``warm_start``, ``coef_init``, ``average``, the
early-stopping split and score, one-vs-rest, the fitted attributes are
scikit-learn's own. Only the inner loop differs: scikit-learn's
``_plain_sgd`` runs on one core; here ``plain_sgd`` runs the same loop
compiled, on ``n_jobs`` threads sharing the weights without locks (one
thread: scikit-learn's updates exactly, in scikit-learn's order).

Beyond two classes, the one-vs-rest problems are shared out over the
``n_jobs`` threads (as scikit-learn does), each fit by one thread;
with two classes (or one regression) the threads share one problem.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from numbers import Integral

import numpy as np
import scipy.sparse as sp
from joblib import effective_n_jobs
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.linear_model._base import SPARSE_INTERCEPT_DECAY
from sklearn.linear_model._stochastic_gradient import MAX_INT, _prepare_fit_binary
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import StrOptions

from . import kernel as K
from .plain_sgd import plain_sgd

LOSS_CODES = {"hinge": (K.HINGE, 1.0), "perceptron": (K.HINGE, 0.0),
              "squared_hinge": (K.SQUARED_HINGE, 1.0), "log_loss": (K.LOG, 0.0),
              "modified_huber": (K.MODIFIED_HUBER, 0.0), "squared_error": (K.SQUARED, 0.0),
              "huber": (K.HUBER, None), "epsilon_insensitive": (K.EPS_INSENSITIVE, None),
              "squared_epsilon_insensitive": (K.SQ_EPS_INSENSITIVE, None)}
LEARNING_RATES = {"constant": K.CONSTANT, "optimal": K.OPTIMAL, "invscaling": K.INVSCALING,
                  "adaptive": K.ADAPTIVE, "adagrad": K.ADAGRAD}
# scikit-learn's learning_rate values, and 'adagrad' (per-feature steps: ``kernel``)
_LR_CONSTRAINT = [StrOptions({"constant", "optimal", "invscaling", "adaptive", "pa1", "pa2",
                              "adagrad"})]


def _loss_code(est, loss):
    code, param = LOSS_CODES[loss]
    return code, float(est.epsilon) if param is None else param


def _learning_rate_code(learning_rate):
    if learning_rate not in LEARNING_RATES:
        raise ValueError(f"learning_rate={learning_rate!r} is not supported by the Hogwild! "
                         f"estimators; use one of {', '.join(LEARNING_RATES)}")
    return LEARNING_RATES[learning_rate]


def _jobs(est, one_vs_rest: bool = False):
    """Threads for a fit: a positive ``n_jobs`` as it is (without joblib's
    backend lookup); None and negative counts as joblib reads them. 0 is one
    thread for one problem (two classes, a regression), where scikit-learn
    fits without joblib; its one-vs-rest fit hands 0 to joblib, which refuses
    it, and so does ours."""
    if isinstance(est.n_jobs, Integral) and est.n_jobs > 0:
        return int(est.n_jobs)
    if est.n_jobs == 0 and not one_vs_rest:
        return 1
    return max(1, int(effective_n_jobs(est.n_jobs)))


def _run(est, X, y, sample_weight, coef, intercept, average_coef, average_intercept, loss,
         alpha, learning_rate, max_iter, validation_mask, validation_score_cb, seed, pos_weight,
         neg_weight, n_jobs, info=None, key=0):
    code, param = _loss_code(est, loss)
    return plain_sgd(
        coef, intercept, average_coef, average_intercept, code, param,
        est._get_penalty_type(est.penalty), alpha, est._get_l1_ratio(), X, y, sample_weight,
        SPARSE_INTERCEPT_DECAY if sp.issparse(X) else 1.0, validation_mask, est.early_stopping,
        validation_score_cb, int(est.n_iter_no_change), max_iter,
        est.tol if est.tol is not None else -np.inf, int(est.fit_intercept), int(est.verbose),
        int(est.shuffle), seed, pos_weight, neg_weight, _learning_rate_code(learning_rate),
        est.eta0, est.power_t, est.t_, est.average, n_jobs=n_jobs, info=info,
        carried=est.__dict__.setdefault("_carried", {}).setdefault(key, {}))


def _dataset_draw(random_state):
    """The draw scikit-learn's ``make_dataset`` takes from the fit's
    RandomState (its dataset's seed, unused here), taken where scikit-learn
    takes it: a RandomState instance shared by the fits then goes on as
    scikit-learn's, and so do the seeds drawn after it."""
    random_state.randint(1, np.iinfo(np.int32).max)


def fit_binary(est, i, X, y, alpha, learning_rate, max_iter, pos_weight, neg_weight,
               sample_weight, validation_mask=None, random_state=None, n_jobs=1, info=None):
    """scikit-learn's ``fit_binary`` (class i against the rest) on ``plain_sgd``."""
    y_i, coef, intercept, average_coef, average_intercept = _prepare_fit_binary(
        est, y, i, input_dtype=X.dtype, label_encode=est.loss == "log_loss")
    random_state = check_random_state(random_state)
    _dataset_draw(random_state)  # before the seed, as scikit-learn's fit_binary
    if validation_mask is None:
        validation_mask = est._make_validation_split(y_i, sample_mask=sample_weight > 0)
    validation_score_cb = est._make_validation_score_cb(
        validation_mask, X, y_i, sample_weight, classes=np.array([-1, 1], dtype=y_i.dtype))
    seed = random_state.randint(MAX_INT)
    coef, intercept, average_coef, average_intercept, n_iter = _run(
        est, X, y_i, sample_weight, coef, intercept, average_coef, average_intercept, est.loss,
        alpha, learning_rate, max_iter, validation_mask, validation_score_cb, seed, pos_weight,
        neg_weight, n_jobs, info, key=i)
    if est.average:
        est._average_intercept[0 if len(est.classes_) == 2 else i] = average_intercept
    return coef, intercept, n_iter


def _fit(base):
    """``base.fit``, under its parameters (scikit-learn's metadata routing
    reads them: ``set_fit_request``) and its docstring, starting what
    ``partial_fit`` calls carry on (the 'adagrad' sums, the layout chooser:
    ``plain_sgd``'s ``carried``) again unless ``warm_start``."""
    def fit(self, X, y, coef_init=None, intercept_init=None, sample_weight=None):
        if not self.warm_start:
            self._carried = {}
        return base.fit(self, X, y, coef_init=coef_init, intercept_init=intercept_init,
                        sample_weight=sample_weight)

    fit.__doc__ = base.fit.__doc__
    return fit


class _AdaGrad:
    """The 'adagrad' learning rate beside scikit-learn's: accepted by the
    parameter checks; its per-feature sums go on across ``partial_fit``
    calls and start again at each ``fit`` (unless ``warm_start``: ``_fit``)."""

    def _get_learning_rate_type(self, learning_rate):
        if learning_rate == "adagrad":
            return K.ADAGRAD
        return super()._get_learning_rate_type(learning_rate)


class HogwildClassifier(_AdaGrad, SGDClassifier):
    """``sklearn.linear_model.SGDClassifier`` fit by Hogwild! on ``n_jobs``
    threads: same parameters, same defaults, same model; and
    ``learning_rate="adagrad"``."""

    _parameter_constraints = {**SGDClassifier._parameter_constraints,
                              "learning_rate": _LR_CONSTRAINT}
    fit = _fit(SGDClassifier)

    def _fit_binary(self, X, y, alpha, sample_weight, learning_rate, max_iter):
        n_jobs, info = _jobs(self), {}
        coef, intercept, n_iter = fit_binary(
            self, 1, X, y, alpha, learning_rate, max_iter, self._expanded_class_weight[1],
            self._expanded_class_weight[0], sample_weight, random_state=self.random_state,
            n_jobs=n_jobs, info=info)
        self.layout_ = info["layout"]  # how the threads ran (plain_sgd.LayoutChooser)
        self.t_ += n_iter * X.shape[0]
        self.n_iter_ = n_iter
        if self.average > 0:
            if self.average <= self.t_ - 1:
                self.coef_ = self._average_coef.reshape(1, -1)
                self.intercept_ = self._average_intercept
            else:
                self.coef_ = self._standard_coef.reshape(1, -1)
                self._standard_intercept = np.atleast_1d(intercept)
                self.intercept_ = self._standard_intercept
        else:
            self.coef_ = coef.reshape(1, -1)
            self.intercept_ = np.atleast_1d(intercept)

    def _fit_multiclass(self, X, y, alpha, learning_rate, sample_weight, max_iter):
        validation_mask = self._make_validation_split(y, sample_mask=sample_weight > 0)
        seeds = check_random_state(self.random_state).randint(MAX_INT, size=len(self.classes_))

        def one(i):
            return fit_binary(self, i, X, y, alpha, learning_rate, max_iter,
                              self._expanded_class_weight[i], 1.0, sample_weight,
                              validation_mask=validation_mask, random_state=seeds[i], n_jobs=1)

        with ThreadPoolExecutor(min(_jobs(self, one_vs_rest=True), len(self.classes_))) as pool:
            result = list(pool.map(one, range(len(self.classes_))))
        self.layout_ = "one-vs-rest"  # the classes shared out, each fit on one thread
        n_iter = 0
        for i, (_, intercept, n_iter_i) in enumerate(result):
            self.intercept_[i] = intercept
            n_iter = max(n_iter, n_iter_i)
        self.t_ += n_iter * X.shape[0]
        self.n_iter_ = n_iter
        if self.average > 0:
            if self.average <= self.t_ - 1.0:
                self.coef_ = self._average_coef
                self.intercept_ = self._average_intercept
            else:
                self.coef_ = self._standard_coef
                self._standard_intercept = np.atleast_1d(self.intercept_)
                self.intercept_ = self._standard_intercept


class HogwildRegressor(_AdaGrad, SGDRegressor):
    """``sklearn.linear_model.SGDRegressor`` fit by Hogwild! on ``n_jobs``
    threads: same parameters (plus ``n_jobs``), same defaults, same model."""

    def __init__(self, loss="squared_error", *, penalty="l2", alpha=0.0001, l1_ratio=0.15,
                 fit_intercept=True, max_iter=1000, tol=1e-3, shuffle=True, verbose=0,
                 epsilon=0.1, random_state=None, learning_rate="invscaling", eta0=0.01,
                 power_t=0.25, early_stopping=False, validation_fraction=0.1,
                 n_iter_no_change=5, warm_start=False, average=False, n_jobs=None):
        super().__init__(loss=loss, penalty=penalty, alpha=alpha, l1_ratio=l1_ratio,
                         fit_intercept=fit_intercept, max_iter=max_iter, tol=tol,
                         shuffle=shuffle, verbose=verbose, epsilon=epsilon,
                         random_state=random_state, learning_rate=learning_rate, eta0=eta0,
                         power_t=power_t, early_stopping=early_stopping,
                         validation_fraction=validation_fraction,
                         n_iter_no_change=n_iter_no_change, warm_start=warm_start,
                         average=average)
        self.n_jobs = n_jobs

    _parameter_constraints = {**SGDRegressor._parameter_constraints, "n_jobs": [None, Integral],
                              "learning_rate": _LR_CONSTRAINT}
    fit = _fit(SGDRegressor)

    def _fit_regressor(self, X, y, alpha, loss, learning_rate, sample_weight, max_iter):
        if not hasattr(self, "t_"):
            self.t_ = 1.0
        validation_mask = self._make_validation_split(y, sample_mask=sample_weight > 0)
        validation_score_cb = self._make_validation_score_cb(validation_mask, X, y,
                                                             sample_weight)
        random_state = check_random_state(self.random_state)
        seed = random_state.randint(0, MAX_INT)
        _dataset_draw(random_state)  # after the seed, as scikit-learn's _fit_regressor
        if self.average:
            coef, intercept = self._standard_coef, self._standard_intercept
            average_coef, average_intercept = self._average_coef, self._average_intercept
        else:
            coef, intercept, average_coef, average_intercept = self.coef_, self.intercept_, \
                None, [0]
        n_jobs, info = _jobs(self), {}
        coef, intercept, average_coef, average_intercept, self.n_iter_ = _run(
            self, X, y, sample_weight, coef, intercept[0], average_coef, average_intercept[0],
            loss, alpha, learning_rate, max_iter, validation_mask, validation_score_cb, seed,
            1.0, 1.0, n_jobs, info)
        self.layout_ = info["layout"]  # how the threads ran (plain_sgd.LayoutChooser)
        self.t_ += self.n_iter_ * X.shape[0]
        if self.average > 0:
            self._average_intercept = np.atleast_1d(average_intercept)
            self._standard_intercept = np.atleast_1d(intercept)
            if self.average <= self.t_ - 1.0:
                self.coef_ = average_coef
                self.intercept_ = np.atleast_1d(average_intercept)
            else:
                self.coef_ = coef
                self.intercept_ = np.atleast_1d(intercept)
        else:
            self.intercept_ = np.atleast_1d(intercept)

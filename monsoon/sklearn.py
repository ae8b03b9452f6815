"""scikit-learn estimators trained by Hogwild! on all your cores.

``HogwildClassifier`` (logistic or hinge loss; one-vs-rest for more than two
classes) and ``HogwildRegressor`` (squared loss) fit linear models on dense
or sparse (CSR) input with monsoon's compiled lock-free per-example SGD:
``n_jobs`` threads share one weight vector (``n_jobs=1`` is serial SGD and
reproducible with ``random_state``). They follow scikit-learn's conventions
(``fit`` returns self, ``get_params``/``set_params``, ``clone``, input
validation, ``classes_``, ``n_features_in_``) and work in ``Pipeline`` and
``GridSearchCV``.

``alpha`` is scikit-learn's L2 weight (objective: mean loss + alpha/2 |w|^2),
applied as Hogwild!'s degree-split L2 so every update stays sparse.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .api import train
from .problems.sparse_linear import SparseLinear


class _HogwildLinear(BaseEstimator):
    _losses: tuple = ()

    def __init__(self, loss, alpha=1e-4, learning_rate="auto", beta=0.9, max_iter=5, n_jobs=1,
                 random_state=None):
        self.loss = loss
        self.alpha = alpha
        self.learning_rate = learning_rate
        self.beta = beta
        self.max_iter = max_iter
        self.n_jobs = n_jobs
        self.random_state = random_state

    def _check_params(self):
        if self.loss not in self._losses:
            raise ValueError(f"loss must be one of {', '.join(self._losses)}, got {self.loss!r}")
        if not self.alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if self.learning_rate != "auto" and not (isinstance(self.learning_rate, (int, float))
                                                 and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be 'auto' or > 0, got {self.learning_rate!r}")
        if not (isinstance(self.max_iter, (int, np.integer)) and self.max_iter >= 1):
            raise ValueError(f"max_iter must be an integer >= 1, got {self.max_iter}")
        if not (isinstance(self.n_jobs, (int, np.integer)) and self.n_jobs >= 1):
            raise ValueError(f"n_jobs must be an integer >= 1, got {self.n_jobs}")

    def _fit_binary(self, X, y, kind, start, epochs):
        """One linear model on labels ``y`` (0/1, or real for squared loss)."""
        n = X.shape[0]
        problem = SparseLinear(X, y, loss=kind, lam=self.alpha * n, dtype="float64", start=start)
        seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        workers = max(1, min(int(self.n_jobs), n))
        result = train(problem, "serial" if workers == 1 else "hogwild", workers,
                       epochs=epochs, lr=self._step(X, kind), seed=seed, evals=0,
                       hogwild_beta=self.beta,
                       batch_size=1, progress=False, raise_on_divergence=False)
        w = result.params
        if not np.isfinite(w).all():
            raise FloatingPointError("training diverged (non-finite weights); lower "
                                     "learning_rate or scale the input (StandardScaler)")
        return w[:-1], w[-1]

    def _step(self, X, kind) -> float:
        """The learning rate: as given, or "auto": per-example SGD is stable while
        lr |x|^2 stays below ~2 (squared loss; ~8 for logistic), so take a
        safe fraction of the largest squared row norm, capped."""
        if self.learning_rate != "auto":
            return float(self.learning_rate)
        largest = float(np.max(np.asarray(X.multiply(X).sum(axis=1)))) if X.shape[0] else 1.0
        cap, scale = (0.01, 0.5) if kind == "squared" else (0.25, 2.0)
        return min(cap, scale / max(largest, 1e-12))

    def _validate(self, X, y=None, reset=True, fitting=False):
        if fitting and y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y "
                             "is None")
        if not fitting:
            return validate_data(self, X, accept_sparse="csr", reset=False, dtype=np.float64)
        return validate_data(self, X, y, accept_sparse="csr", dtype=np.float64,
                             y_numeric=not isinstance(self, ClassifierMixin), reset=reset)

    def _scores(self, X):
        check_is_fitted(self, "coef_")
        X = self._validate(X)
        scores = np.asarray(X @ self.coef_.T + self.intercept_)
        return scores.ravel() if scores.ndim == 2 and scores.shape[1] == 1 else scores


class HogwildClassifier(ClassifierMixin, _HogwildLinear):
    """A linear classifier (logistic regression or linear SVM) fit by Hogwild!."""
    _losses = ("log_loss", "hinge")

    def __init__(self, loss="log_loss", alpha=1e-4, learning_rate="auto", beta=0.9, max_iter=5,
                 n_jobs=1, random_state=None):
        super().__init__(loss, alpha, learning_rate, beta, max_iter, n_jobs, random_state)

    @property
    def _kind(self):
        return "logistic" if self.loss == "log_loss" else "hinge"

    def fit(self, X, y):
        self._check_params()
        X, y = self._validate(X, y, fitting=True)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ValueError(f"the data has only one class ({self.classes_[0]!r}); a classifier "
                             "needs at least 2 classes")
        return self._train(X, y, start=None)

    def partial_fit(self, X, y, classes=None):
        """One more epoch over (X, y), starting from the current model."""
        self._check_params()
        first = not hasattr(self, "coef_")
        X, y = self._validate(X, y, reset=first, fitting=True)
        check_classification_targets(y)
        if first:
            if classes is None:
                raise ValueError("classes must be given to the first call of partial_fit")
            self.classes_ = np.unique(classes)
        elif not np.isin(y, self.classes_).all():
            raise ValueError("y has classes not seen in the first call of partial_fit")
        return self._train(X, y, start=None if first else (self.coef_, self.intercept_),
                           epochs=1)

    def _train(self, X, y, start, epochs=None):
        X = sp.csr_matrix(X)
        kind = "logistic" if self.loss == "log_loss" else "hinge"
        targets = [self.classes_[1]] if len(self.classes_) == 2 else list(self.classes_)
        coefs, intercepts = [], []
        for k, positive in enumerate(targets):  # one-vs-rest beyond two classes
            w0 = None if start is None else np.append(start[0][k], start[1][k])
            c, b = self._fit_binary(X, (y == positive).astype(float), kind, w0,
                                    epochs or self.max_iter)
            coefs.append(c)
            intercepts.append(b)
        self.coef_ = np.vstack(coefs)
        self.intercept_ = np.array(intercepts)
        self.n_iter_ = epochs or self.max_iter
        return self

    def decision_function(self, X):
        """Signed distance to the separating hyperplane (one column per class
        beyond two)."""
        return self._scores(X)

    def predict(self, X):
        scores = self.decision_function(X)
        if scores.ndim == 1:
            return self.classes_[(scores > 0).astype(int)]
        return self.classes_[np.argmax(scores, axis=1)]

    def predict_proba(self, X):
        if self.loss != "log_loss":
            raise AttributeError("predict_proba needs loss='log_loss'")
        scores = self.decision_function(X)
        p = 1.0 / (1.0 + np.exp(-scores))
        if p.ndim == 1:
            return np.column_stack([1 - p, p])
        return p / p.sum(axis=1, keepdims=True)  # one-vs-rest, normalised

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class HogwildRegressor(RegressorMixin, _HogwildLinear):
    """Least-squares linear regression fit by Hogwild!."""
    _losses = ("squared_error",)

    def __init__(self, loss="squared_error", alpha=1e-4, learning_rate="auto", beta=0.9,
                 max_iter=5, n_jobs=1, random_state=None):
        super().__init__(loss, alpha, learning_rate, beta, max_iter, n_jobs, random_state)

    def fit(self, X, y):
        self._check_params()
        X, y = self._validate(X, y, fitting=True)
        return self._train(X, y, None, self.max_iter)

    def partial_fit(self, X, y):
        self._check_params()
        first = not hasattr(self, "coef_")
        X, y = self._validate(X, y, reset=first, fitting=True)
        return self._train(X, y, None if first else np.append(self.coef_, self.intercept_), 1)

    def _train(self, X, y, start, epochs):
        coef, bias = self._fit_binary(sp.csr_matrix(X), np.asarray(y, dtype=float), "squared",
                                      start, epochs)
        self.coef_, self.intercept_, self.n_iter_ = coef, float(bias), epochs
        return self

    def predict(self, X):
        return np.asarray(self._scores(X)).ravel()

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

"""SparseLinear: linear models on sparse (CSR) data, the problems Hogwild!
was defined on (Niu et al. 2011: RCV1 text classification).

Parameters are one weight per feature, then the bias. With z = x.w + b:

    logistic:  l(z, y) = log(1 + exp(-s z)),  s = 2y - 1 (y in {0, 1})
    hinge:     l(z, y) = max(0, 1 - s z)               (a linear SVM)
    squared:   l(z, y) = (z - y)^2 / 2

The L2 term is split over examples by feature degree, as in the paper: an
example touching features u adds (lam / (2 d_u)) w_u^2 for each, with d_u the
number of examples in which u is non-zero. Summed over the data that is
lam/2 ||w||^2, but every example only touches its own coordinates, so
per-example updates stay sparse (no global scale factor that every thread
would write). The objective is therefore

    f(w) = mean_e l(x_e.w + b, y_e) + (lam / (2 n)) ||w_seen||^2

(w_seen: the weights of features that occur at least once; the others
never move).

and ``gradient`` returns its mini-batch estimate, which is unbiased.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .base import SharedDataProblem, check_finite

LOSSES = ("logistic", "hinge", "squared")


def column_moments(X) -> tuple[np.ndarray, np.ndarray]:
    """Each column's sum and sum of squares of a CSR matrix, in float64 (float32
    sums of squares would cancel in the variance)."""
    data = X.data.astype(np.float64)
    return (np.bincount(X.indices, data, minlength=X.shape[1]),
            np.bincount(X.indices, data * data, minlength=X.shape[1]))


def inverse_variance(total, total_sq, n: int) -> np.ndarray:
    """Per parameter (weights then bias): 1 / the unbiased variance of each
    feature over ``n`` rows, from its column sum and sum of squares; 0 for a
    feature that does not vary, 1 for the bias. What MLlib's
    ``standardization`` divides by, given to lbfgs as its H_0 scale."""
    total, total_sq = np.asarray(total, dtype=float), np.asarray(total_sq, dtype=float)
    var = np.maximum(total_sq - total * total / n, 0.0) / max(n - 1, 1)
    tiny = var <= 1e-12 * max(float(var.max(initial=0.0)), 1e-300)
    out = np.divide(1.0, var, out=np.zeros_like(var), where=~tiny)
    return np.append(out, 1.0)


class SparseLinear(SharedDataProblem):
    data_fields = ("X", "y")

    def __init__(self, X, y, loss: str = "logistic", lam: float = 1e-4, dtype="float64",
                 name: str = "sparse-linear", shuffle: bool = True, start=None):
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; choose one of: {', '.join(LOSSES)}")
        if not lam >= 0:
            raise ValueError(f"the L2 weight must be 0 or more, got {lam}")
        X = sp.csr_matrix(X, dtype=dtype)
        y = np.asarray(y, dtype=dtype).reshape(-1)
        check_finite("X", X.data, rows=X.indptr)
        check_finite("y", y)
        if X.shape[0] != len(y):
            raise ValueError(f"X has {X.shape[0]} rows but y has {len(y)} values: they must match")
        if shuffle:
            # Stored once in a random order (a file may be sorted by label or
            # time), so an epoch can read blocks of consecutive rows.
            perm = np.random.default_rng(20111).permutation(len(y))
            X, y = X[perm], y[perm]
        X.sort_indices()
        if loss in ("logistic", "hinge") and not np.isin(y, (0, 1)).all():
            raise ValueError(f"{loss} loss needs labels 0 and 1; map your labels first "
                             "(e.g. y = (y > 0))")
        self.X, self.y, self.kind, self.lam, self.name = X, y, loss, float(lam), name
        self.dtype = X.dtype
        self.n_examples, self.n_features = X.shape
        self.n_params = self.n_features + 1
        degree = np.bincount(X.indices, minlength=self.n_features).astype(self.dtype)
        self.inv_degree = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
        self._grad = np.zeros(self.n_params, dtype=self.dtype)
        self._kernel_ready = False
        # where training starts (weights then bias): a warm start, else zeros
        self.start = None if start is None else np.asarray(start, dtype=self.dtype).copy()

    # -- the compiled per-example path (Hogwild!, serial) ----------------------
    def sgd_pass(self, w, order, lr: float) -> float:
        """Per-example SGD over ``order`` in place on ``w`` (compiled, releases
        the GIL); returns the mean loss seen."""
        from .kernels import LOSS_CODES, sparse_sgd_pass

        order = np.ascontiguousarray(order, dtype=np.int64)
        total = sparse_sgd_pass(self.X.indptr, self.X.indices, self.X.data, self.y, w, order,
                                lr, self.lam, self.inv_degree, LOSS_CODES[self.kind])
        return total / max(len(order), 1)

    def prepare_kernel(self) -> None:
        if not self._kernel_ready:
            from .kernels import LOSS_CODES, warm_up

            warm_up(self.X, self.y, self.initial_params(0), self.inv_degree,
                    LOSS_CODES[self.kind])
            self._kernel_ready = True

    def initial_params(self, seed: int) -> np.ndarray:
        if self.start is not None:
            return self.start.copy()
        return np.zeros(self.n_params, dtype=self.dtype)

    def _dloss(self, z, y):
        """d l / d z per example, and the sum of the losses."""
        if self.kind == "squared":
            r = z - y
            return r, 0.5 * float(r @ r)
        s = 2.0 * y - 1.0
        sz = s * z
        if self.kind == "logistic":
            return -s * np.exp(-np.logaddexp(0.0, sz)), float(np.logaddexp(0.0, -sz).sum())
        active = sz < 1.0
        return np.where(active, -s, 0.0), float(np.maximum(0.0, 1.0 - sz).sum())

    def gradient(self, w, indices, out=None, accumulate=False):
        Xb = self.X[indices]
        d, total = self._dloss(Xb @ w[:-1] + w[-1], self.y[indices])
        m = len(indices)
        g = self._grad if out is None or accumulate else out
        g[:-1] = Xb.T @ d
        reg = 0.0
        if self.lam:
            # degree-split L2: each example adds lam w_u / d_u for its features u
            share = np.bincount(Xb.indices, minlength=self.n_features) * self.inv_degree
            g[:-1] += self.lam * w[:-1] * share
            reg = 0.5 * self.lam * float((w[:-1] ** 2) @ share)
        g[-1] = d.sum()
        g /= m
        if out is not None and accumulate:
            out += g
            return (total + reg) / m, out
        return (total + reg) / m, g

    def loss(self, w) -> float:
        # at diverged parameters the loss is inf or nan, which the run reports
        with np.errstate(over="ignore", invalid="ignore"):
            _, total = self._dloss(self.X @ w[:-1] + w[-1], self.y)
            seen = self.inv_degree > 0  # the split L2 covers the features that occur
            return total / self.n_examples + 0.5 * self.lam * float(
                w[:-1][seen] @ w[:-1][seen]) / self.n_examples

    def constant_loss(self) -> float | None:
        """The loss of the best constant prediction (``constant_loss``)."""
        y = self.y.astype(np.float64)  # float32 sums leave all-equal labels a variance
        return constant_loss(self.kind, len(y), float(y.sum()), float(np.sum(y * y)))

    def inverse_variance(self) -> np.ndarray:
        """1 / each feature's variance (then 1 for the bias): lbfgs's H_0."""
        return inverse_variance(*column_moments(self.X), self.n_examples)

    def predict_margin(self, w) -> np.ndarray:
        return self.X @ w[:-1] + w[-1]


def constant_loss(kind: str, n: int, y_sum: float, y_sq_sum: float) -> float | None:
    """The mean loss of the best constant prediction (weights 0, the bias
    alone) for labels with ``n`` rows, sum ``y_sum`` and sum of squares
    ``y_sq_sum``: logistic, the labels' entropy H(p) (the bias logit(p));
    hinge, 2 min(p, 1 - p) (the bias +-1); squared, half their variance.
    None where the labels are all one value (to rounding): that bar is 0,
    which logistic reaches only as the bias grows without bound and a run
    of the others ends a rounding or an L2 term above, so every run would
    read as worse than a constant."""
    mean = y_sum / max(n, 1)
    if kind == "squared":
        var = y_sq_sum / max(n, 1) - mean * mean
        return None if var <= 1e-9 * y_sq_sum / max(n, 1) else 0.5 * var
    if not 0.0 < mean < 1.0:
        return None
    if kind == "hinge":
        return 2.0 * min(mean, 1.0 - mean)
    return float(-sum(q * np.log(q) for q in (mean, 1.0 - mean)))


def rcv1_like(rows: int = 200_000, features: int = 47_236, nnz: int = 50,
              exponent: float = 1.1, noise: float = 0.05, seed: int = 0, dtype="float64",
              loss: str = "logistic", lam: float = 1e-4) -> SparseLinear:
    """Synthetic sparse text classification shaped like RCV1: each row has about
    ``nnz`` features drawn from a power-law popularity (rank^-exponent),
    tf-idf-like positive values normalised to unit length, and labels from a
    planted linear model with ``noise`` of them flipped."""
    rng = np.random.default_rng([seed, 1729])
    popularity = np.arange(1, features + 1, dtype=float) ** -exponent
    popularity /= popularity.sum()
    counts = np.clip(rng.poisson(nnz, rows), 1, features)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    cols = rng.choice(features, size=int(indptr[-1]), p=popularity)
    values = rng.exponential(1.0, size=len(cols))
    X = sp.csr_matrix((values, cols, indptr), shape=(rows, features))
    X.sum_duplicates()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = sp.diags(1.0 / np.maximum(norms, 1e-12)) @ X
    w_star = rng.standard_normal(features) * 3.0
    margin = X @ w_star
    y = (margin > np.median(margin)).astype(float)
    flip = rng.random(rows) < noise
    y[flip] = 1.0 - y[flip]
    return SparseLinear(X.tocsr(), y, loss=loss, lam=lam, dtype=dtype, name="rcv1-like")

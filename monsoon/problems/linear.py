"""DenseLinear: least squares or logistic regression in plain NumPy.

Parameters are the weights followed by the bias. The gradient of a batch is
two small matrix-vector products, so a step costs microseconds: the model
of choice for simulating thousands of workers, and a check that nothing in
monsoon depends on torch.

    squared:   loss = mean (x.w + b - y)^2 / 2
    logistic:  loss = mean log(1 + exp(-s (x.w + b))),  s = 2y - 1,  y in {0, 1}
"""
from __future__ import annotations

import numpy as np

from .base import SharedDataProblem

LOSSES = ("squared", "logistic")


class DenseLinear(SharedDataProblem):
    data_fields = ("X", "y")

    def __init__(self, X, y, loss: str = "squared", dtype="float64", name: str = "linear"):
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; choose one of: {', '.join(LOSSES)}")
        X = np.ascontiguousarray(X, dtype=dtype)
        y = np.ascontiguousarray(y, dtype=dtype).reshape(-1)
        if X.ndim != 2 or len(X) != len(y):
            raise ValueError(f"X has shape {X.shape} and y has {len(y)} values: X must be 2-D "
                             "with one row per value of y")
        self.X, self.y, self.kind, self.name = X, y, loss, name
        self.dtype = X.dtype
        self.n_examples, features = X.shape
        self.n_params = features + 1
        self._grad = np.zeros(self.n_params, dtype=self.dtype)

    def initial_params(self, seed: int) -> np.ndarray:
        return np.zeros(self.n_params, dtype=self.dtype)

    def _margin_grad(self, z, y):
        """d loss / d z per example, and the mean loss."""
        if self.kind == "squared":
            r = z - y
            return r, 0.5 * float(r @ r) / len(r)
        s = 2.0 * y - 1.0
        sz = s * z
        # log(1 + exp(-sz)) without overflow; its derivative -s * sigmoid(-sz)
        loss = float(np.mean(np.logaddexp(0.0, -sz)))
        return -s * np.exp(-np.logaddexp(0.0, sz)), loss  # -s sigmoid(-sz), stably

    def gradient(self, w, indices, out=None, accumulate=False):
        X, y = self.X[indices], self.y[indices]
        d, loss = self._margin_grad(X @ w[:-1] + w[-1], y)
        g = self._grad if out is None else out
        scale = 1.0 / len(indices)
        if accumulate:
            g[:-1] += (d @ X) * scale
            g[-1] += d.sum() * scale
        else:
            np.multiply(d @ X, scale, out=g[:-1])
            g[-1] = d.sum() * scale
        return loss, g

    def loss(self, w) -> float:
        # at diverged parameters the loss is inf or nan, which the run reports
        with np.errstate(over="ignore", invalid="ignore"):
            return self._margin_grad(self.X @ w[:-1] + w[-1], self.y)[1]


def synthetic(loss: str, n: int = 16384, features: int = 20, noise: float = 0.1, seed: int = 0,
              dtype="float64", name: str | None = None) -> DenseLinear:
    """A planted linear model: y = x.w* + noise (squared) or y ~ sigmoid(x.w*)."""
    rng = np.random.default_rng([seed, 4242])
    X = rng.standard_normal((n, features))
    w_star = rng.standard_normal(features) / np.sqrt(features)
    z = X @ w_star
    if loss == "squared":
        y = z + noise * rng.standard_normal(n)
    else:
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-4.0 * z))).astype(float)
    return DenseLinear(X, y, loss, dtype=dtype, name=name or ("linear" if loss == "squared"
                                                               else "logistic"))

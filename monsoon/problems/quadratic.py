"""Quadratic: a communication-bound toy with many parameters and a gradient
that costs two passes over them, for measuring what moving parameters costs.

Example i pulls w towards t + c_i u (t, u fixed random vectors, c_i a scalar):

    loss = mean_i ||w - t - c_i u||^2 / 2,    grad over a batch b = w - t - mean(c_b) u
"""
from __future__ import annotations

import numpy as np

from .base import Problem


class Quadratic(Problem):
    def __init__(self, n_params: int = 1_000_000, n_examples: int = 1024, dtype="float32",
                 seed: int = 0, name: str = "quadratic"):
        rng = np.random.default_rng([seed, 31337])
        self.name = name
        self.dtype = np.dtype(dtype)
        self.n_params, self.n_examples = int(n_params), int(n_examples)
        self.target = rng.standard_normal(self.n_params).astype(self.dtype)
        self.direction = rng.standard_normal(self.n_params).astype(self.dtype)
        self.offsets = rng.standard_normal(self.n_examples)
        self._grad = np.empty(self.n_params, dtype=self.dtype)
        self._scratch = None
        self._uu = float(self.direction.astype(np.float64) @ self.direction)

    def initial_params(self, seed: int) -> np.ndarray:
        return np.zeros(self.n_params, dtype=self.dtype)

    def gradient(self, w, indices, out=None, accumulate=False):
        c = self.offsets[indices]
        g = self._grad if out is None or accumulate else out
        np.subtract(w, self.target, out=g)
        g -= self._scaled_direction(float(c.mean()))
        # the batch's mean loss: the mean target's, plus the spread of the targets
        loss = 0.5 * float(g @ g) + 0.5 * float(c.var()) * self._uu
        if out is not None and accumulate:
            out += g
            return loss, out
        return loss, g

    def _scaled_direction(self, c: float) -> np.ndarray:
        if not hasattr(self, "_scratch") or self._scratch is None:
            self._scratch = np.empty_like(self.direction)
        return np.multiply(self.direction, c, out=self._scratch)

    def loss(self, w) -> float:
        d = (w - self.target).astype(np.float64)
        u = self.direction.astype(np.float64)
        c = self.offsets
        return float(0.5 * (d @ d) - (d @ u) * c.mean() + 0.5 * (c * c).mean() * (u @ u))

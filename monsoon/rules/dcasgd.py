"""DC-ASGD (Zheng et al., ICML 2017): delay-compensated asynchronous SGD.

The server keeps, per worker m, w_bak(m): the parameters last sent to m
(remembered at its read). On a push of g computed at w_bak(m):

    w <- w - lr * ( g + lambda * g * g * (w - w_bak(m)) )

a first-order Taylor correction of g towards the current w, with g*g as a
cheap stand-in for the Hessian's diagonal.

- ``dcasgd`` (DC-ASGD-c): constant lambda (MXNet's default 0.04).
- ``dcasgd-a`` (DC-ASGD-a): per coordinate M <- m M + (1 - m) g*g and
  lambda = lambda0 / sqrt(M + eps), m = 0.95, lambda0 = 2, eps = 1e-7
  (lambda0 stays fixed: re-dividing it every step is a known bug of one
  public version).
"""
from typing import NamedTuple

import numpy as np

from .. import arrays

from ..options import Option
from .base import EmptyState, Rule, Schedule


class DCReader(NamedTuple):
    params_at_read: np.ndarray   # w_bak, per worker


class DCAdaptiveState(NamedTuple):
    mean_sq: np.ndarray          # M


class DCASGD(Rule):
    name = "dcasgd"
    options = Rule.options + (
        Option("dc_lambda", float, None, "dcasgd: lambda (default 0.04); dcasgd-a: lambda0 "
               "(default 2)", check=lambda v: None if v >= 0 else "0 or more"),)

    @classmethod
    def from_options(cls, lr, dc_lambda=None, **common):
        own = {} if dc_lambda is None else {"lam": dc_lambda}
        return super().from_options(lr, **common, **own)

    def __init__(self, schedule: Schedule, lam: float = 0.04, **options):
        super().__init__(schedule, **options)
        self.lam = lam

    def init_reader(self, n, dtype, zeros=np.zeros):
        return DCReader(zeros(n, dtype=dtype))

    def on_read(self, w, state, reader):
        arrays.copyto(reader.params_at_read, w)

    def compensation(self, g, state) -> np.ndarray | float:
        """lambda, a scalar or per coordinate."""
        return self.lam

    def apply(self, w, g, state, info):
        lam = self.compensation(g, state)
        step = self.scratch(g)
        if info.reader is None:
            arrays.copyto(step, g)  # read just now: w - w_bak = 0
        else:
            arrays.namespace(w).subtract(w, info.reader.params_at_read, out=step)
            step *= g
            step *= g
            step *= lam
            step += g
        step *= self.learning_rate(info)
        w -= step

    def describe(self):
        return {**super().describe(), "lambda": self.lam}


class DCASGDAdaptive(DCASGD):
    name = "dcasgd-a"

    def __init__(self, schedule: Schedule, lam: float = 2.0, momentum: float = 0.95,
                 eps: float = 1e-7, **options):
        super().__init__(schedule, lam=lam, **options)
        self.momentum, self.eps = momentum, eps

    def init(self, n, dtype, zeros=np.zeros):
        return DCAdaptiveState(zeros(n, dtype=dtype))

    def compensation(self, g, state):
        xp = arrays.namespace(g)
        M = state.mean_sq
        lam = self.scratch2(g)
        xp.multiply(g, g, out=lam)
        lam *= 1 - self.momentum
        M *= self.momentum
        M += lam
        xp.add(M, self.eps, out=lam)
        xp.sqrt(lam, out=lam)
        xp.divide(self.lam, lam, out=lam)
        return lam

    def describe(self):
        return {**super().describe(), "m": self.momentum, "eps": self.eps}


__all__ = ["DCASGD", "DCASGDAdaptive", "EmptyState"]

"""A worker's private copy of a rule (local SGD's and EASGD's inner
optimizer): its own state, created on first use, and its own step count.
Momentum and Adam state therefore stay local, as the papers prescribe."""
from __future__ import annotations

import copy

from .. import arrays
from .base import UpdateInfo


class LocalRule:
    def __init__(self, rule, worker: int):
        self.rule = copy.deepcopy(rule)
        self.worker = worker
        self.state = None
        self.steps = 0

    def ensure_state(self, n: int, dtype, zeros=None) -> None:
        """The rule's state for ``n`` parameters, created if not yet."""
        if self.state is None:
            self.state = self.rule.init(n, dtype, **({} if zeros is None else {"zeros": zeros}))

    def apply(self, w, g) -> None:
        self.ensure_state(arrays.size(w), w.dtype, arrays.zeros_for(w))
        self.rule.apply(w, g, self.state, UpdateInfo(step=self.steps, worker=self.worker))
        self.steps += 1

"""Tail averaging of a server's parameters (Polyak and Juditsky 1992).

Late in an SGD run the iterate wanders around the minimum at the scale of
the step size: with reshuffled epochs, a mini-batch AdaGrad run on
click-like data ends each epoch lower than mid-epoch, and an async run's
loss moves up and down by a percent between two checks. The average of the
last iterates cancels that wander, and a run evaluated (``--target-loss``,
``--tol``) and returned at the average stops where the model is, not where
the iterate happened to be.

After each applied update carrying m examples:

    avg <- avg + a (w - avg),   a = m / min(H, max(m, seen / 2))

``seen`` the examples applied so far and H the horizon in examples: the
average over about the last half of the run while it is shorter than 2H
(so an early average does not lag behind the start), then an exponential
moving average over about the last H examples. Invariant: ``avg`` is a
convex combination of the iterates so far, and equals ``w`` after the
first update.
"""
from __future__ import annotations

import numpy as np


class TailAverage:
    def __init__(self, w, horizon_examples: float):
        if horizon_examples <= 0:
            raise ValueError(f"the averaging horizon must be > 0 examples, got {horizon_examples}")
        self.horizon = float(horizon_examples)
        self.params = np.array(w, copy=True)
        self.seen = 0

    def update(self, w, examples: int) -> None:
        """Take in the iterate ``w`` after an update of ``examples`` examples."""
        if examples <= 0:
            return
        self.seen += examples
        weight = examples / min(self.horizon, max(examples, self.seen / 2))
        self.params += min(1.0, weight) * (w - self.params)

"""Nesterov momentum, PyTorch's convention (``torch.optim.SGD(momentum=mu,
nesterov=True)``, dampening 0; Sutskever et al. 2013):

    v <- mu * v + g;   w <- w - lr_t * (g + mu * v)

DiLoCo's outer step is this rule with lr 0.7 and mu 0.9."""
from typing import NamedTuple

import numpy as np

from .base import Rule, Schedule


class NesterovState(NamedTuple):
    velocity: np.ndarray


class Nesterov(Rule):
    name = "nesterov"

    def __init__(self, schedule: Schedule, momentum: float = 0.9, **options):
        super().__init__(schedule, **options)
        self.momentum = momentum

    def init(self, n, dtype, zeros=np.zeros):
        return NesterovState(zeros(n, dtype=dtype))

    def apply(self, w, g, state, info):
        v = state.velocity
        v *= self.momentum
        v += g
        step = self.scratch(g)
        np.multiply(v, self.momentum, out=step)
        step += g
        step *= self.learning_rate(info)
        w -= step

    def describe(self):
        return {**super().describe(), "momentum": self.momentum}

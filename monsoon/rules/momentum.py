"""Heavy-ball momentum, PyTorch's convention (``torch.optim.SGD(momentum=mu)``,
dampening 0): v <- mu * v + g; w <- w - lr_t * v. The velocity ``v`` lives
with the parameters (on the server, in shared memory)."""
from typing import NamedTuple

import numpy as np

from .. import arrays

from ..options import Option
from .base import Rule, Schedule

MOMENTUM = Option("momentum", float, 0.9, "momentum coefficient",
                  check=lambda v: None if 0 <= v < 1 else "in [0, 1)")


class MomentumState(NamedTuple):
    velocity: np.ndarray


class Momentum(Rule):
    name = "momentum"
    options = Rule.options + (MOMENTUM,)

    def __init__(self, schedule: Schedule, momentum: float = 0.9, **options):
        super().__init__(schedule, **options)
        self.momentum = momentum

    def init(self, n, dtype, zeros=np.zeros):
        return MomentumState(zeros(n, dtype=dtype))

    def apply(self, w, g, state, info):
        v = state.velocity
        v *= self.momentum
        v += g
        step = self.scratch(g)
        arrays.namespace(w).multiply(v, self.learning_rate(info), out=step)
        w -= step

    def describe(self):
        return {**super().describe(), "momentum": self.momentum}

"""AdaGrad (Duchi, Hazan, Singer, JMLR 2011), PyTorch's convention
(``torch.optim.Adagrad``, lr_decay 0):

    s <- s + g * g;   w <- w - lr_t * g / (sqrt(s) + eps)

with s starting at ``initial_accumulator`` (0) and eps = 1e-10. Downpour's
parameter server applied this per coordinate (Dean et al. 2012), with a rate
about ten times the best fixed SGD rate."""
from typing import NamedTuple

import numpy as np

from .. import arrays

from .base import Rule, Schedule


class AdagradState(NamedTuple):
    sum_sq: np.ndarray


class Adagrad(Rule):
    name = "adagrad"
    summed_state = ("sum_sq",)  # one sum for every copy (``Rule.summed_state``)

    def __init__(self, schedule: Schedule, eps: float = 1e-10, initial_accumulator: float = 0.0,
                 **options):
        super().__init__(schedule, **options)
        self.eps = eps
        self.initial_accumulator = initial_accumulator

    def init(self, n, dtype, zeros=np.zeros):
        s = zeros(n, dtype=dtype)
        s += self.initial_accumulator
        return AdagradState(s)

    def apply(self, w, g, state, info):
        xp = arrays.namespace(w)
        s = state.sum_sq
        tmp = self.scratch(g)
        xp.multiply(g, g, out=tmp)
        s += tmp
        xp.sqrt(s, out=tmp)
        tmp += self.eps
        xp.divide(g, tmp, out=tmp)
        tmp *= self.learning_rate(info)
        w -= tmp

    def describe(self):
        return {**super().describe(), "eps": self.eps, "initial_accumulator": self.initial_accumulator}

"""Adam (Kingma & Ba, ICLR 2015), PyTorch's convention (``torch.optim.Adam``):

    m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
    w <- w - (lr_t / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

with t = step + 1, the server's (or shard's) update count."""
import math
from typing import NamedTuple

import numpy as np

from .. import arrays

from .base import Rule, Schedule


class AdamState(NamedTuple):
    mean: np.ndarray
    mean_sq: np.ndarray


class Adam(Rule):
    name = "adam"

    def __init__(self, schedule: Schedule, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8, **options):
        super().__init__(schedule, **options)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps

    def init(self, n, dtype, zeros=np.zeros):
        return AdamState(zeros(n, dtype=dtype), zeros(n, dtype=dtype))

    def apply(self, w, g, state, info):
        xp = arrays.namespace(w)
        b1, b2 = self.beta1, self.beta2
        m, v = state.mean, state.mean_sq
        t = info.step + 1
        m *= b1
        tmp = self.scratch(g)
        xp.multiply(g, 1 - b1, out=tmp)
        m += tmp
        v *= b2
        xp.multiply(g, g, out=tmp)
        tmp *= 1 - b2
        v += tmp
        xp.sqrt(v, out=tmp)
        tmp /= math.sqrt(1 - b2 ** t)
        tmp += self.eps
        step = self.scratch2(g)
        xp.divide(m, tmp, out=step)
        step *= self.learning_rate(info) / (1 - b1 ** t)
        w -= step

    def describe(self):
        return {**super().describe(), "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps}

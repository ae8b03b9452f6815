"""AdaRevision (McMahan & Streeter, NIPS 2014): delay-tolerant AdaGrad.

Per coordinate the server keeps the weight x, the sum of all gradients
applied gbar, and z, z' (z' the running max of z, so the rate never grows);
z and z' start at ``initial_accumulator`` (1, as in Petuum's implementation,
with alpha 0.1). At a read by worker m it remembers gbar_old(m) = gbar.
At the update with gradient g from m:

    g_bck = gbar - gbar_old(m)        # applied while g was in flight
    eta_old = alpha / sqrt(z')
    z  += g^2 + 2 g g_bck
    z'  = max(z', z)
    eta = alpha / sqrt(z')
    x  += -eta g + (eta_old - eta) g_bck     # revise the rate of g_bck's steps
    gbar += g

With no delay (g_bck = 0) it is AdaGrad with eps 0. The paper's claim: with
delays of 1000 updates or more it is significantly better than AdaGrad
applied to stale gradients.
"""
from typing import NamedTuple

import numpy as np

from .. import arrays

from .base import Rule, Schedule


class AdaRevisionState(NamedTuple):
    grad_sum: np.ndarray   # gbar
    z: np.ndarray
    z_max: np.ndarray      # z'


class AdaRevisionReader(NamedTuple):
    grad_sum_at_read: np.ndarray   # gbar_old, per worker


class AdaRevision(Rule):
    name = "adarevision"

    def __init__(self, schedule: Schedule, initial_accumulator: float = 1.0, **options):
        super().__init__(schedule, **options)
        self.initial_accumulator = initial_accumulator

    def init(self, n, dtype, zeros=np.zeros):
        z, z_max = zeros(n, dtype=dtype), zeros(n, dtype=dtype)
        z += self.initial_accumulator
        z_max += self.initial_accumulator
        return AdaRevisionState(zeros(n, dtype=dtype), z, z_max)

    def init_reader(self, n, dtype, zeros=np.zeros):
        return AdaRevisionReader(zeros(n, dtype=dtype))

    def on_read(self, w, state, reader):
        arrays.copyto(reader.grad_sum_at_read, state.grad_sum)

    def apply(self, w, g, state, info):
        xp = arrays.namespace(w)
        alpha = self.learning_rate(info)
        gbar, z, z_max = state
        back = self.scratch(g)
        if info.reader is None:
            back[...] = 0
        else:
            xp.subtract(gbar, info.reader.grad_sum_at_read, out=back)
        eta_old = self.scratch2(g)
        xp.sqrt(z_max, out=eta_old)
        xp.divide(alpha, eta_old, out=eta_old)
        # z += g^2 + 2 g g_bck  ==  z += g * (g + 2 g_bck)
        tmp = xp.multiply(back, 2.0)
        tmp += g
        tmp *= g
        z += tmp
        xp.maximum(z_max, z, out=z_max)
        eta = tmp
        xp.sqrt(z_max, out=eta)
        xp.divide(alpha, eta, out=eta)
        # x += -eta g + (eta_old - eta) g_bck
        eta_old -= eta
        eta_old *= back
        eta *= g
        w -= eta
        w += eta_old
        gbar += g

    def describe(self):
        return {**super().describe(), "initial_accumulator": self.initial_accumulator}

"""Plain SGD: w <- w - lr_t * g (Robbins & Monro 1951), with an optional
step-decay schedule lr_t = lr * gamma^floor(t / step_size)."""
import numpy as np

from .base import Rule


class SGD(Rule):
    name = "sgd"

    def apply(self, w, g, state, info):
        step = self.scratch(g)
        np.multiply(g, self.learning_rate(info), out=step)
        w -= step

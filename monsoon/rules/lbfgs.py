"""L-BFGS (Liu & Nocedal, Math. Programming 1989): a full-batch quasi-Newton
rule, what MLlib's ``LogisticRegression`` and scikit-learn's ``lbfgs``
solver run. Each step sees the full-data mean gradient g and loss f at w.

Direction (the two-loop recursion over the last ``lbfgs_memory`` pairs
s_i = w_{i+1} - w_i, y_i = g_{i+1} - g_i, kept only when s_i . y_i > 0):

    d = -H g,   H_0 = gamma * diag(m),   gamma = (s . y) / (y . diag(m) y)

where ``m`` is a per-coordinate metric the problem may give (``metric``:
1 / the variance of each feature, MLlib's ``standardization``; ones where
it gives none). The first step is ``-lr * diag(m) g / |g|_m``; the
quasi-Newton steps after it try t = 1 first.

Step length by backtracking (Armijo, c1 = 1e-4), spread over steps: the
rule moves to w + t d and the NEXT step's loss decides. If f(w + t d) >
f(w) + c1 t g . d, or is not finite, or the engine dropped that step's
gradient as non-finite (``on_dropped``), the rule moves back to
w + (t / 2) d, and so on; else it accepts, stores the pair and takes a new
direction. One gradient and loss per step, as sync gives. When the run
ends (``finish``) the last trial point, never judged, gives way to the last
accepted one, so a run's result is always an accepted point.

Invariants: it needs the step's loss (``UpdateInfo.loss``) and the whole
vector, so it runs where an engine applies the rule once per step to the
full batch (``full_batch``: sync, serial), never on a sharded server; a
step that does not lower the loss is never accepted.
"""
from typing import NamedTuple

import numpy as np

from ..errors import ConfigError
from ..options import Option, at_least
from .base import Rule, Schedule, UpdateInfo

C1 = 1e-4          # Armijo's sufficient-decrease constant
MAX_HALVINGS = 40  # then the memory is dropped and the step restarts along -g


class LbfgsState(NamedTuple):
    s: np.ndarray        # (memory, n): the pairs' steps, a ring
    y: np.ndarray        # (memory, n): the pairs' gradient changes
    base: np.ndarray     # the accepted point w the trial step left from
    base_grad: np.ndarray
    direction: np.ndarray
    scalars: np.ndarray  # [base loss, trial t, pairs kept, ring head, halvings, trial out]


class Lbfgs(Rule):
    name = "lbfgs"
    device_arrays = False  # its pairs and line search are NumPy (full-batch, host data)
    full_batch = True    # applied once per step to the whole vector, with the step's loss
    defaults = {"lr": 1.0, "epochs": 100}   # 100 full-batch steps: MLlib's maxIter
    options = Rule.options + (
        Option("lbfgs_memory", int, 10, "correction pairs kept", check=at_least(1)),)

    def __init__(self, schedule: Schedule, lbfgs_memory: int = 10, **options):
        super().__init__(schedule, **options)
        if lbfgs_memory < 1:
            raise ConfigError(f"--lbfgs-memory must be 1 or more, got {lbfgs_memory}")
        self.memory = int(lbfgs_memory)
        self.metric = None   # per-coordinate H_0 scale (``precondition``)

    def precondition(self, metric) -> None:
        """Use ``metric`` (one non-negative number per coordinate) as the
        diagonal of H_0; a 0 keeps that coordinate fixed."""
        metric = np.asarray(metric, dtype=float)
        if metric.ndim != 1 or not np.all(np.isfinite(metric)) or (metric < 0).any():
            raise ConfigError("lbfgs's metric must be one finite, non-negative number per "
                              "parameter")
        self.metric = metric

    def init(self, n, dtype, zeros=np.zeros):
        m = self.memory
        if self.metric is not None and len(self.metric) != n:
            raise ConfigError(f"lbfgs's metric has {len(self.metric)} numbers for {n} "
                              "parameters")
        return LbfgsState(zeros((m, n), dtype=dtype), zeros((m, n), dtype=dtype),
                          zeros(n, dtype=dtype), zeros(n, dtype=dtype), zeros(n, dtype=dtype),
                          zeros(6, dtype=np.float64))

    def apply(self, w, g, state, info):
        loss = info.loss
        if loss is None:
            raise ConfigError("lbfgs needs each step's full-batch loss: run it with "
                              "--strategy sync or serial on an engine that gives it")
        sc = state.scalars
        if sc[5]:   # a trial step is out: accept it, or back off
            t = sc[1]
            slope = float(state.base_grad @ state.direction)
            if not (np.isfinite(loss) and loss <= sc[0] + C1 * t * slope):
                self._back_off(w, state)
                return
            self._remember(w, g, state)
        self._new_direction(w, g, loss, state, info)

    def finish(self, w, state):
        """The last trial point was never judged: end on the accepted one."""
        sc = state.scalars
        if sc[5]:
            w[...] = state.base
            sc[4] = sc[5] = 0

    def on_dropped(self, w, state):
        """The trial point's gradient was not finite: back off as from a rise."""
        if state.scalars[5]:
            self._back_off(w, state)

    # -- the steps -------------------------------------------------------------
    def _back_off(self, w, state):
        sc = state.scalars
        sc[4] += 1
        if sc[4] > MAX_HALVINGS:   # no decrease along d: forget the curvature
            sc[2] = sc[3] = sc[4] = 0
            state.direction[...] = self._first_direction(state.base_grad)
            sc[1] = self.learning_rate(UpdateInfo())
        else:
            sc[1] /= 2
        np.multiply(state.direction, sc[1], out=w)
        w += state.base

    def _remember(self, w, g, state):
        sc = state.scalars
        s = w - state.base
        y = g - state.base_grad
        sy = float(s @ y)
        if sy > 0 and sy > 1e-12 * float(np.abs(y) @ np.abs(s)):  # curvature, not noise
            head = int(sc[3])
            state.s[head] = s
            state.y[head] = y
            sc[3] = (head + 1) % self.memory
            sc[2] = min(sc[2] + 1, self.memory)

    def _new_direction(self, w, g, loss, state, info):
        sc = state.scalars
        kept, head = int(sc[2]), int(sc[3])
        if kept == 0:
            d = self._first_direction(g)
        else:
            d = self._two_loop(g, state, kept, head)
        state.base[...] = w
        state.base_grad[...] = g
        state.direction[...] = d
        t = self.learning_rate(info) if kept == 0 else 1.0  # quasi-Newton: the unit step
        sc[:2] = (loss, t)
        sc[4], sc[5] = 0, 1
        w += t * d

    def _scaled(self, v):
        return v if self.metric is None else self.metric * v

    def _first_direction(self, g):
        mg = self._scaled(g)
        norm = float(np.sqrt(max(float(g @ mg), 0.0)))
        return -mg / norm if norm > 0 else np.zeros_like(g)

    def _two_loop(self, g, state, kept, head):
        order = [(head - 1 - i) % self.memory for i in range(kept)]  # newest first
        q = np.array(g, dtype=np.float64)
        alphas = []
        for i in order:
            s, y = state.s[i], state.y[i]
            a = float(s @ q) / float(s @ y)
            alphas.append(a)
            q -= a * y
        s, y = state.s[order[0]], state.y[order[0]]
        my = self._scaled(y)
        q = self._scaled(q) * (float(s @ y) / float(y @ my))
        for i, a in zip(reversed(order), reversed(alphas)):
            s, y = state.s[i], state.y[i]
            b = float(y @ q) / float(s @ y)
            q += (a - b) * s
        return -q.astype(g.dtype, copy=False)

    def describe(self):
        return {**super().describe(), "memory": self.memory,
                "preconditioned": self.metric is not None}

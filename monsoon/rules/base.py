"""The Rule protocol: update math on flat arrays, nothing else.

A rule is a small object with two methods, in the spirit of optax's
``init``/``update`` pairs:

- ``init(n, dtype, zeros=np.zeros) -> state``: a NamedTuple of flat arrays
  (each of length ``n``). ``zeros`` lets an engine place them in shared memory.
- ``apply(w, g, state, info)``: updates ``w`` (and ``state``) in place. ``g``
  is left untouched.

``info`` (an ``UpdateInfo``) carries what a schedule or a delay-aware rule
needs: the server's update count ``step``, the ``staleness`` of ``g``, and
``reader``: what the server remembered when the pushing worker read the
parameters (``None`` means the read was just now: no delay).

Delay-aware rules declare that per-worker memory with ``init_reader`` (a
NamedTuple of flat arrays, one set per worker, kept by the server) and fill
it in ``on_read(w, state, reader)``, which the engine calls at every read
(a Downpour fetch, a Hogwild! gradient). The worker never ships it back.

``staleness_lr`` (Zhang et al., IJCAI 2016) divides the learning rate by the
staleness tau when tau >= 1, for any rule.

Arrays are NumPy arrays in host memory or torch tensors on the problem's
device (``monsoon/arrays.py``): a rule's ``apply`` calls
``arrays.namespace(w)`` (``numpy`` or ``torch``, whose ``multiply``,
``divide``, ``sqrt``... take the same ``out=``), so each rule is written
once for both. A rule that needs NumPy (lbfgs) declares ``device_arrays =
False`` and is refused on a device before the run.

A rule never knows which engine or strategy called it; a sharded server
calls ``apply`` on slices ``w[a:b]``, ``g[a:b]``, ``slice_state(state, a, b)``,
which is exact because every rule here is per coordinate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import arrays
from ..options import Option, at_least, in_range


@dataclass(frozen=True)
class UpdateInfo:
    step: int = 0          # updates the server (or shard) applied before this one
    staleness: int = 0     # updates applied between the read and this update
    worker: int = 0
    reader: tuple | None = None  # the server's memory of this worker's read
    loss: float | None = None    # the step's mean loss, where the engine gives it (lbfgs)


class EmptyState(NamedTuple):
    pass


def slice_state(state: NamedTuple, start: int, stop: int) -> NamedTuple:
    return type(state)(*(a[start:stop] for a in state))


@dataclass(frozen=True)
class Schedule:
    """Learning rate at update ``step``: constant, or step decay
    ``lr * gamma ** floor(step / step_size)``."""

    lr: float
    kind: str = "constant"
    gamma: float = 0.1
    step_size: int = 1000

    def __call__(self, step: int) -> float:
        if self.kind == "constant":
            return self.lr
        return self.lr * self.gamma ** math.floor(step / self.step_size)


SCHEDULES = ("constant", "step")


class Rule:
    name = "rule"
    device_arrays = True  # apply runs on torch tensors too (see the module doc)
    # The step is w <- w - lr_t * g and nothing else (no state, no memory of
    # reads): a problem's compiled per-example loop (``sgd_pass``) may take
    # it in place of ``apply``. A subclass that changes the step sets False.
    plain_step = False
    # True: applied once a step to the whole vector with the step's loss
    # (L-BFGS), so only strategies whose steps are full batches take it.
    full_batch = False
    # State fields that are sums over every gradient the rule has applied
    # (AdaGrad's sum of squares). Where copies of the rule step for several
    # workers at once (Spark's delta pushes; local SGD's inner rule, whose
    # copies synchronise them each round: ``server/summed.py``), the copies
    # keep one such sum, each adding its increments to it: with a sum per
    # copy, each worker scales its gradients by its own statistics, and the
    # copies together descend sum_k D_k grad f_k, whose zero is not the
    # minimum of sum_k f_k.
    summed_state: tuple[str, ...] = ()
    staleness_lr = False  # set per rule by its option (``from_options``)
    # True: the rule needs each coordinate's metric (``precondition``; the
    # problem's ``inverse_variance``) before it starts, and a problem without
    # one is refused (AdaGrad's standardized rates; lbfgs takes it as H_0
    # where the problem has one, and runs without it)
    wants_metric = False
    # Options every rule takes; a rule with its own adds them to these.
    options = (
        Option("lr_schedule", str, "constant", "constant, or step: lr * gamma^floor(t / step size)",
               choices=SCHEDULES, label="lr schedule"),
        Option("lr_gamma", float, 0.1, "step schedule: decay factor", check=in_range(0, 1, low_open=True)),
        Option("lr_step_size", int, 1000, "step schedule: updates per decay (local-sgd, easgd: each worker's own "
               "local steps)", check=at_least(1)),
        Option("staleness_lr", bool, False, "divide the learning rate by each update's staleness "
               "(Zhang et al. 2016; async, hogwild, ssp: local-sgd and easgd refuse it)"),
    )

    @classmethod
    def from_options(cls, lr: float, lr_schedule="constant", lr_gamma=0.1, lr_step_size=1000,
                     staleness_lr=False, **own):
        """The rule at learning rate ``lr`` with its options' values."""
        return cls(Schedule(float(lr), lr_schedule, float(lr_gamma), int(lr_step_size)),
                   staleness_lr=staleness_lr, **own)

    def __init__(self, schedule: Schedule, staleness_lr: bool = False):
        self.schedule = schedule
        self.staleness_lr = staleness_lr
        self._scratch = None
        self._scratch2 = None

    def init(self, n: int, dtype, zeros=np.zeros) -> NamedTuple:
        return EmptyState()

    def init_reader(self, n: int, dtype, zeros=np.zeros) -> NamedTuple:
        """Per-worker memory the server keeps between a read and its update."""
        return EmptyState()

    def on_read(self, w: np.ndarray, state: NamedTuple, reader: NamedTuple) -> None:
        """Called when a worker reads ``w``; fills that worker's ``reader``."""

    def finish(self, w: np.ndarray, state: NamedTuple) -> None:
        """Called once when a run has spent its budget; a rule that left a
        trial point no step has judged (lbfgs) returns to its last accepted one."""

    def on_dropped(self, w: np.ndarray, state: NamedTuple) -> None:
        """Called when the engine drops a step's non-finite gradient instead
        of applying it; a rule that moved to a trial point (lbfgs) backs off."""

    def learning_rate(self, info: UpdateInfo) -> float:
        lr = self.schedule(info.step)
        if self.staleness_lr and info.staleness >= 1:
            lr /= info.staleness
        return lr

    def apply(self, w: np.ndarray, g: np.ndarray, state: NamedTuple, info: UpdateInfo) -> None:
        raise NotImplementedError(f"the rule {self.name!r} ({type(self).__name__}) does not "
                                  "define apply(w, g, state, info), which every rule must "
                                  "(docs/extending.md)")

    def scratch(self, like: np.ndarray) -> np.ndarray:
        """A per-rule work buffer shaped like ``like``, so the hot path does not
        allocate. Each worker owns its rule object (pickled or copied)."""
        self._scratch = _fitting(self._scratch, like)
        return self._scratch[:arrays.size(like)].reshape(like.shape)

    def scratch2(self, like: np.ndarray) -> np.ndarray:
        """A second work buffer, for rules that need two temporaries."""
        self._scratch2 = _fitting(self._scratch2, like)
        return self._scratch2[:arrays.size(like)].reshape(like.shape)

    def describe(self) -> dict:
        s = self.schedule
        out = {"rule": self.name, "lr": s.lr, "lr_schedule": s.kind,
               "staleness_lr": self.staleness_lr}
        if s.kind == "step":
            out.update(lr_gamma=s.gamma, lr_step_size=s.step_size)
        return out

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_scratch"] = None
        state["_scratch2"] = None
        return state


def _fitting(buf, like):
    """``buf`` if it can hold ``like`` (same kind, device and dtype, at least
    as long), else a new flat buffer that can."""
    if type(like) is np.ndarray:  # NumPy: as cheap as before tensors were possible
        if (type(buf) is not np.ndarray or buf.size < like.size
                or buf.dtype != like.dtype):
            buf = np.empty(like.size, dtype=like.dtype)
        return buf
    n = arrays.size(like)
    if arrays.is_tensor(like):
        if (buf is None or not arrays.is_tensor(buf) or buf.numel() < n
                or buf.dtype != like.dtype or buf.device != like.device):
            buf = like.new_empty(n)
        return buf
    if buf is None or arrays.is_tensor(buf) or buf.size < n or buf.dtype != like.dtype:
        buf = np.empty(n, dtype=like.dtype)
    return buf

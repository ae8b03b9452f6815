"""The Rule protocol: update math on flat arrays, nothing else.

A rule is a small object with two methods, in the spirit of optax's
``init``/``update`` pairs:

- ``init(n, dtype, zeros=np.zeros) -> state``: a NamedTuple of flat arrays
  (each of length ``n``). ``zeros`` lets an engine place them in shared memory.
- ``apply(w, g, state, info)``: updates ``w`` (and ``state``) in place. ``g``
  is left untouched.

``info`` (an ``UpdateInfo``) carries what a schedule or a delay-aware rule
needs: the server's update count ``step`` and the ``staleness`` of ``g``.
A rule never knows which engine or strategy called it; a sharded server
calls ``apply`` on slices ``w[a:b]``, ``g[a:b]``, ``slice_state(state, a, b)``,
which is exact because every rule here is per coordinate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True)
class UpdateInfo:
    step: int = 0          # updates the server (or shard) applied before this one
    staleness: int = 0     # updates applied between the read and this update
    worker: int = 0


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


class Rule:
    name = "rule"

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self._scratch = None

    def init(self, n: int, dtype, zeros=np.zeros) -> NamedTuple:
        return EmptyState()

    def apply(self, w: np.ndarray, g: np.ndarray, state: NamedTuple, info: UpdateInfo) -> None:
        raise NotImplementedError

    def scratch(self, like: np.ndarray) -> np.ndarray:
        """A per-rule work buffer shaped like ``like``, so the hot path does not
        allocate. Each worker owns its rule object (pickled or copied)."""
        if self._scratch is None or self._scratch.size < like.size or self._scratch.dtype != like.dtype:
            self._scratch = np.empty(like.size, dtype=like.dtype)
        return self._scratch[:like.size].reshape(like.shape)

    def describe(self) -> dict:
        s = self.schedule
        out = {"rule": self.name, "lr": s.lr, "lr_schedule": s.kind}
        if s.kind == "step":
            out.update(lr_gamma=s.gamma, lr_step_size=s.step_size)
        return out

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_scratch"] = None
        return state

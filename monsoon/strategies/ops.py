"""The steps a worker program yields; an engine carries each one out.

A strategy writes its worker loop ONCE, as a generator that yields these
ops. An engine interprets them: the local engine executes them at once on
shared memory, a simulator can schedule them in virtual time, a cluster
engine can turn them into remote calls. What an op returns is sent back
into the generator.

Every worker has its own *working parameters*: the array its gradients are
computed on. For ``shared`` strategies (Hogwild!, serial, sync on the local
engine) that array IS the server's parameters; otherwise it is a private copy
refreshed by ``Fetch``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class Gradient:
    """Compute the mean loss and gradient over ``indices`` at the worker's
    working parameters. Returns ``(loss, grad)``; ``grad`` belongs to the
    engine and is valid until the next ``Gradient``."""
    indices: np.ndarray


@dataclass(slots=True)
class Apply:
    """Apply the rule to the shared parameters in place, with no lock
    (Hogwild!; serial). A non-finite ``grad`` is dropped and counted."""
    grad: np.ndarray


@dataclass(slots=True)
class Fetch:
    """Copy the server's parameters into the working parameters. Returns a
    read ticket (the version of each shard at the read)."""


@dataclass(slots=True)
class Push:
    """Send ``grad`` to the server, which applies the rule shard by shard the
    moment it arrives, recording each shard's staleness against ``ticket``."""
    grad: np.ndarray
    ticket: object


@dataclass(slots=True)
class LocalStep:
    """``w_local -= lr * grad`` on the working parameters (Downpour's step
    between fetches)."""
    grad: np.ndarray
    lr: float


@dataclass(slots=True)
class AllReduce:
    """Synchronous update: contribute ``weight * grad`` to this step's sum;
    once every worker has, the rule is applied ONCE to the sum, and the op
    returns when the working parameters hold the result. ``grad=None``
    contributes nothing (an empty shard)."""
    grad: np.ndarray | None
    weight: float

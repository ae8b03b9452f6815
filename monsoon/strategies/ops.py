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
    working parameters, the gradient times ``weight``. Returns ``(loss,
    grad)``; ``grad`` belongs to the engine and is valid until the next
    ``Gradient``. ``next``: the indices of this worker's next gradient,
    where the strategy knows them, so a problem that loads its data (a torch
    Dataset) fetches them meanwhile. ``weight``: the batch's size over a
    full batch's (``batches.tail_weight``): below 1 only for an epoch's short
    last batch, so that every example of an epoch weighs the same, as
    tf.distribute's ``compute_average_loss`` divides by the global batch
    size. An engine applies it with ``weighted``."""
    indices: np.ndarray
    next: np.ndarray | None = None
    weight: float = 1.0


def weighted(grad, weight: float):
    """A ``Gradient``'s result: the mean gradient ``grad`` times its
    ``weight`` (a new array where that is not 1, so a problem's buffer is
    never scaled in place)."""
    return grad if weight == 1.0 else grad * weight


@dataclass(slots=True)
class Apply:
    """Apply the rule to the shared parameters in place, with no lock
    (Hogwild!; serial). A non-finite ``grad`` is dropped and counted.
    ``loss``: the batch's mean loss, for a rule that uses it (lbfgs)."""
    grad: np.ndarray
    loss: float | None = None


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
class Clock:
    """Stale Synchronous Parallel's clock tick (``strategies/ssp.py``): this
    worker has finished a clock (its pushes of that clock are applied before
    the tick is published). Returns once every live worker has finished
    clock c - ``bound`` - 1, c being the clock this worker starts next, with
    the number of clocks every live worker has finished (a lower bound on
    what the following ``Fetch`` holds). Workers that ended or died do not
    count. The wait has the run's timeout and is recorded per worker; so is
    every gradient's staleness in clocks: its clock minus the clocks every
    live worker had finished at the read its parameters came from."""
    bound: int


@dataclass(slots=True)
class LocalStep:
    """``w_local -= lr * grad`` on the working parameters (Downpour's step
    between fetches)."""
    grad: np.ndarray
    lr: float


@dataclass(slots=True)
class AllReduce:
    """Synchronous update: contribute ``grad``, the mean gradient over
    ``examples`` examples, to this step. Once the step's first N
    contributions are in (N = workers - backups), the rule is applied ONCE to
    their example-weighted mean, and the op returns when the working
    parameters hold the result. A contribution that comes after the first N
    is late: dropped and counted. Returns how many steps the others completed
    without this worker (0 unless it was late), which the worker skips.
    ``grad=None`` (an empty shard) contributes nothing. In an elastic run it
    may return a ``Regroup`` instead: the step's workers changed."""
    grad: np.ndarray | None
    examples: int


@dataclass(frozen=True, slots=True)
class Regroup:
    """What ``AllReduce`` returns in an elastic run (``sync --elastic``)
    when the workers sharing the step changed (one was lost, or one came
    back) before the step was applied: the step is not applied yet, and
    this worker computes its part of the SAME batch split among
    ``members`` (ranks, in order) and contributes again."""
    members: tuple


@dataclass(slots=True)
class Average:
    """Like ``AllReduce``, but the contribution is the worker's drift from the
    server, ``server - working`` (local SGD's pseudo-gradient), weighted by
    the ``examples`` behind it; the server's rule then applies the mean drift
    (sgd with lr 1 makes the server the average of the workers), and the
    working parameters are reset to the server's."""
    examples: int


@dataclass(slots=True)
class LocalApply:
    """Apply the strategy's local (inner) rule to the working parameters,
    with the worker's private rule state (local SGD, EASGD)."""
    grad: np.ndarray


@dataclass(slots=True)
class Elastic:
    """EASGD's exchange with the centre x~, per shard under its lock:
    d = alpha (x_i - x~);  x~ += d;  x_i -= d."""
    alpha: float


@dataclass(slots=True)
class SGDPass:
    """Per-example SGD over ``indices``, in place on the shared parameters,
    by the problem's compiled loop (no Python per example, no lock); the
    rule's learning rate times ``decay``. Each example is one update."""
    indices: np.ndarray
    decay: float

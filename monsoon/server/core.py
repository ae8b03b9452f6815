"""The parameter server's update, with no transport: Downpour's server side
(Dean et al., NIPS 2012) and the synchronous step's apply, written once for
every engine.

``ServerCore`` holds references to what one server (or one shard of it)
owns: the parameters (a whole vector or a shard's slice, a view into shared
memory or a device tensor: nothing here copies them), the rule and its
state, what the rule remembers of each worker's last read (``readers``,
``Rule.init_reader``), the version, the dropped count and the staleness
counts. An engine brings the rest: how a request arrives (a call, an actor,
a simulated event, a Spark job), its locks and its clock.

- ``read(worker, into)``: a worker reads the parameters now (into its
  working copy); the rule fills its reader (``on_read``). Returns the
  version it read.
- ``push(worker, grad, read_version)``: the rule applied to ``grad`` with
  staleness tau = version now - ``read_version`` (ALGORITHMS.md, Downpour),
  the worker's reader and the step's loss; the version moves on by one.
  ``push_delta``: a worker's own rule steps, as they are (``pushes_deltas``).
- ``apply_sum(acc, step)``: a synchronous step's summed gradient applied.
- ``admits(grad)``: a non-finite gradient is dropped, never applied.
- ``elastic(x, alpha)`` and ``add(d)``: EASGD's exchange with the centre
  (Zhang et al., NIPS 2015), plain or with the difference already made.
- ``shards(bounds)``: one core per shard, on views of this one's arrays.

``LocalUpdate`` is a worker's side of it: the inner rule's step on its
private copy (local SGD, EASGD: ``LocalApply`` ops), with the same drop;
its sums (``Rule.summed_state``) are shared with the server's (Spark's
delta pushes: ``start_from_sums``, ``add_sums_to``) or with the other
workers' each round (Local AdaAlter: ``summed.py``).

Invariants: not thread-safe (the engine calls it under its own lock, or from
one thread); ``version`` counts the updates applied (``push``, ``push_delta``,
``apply_sum``, ``elastic``, ``add``), so a dropped gradient does not move it;
a dropped gradient is counted in ``dropped`` and the rule is told
(``Rule.on_dropped``); ``UpdateInfo`` carries exactly the step, staleness,
worker, reader and loss each engine gave before, so its updates stay
bit-identical. An engine that keeps the version elsewhere (the local
engine's shared memory, its Hogwild! update count; a Ray shard's
synchronous steps, dropped ones included) sets ``version`` itself.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from .. import arrays
from ..rules import UpdateInfo, slice_state
from ..rules.local import LocalRule
from ..strategies.ops import Push
from .reduce import finite


def new_readers(rule, workers: int, size: int, dtype) -> list | None:
    """One reader per worker for ``rule`` on ``size`` parameters, or None
    when the rule remembers nothing of a read."""
    if not rule.init_reader(1, dtype)._fields:
        return None
    return [rule.init_reader(size, dtype) for _ in range(workers)]


def pushes_deltas(rule, strategy) -> bool:
    """Whether a pushing program's pushes are deltas (``push_delta``; Spark's
    async server, DeepDist, Neumann 2014: each partition's task trains a copy
    of the model on its rows, and the driver's descent adds the difference
    the task returns):

        task k:  x = w (read at launch);  for each of its n batches:
                     g = gradient(x, batch);  x <- rule_k(x, g)
                 push delta = w - x
        driver:  w <- w - delta

    rule_k is the run's rule (``--rule``, ``--lr``) with worker k's own
    state (momentum), kept on the driver between jobs and shipped with each
    (``LocalUpdate``), as local SGD's inner rule is: every gradient takes
    one rule step, as on the local engine. The rule's sums over gradients
    (``Rule.summed_state``: AdaGrad's sums of squares) are the server's, one
    for all workers: a task starts from them as they are at its launch, and
    the driver adds what its applied steps added. (With a sum per worker,
    each scales its gradients by its own statistics, and the run settles
    where sum_k D_k grad f_k = 0, above the loss's minimum.) Pushing the
    accrued sum of n gradients for one server step instead would make n
    gradients one step: AdaGrad's first step on a coordinate is lr in size
    whatever the gradient. With plain SGD the two are the same update.

    Deltas when the push period is more than one step and the rule needs
    nothing of the server at a push (no read record: dcasgd, adarevision;
    no ``--staleness-lr``); else gradients, with the server's rule."""
    if Push not in strategy.uses or (strategy.period_steps() or 1) <= 1:
        return False
    reader = rule.init_reader(1, np.float64)
    return not reader._fields and not rule.staleness_lr


class ServerCore:
    """One server's (or shard's) update; see the module docstring."""

    __slots__ = ("params", "rule", "state", "readers", "version", "dropped", "staleness")

    def __init__(self, params, rule, state=None, readers=None, version: int = 0,
                 staleness: Counter | None = None):
        self.params = params
        self.rule = rule
        self.state = rule.init(params.size, params.dtype) if state is None else state
        self.readers = readers  # indexed by worker; None: the rule keeps none
        self.version = version
        self.dropped = 0
        self.staleness = Counter() if staleness is None else staleness

    def read(self, worker: int, into=None) -> int:
        """``worker`` reads the parameters now (copied into ``into``, its
        working copy, where given): its reader remembers them."""
        if into is not None:
            arrays.copyto(into, self.params)
        if self.readers is not None:
            self.rule.on_read(self.params, self.state, self.readers[worker])
        return self.version

    def admits(self, grad) -> bool:
        """``grad`` is finite; else it is dropped (counted, and the rule told)."""
        if finite(grad):
            return True
        self.drop()
        return False

    def drop(self) -> None:
        """A non-finite gradient is not applied: counted, and the rule told."""
        self.dropped += 1
        self.tell_dropped()

    def tell_dropped(self, times: int = 1) -> None:
        """The rule told of ``times`` dropped gradients (``Rule.on_dropped``).
        Alone, without ``drop``'s count, where an engine counted them before
        they could travel (a Ray worker's push: its shards hear of it at the
        worker's next call)."""
        for _ in range(times):
            self.rule.on_dropped(self.params, self.state)

    def push(self, worker: int, grad, read_version: int, loss=None,
             checked: bool = False, count: bool = True) -> int | None:
        """Apply ``worker``'s ``grad``, computed on the parameters of version
        ``read_version``; its staleness, or None when it was dropped.
        ``checked``: the caller has already admitted it (a sharded push
        checks the whole gradient once). ``count``: the staleness is counted
        here; a sharded push's slices are not, its sender counts the push
        once, at the largest of its slices' staleness (one count an update)."""
        if not checked and not finite(grad):
            self.drop()
            return None
        version = self.version
        staleness = version - read_version
        readers = self.readers
        self.rule.apply(self.params, grad, self.state,
                        UpdateInfo(step=version, staleness=staleness, worker=worker,
                                   reader=None if readers is None else readers[worker],
                                   loss=loss))
        self.version = version + 1
        if count:
            self.staleness[staleness] += 1
        return staleness

    def push_delta(self, delta, read_version: int) -> int:
        """A worker's own rule steps since it read version ``read_version``,
        added as they are: params -= ``delta`` (DeepDist's descent: Spark's
        delta pushes, ``pushes_deltas``), counted at its staleness, which it
        returns. ``delta`` is finite (the worker sends none that is not)."""
        staleness = self.version - read_version
        self.params -= delta
        self.version += 1
        self.staleness[staleness] += 1
        return staleness

    def apply_sum(self, acc, step: int, worker: int = 0, loss=None, ok: bool | None = None,
                  counts: int = 0) -> bool:
        """A synchronous step: apply the summed gradient ``acc`` as update
        ``step`` (staleness 0), unless it is not finite (``ok``: already
        checked by the caller's reduction). ``counts``: the counts it adds at
        staleness 0 (1 where this core counts the step: one count an
        update, not one a contribution). Whether it was applied."""
        if not (finite(acc) if ok is None else ok):
            self.drop()
            return False
        self.rule.apply(self.params, acc, self.state,
                        UpdateInfo(step=step, worker=worker, loss=loss))
        self.version += 1
        if counts:
            self.staleness[0] += counts
        return True

    def elastic(self, x, alpha: float):
        """EASGD: d = alpha (x - centre), centre += d; returns d (the worker
        then takes x -= d). ``x`` is finite (the worker sends none that is
        not: ``elastic.py``), so the centre stays finite."""
        diff = arrays.namespace(x).subtract(x, self.params)
        diff *= alpha
        self.add(diff)
        return diff

    def add(self, d) -> None:
        """The centre moves by ``d`` (a compressed elastic difference, from
        a finite copy: ``elastic.py``)."""
        self.params += d
        self.version += 1

    def shards(self, bounds) -> list:
        """A core per shard [a, b): views of the parameters, state and readers,
        versions from 0, the staleness counted here (a push's once: ``push``)."""
        readers = self.readers
        return [ServerCore(self.params[a:b], self.rule, slice_state(self.state, a, b),
                           None if readers is None else [slice_state(r, a, b) for r in readers],
                           staleness=self.staleness) for a, b in bounds]

    def copy(self) -> tuple:
        """The parameters and the rule state, copied (for a checkpoint)."""
        return arrays.copy(self.params), type(self.state)(*(arrays.copy(a) for a in self.state))


class LocalUpdate:
    """A worker's inner rule (``strategy.local_rule``) on its private copy,
    built on first use (``LocalRule``: its own state and step count)."""

    __slots__ = ("rule", "worker", "local")

    def __init__(self, rule, worker: int):
        self.rule, self.worker, self.local = rule, worker, None

    def __call__(self, work, grad) -> bool:
        """Step ``work`` along ``grad``; False (nothing done) if ``grad`` is
        not finite."""
        if not finite(grad):
            return False
        if self.local is None:
            self.local = LocalRule(self.rule, self.worker)
        self.local.apply(work, grad)
        return True

    def reset(self) -> None:
        """Start afresh: the next step builds new state (a restarted copy's
        rule keeps nothing of the copy it restarts from, ``elastic.py``)."""
        self.local = None

    def sums(self, like) -> list:
        """This copy's sums (``Rule.summed_state``), its state created where
        none is yet, for parameters like ``like`` (their size, kind and
        place, as ``LocalRule.apply`` creates it)."""
        if self.local is None:
            self.local = LocalRule(self.rule, self.worker)
        self.local.ensure_state(arrays.size(like), like.dtype, arrays.zeros_for(like))
        return [getattr(self.local.state, name) for name in self.rule.summed_state]

    def start_from_sums(self, state) -> dict:
        """Take the shared sums (``Rule.summed_state``) of ``state`` as this
        copy's own, copied; returns the copies, for ``add_sums_to``."""
        names = self.rule.summed_state
        if not names:
            return {}
        first = getattr(state, names[0])
        self.sums(first)
        sent = {}
        for name in names:
            mine = getattr(self.local.state, name)
            mine[...] = getattr(state, name)
            sent[name] = arrays.copy(mine)
        return sent

    def add_sums_to(self, state, sent: dict, weight: float = 1.0) -> None:
        """Add to ``state``'s shared sums ``weight`` times what this copy
        added to its own since ``start_from_sums`` gave it ``sent``."""
        for name, before in sent.items():
            added = getattr(self.local.state, name) - before
            getattr(state, name)[...] += added if weight == 1.0 else weight * added

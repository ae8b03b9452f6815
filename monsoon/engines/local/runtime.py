"""One worker of the local engine: interprets a strategy's ops on shared memory.

The same runtime serves a spawned process, a thread, and the inline runner
that ``serial`` uses. Op by op:

- ``Gradient``: the problem computes at the working parameters (the shared
  ones for shared strategies: zero copy). Sync workers write straight into
  their gradient slot.
- ``Apply``: the rule on the whole shared vector, no lock (Hogwild!).
- ``Fetch`` / ``Push``: per shard, under that shard's lock.
- ``AllReduce`` / ``Average``: write slot; the first N arrivals count (the
  rest, backups, are late); barrier; sum this worker's shards of the counted
  slots (in rank order, so the result does not depend on timing); barrier;
  apply the rule to those shards; barrier.
- ``LocalApply`` / ``Elastic``: the inner rule on the private working copy;
  EASGD's exchange with the centre, per shard under its lock.

A non-finite gradient is never applied: it is counted in ``dropped``.
"""
from __future__ import annotations

import math
import os
import platform
from collections import Counter

import numpy as np
from scipy.linalg import blas

from ...rules import UpdateInfo
from ...rules.local import LocalRule
from ...strategies.ops import (AllReduce, Apply, Average, Elastic, Fetch, Gradient, LocalApply,
                               LocalStep, Push, SGDPass)
from ..reduce import weighted_sum
from ..waiting import Aborted, wait_until
from .store import (APPLIED, ARRIVED, BAD_STEP, DROPPED, EXAMPLES, LATE, REDUCED, STEP, UPDATES,
                    ParameterStore)


# x86 keeps stores in order (TSO), so a counter seen raised implies the slot
# writes before it are visible; weaker CPUs (ARM) need the lock as a fence.
NEEDS_FENCE = platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686")


_ASUM = {np.dtype("float32"): blas.sasum, np.dtype("float64"): blas.dasum}


def finite(g: np.ndarray) -> bool:
    """One pass, no allocation: NaN and Inf propagate through a sum of
    absolute values (BLAS asum, 3x faster than NumPy's pairwise sum; a
    finite vector only fails if its 1-norm overflows, i.e. it is garbage)."""
    asum = _ASUM.get(g.dtype)
    if asum is not None and g.flags.c_contiguous and g.size:
        return math.isfinite(asum(g))
    return math.isfinite(float(np.add.reduce(g, axis=None)))


class WorkerRuntime:
    def __init__(self, rank: int, workers: int, store: ParameterStore, problem, rule,
                 strategy, timeout: float):
        self.rank = rank
        self.workers = workers
        self.store = store
        self.problem = problem
        self.rule = rule
        self.strategy = strategy
        self.timeout = timeout
        self.counters = store.counters[rank]
        self.staleness = Counter()
        if strategy.shared_params:
            self.work = store.params
        else:
            self.work = np.array(store.params, copy=True)
        self._grad_out = store.slots[rank] if store.slots is not None else None
        self._others_at_read = 0
        self._sync_step = 0
        self._reader = store.reader(rank)
        self._shard_readers = [store.reader(rank, s) for s in range(len(store.bounds))]
        self._acc = None
        # Spin in barriers only when every worker can own a core.
        self._spin = workers <= (os.cpu_count() or 1)
        self._local_rule = None
        self._handlers = {Gradient: self.gradient, Apply: self.apply, Fetch: self.fetch,
                          Push: self.push, LocalStep: self.local_step, AllReduce: self.all_reduce,
                          Average: self.average, LocalApply: self.local_apply,
                          Elastic: self.elastic, SGDPass: self.sgd_pass}

    # -- driving a program -------------------------------------------------
    def run(self, program, between_ops=None) -> None:
        """Run ``program`` to its end. ``between_ops()`` (inline runner only)
        is called after every op, for metrics."""
        handlers = self._handlers
        store = self.store
        result = None
        try:
            while True:
                op = program.send(result)
                if store.control[1]:
                    raise Aborted()
                result = handlers[type(op)](op)
                if between_ops is not None:
                    between_ops()
        except StopIteration:
            return
        finally:
            program.close()

    def _updates_by_others(self) -> int:
        return int(self.store.counters[:, UPDATES].sum() - self.counters[UPDATES])

    # -- ops -----------------------------------------------------------------
    def gradient(self, op: Gradient):
        if self.strategy.shared_params and self.workers > 1:
            self._others_at_read = self._updates_by_others()
            if self._reader is not None and not self.strategy.needs_all_workers:
                # Hogwild!: this gradient reads the shared parameters now.
                self.rule.on_read(self.store.params, self.store.state, self._reader)
        # A sync worker's gradient is written straight into its slot.
        loss, grad = self.problem.gradient(self.work, op.indices, self._grad_out)
        self.counters[EXAMPLES] += len(op.indices)
        return loss, grad

    def apply(self, op: Apply) -> None:
        if not finite(op.grad):
            self.counters[DROPPED] += 1
            return
        others = self._updates_by_others() if self.workers > 1 else 0
        staleness = others - self._others_at_read
        mine = int(self.counters[UPDATES])
        reader = self._reader if self.workers > 1 else None
        self.rule.apply(self.store.params, op.grad, self.store.state,
                        UpdateInfo(step=mine + others, staleness=staleness, worker=self.rank,
                                   reader=reader))
        self.counters[UPDATES] += 1
        self.staleness[staleness] += 1

    def sgd_pass(self, op: SGDPass) -> float:
        lr = self.rule.learning_rate(UpdateInfo(step=0)) * op.decay
        loss = self.problem.sgd_pass(self.store.params, op.indices, lr)
        self.counters[EXAMPLES] += len(op.indices)
        self.counters[UPDATES] += len(op.indices)
        return loss

    def fetch(self, op: Fetch) -> np.ndarray:
        store = self.store
        ticket = np.empty(len(store.bounds), dtype=np.int64)
        for s, (a, b) in enumerate(store.bounds):
            with store.locks[s]:
                ticket[s] = store.versions[s]
                np.copyto(self.work[a:b], store.params[a:b])
                if self._reader is not None:
                    self.rule.on_read(store.params[a:b], store.shard_states[s],
                                      self._shard_readers[s])
        return ticket

    def push(self, op: Push) -> None:
        grad = op.grad
        if not finite(grad):
            self.counters[DROPPED] += 1
            return
        store = self.store
        shards = len(store.bounds)
        for i in range(shards):
            s = (i + self.rank) % shards  # start at different shards: less lock contention
            a, b = store.bounds[s]
            with store.locks[s]:
                version = int(store.versions[s])
                staleness = version - int(op.ticket[s])
                self.rule.apply(store.params[a:b], grad[a:b], store.shard_states[s],
                                UpdateInfo(step=version, staleness=staleness, worker=self.rank,
                                           reader=self._shard_readers[s]))
                store.versions[s] = version + 1
            self.staleness[staleness] += 1
        self.counters[UPDATES] += 1

    def local_step(self, op: LocalStep) -> None:
        self.work -= op.lr * op.grad

    def all_reduce(self, op: AllReduce) -> int:
        slot = self.store.slots[self.rank]
        if op.grad is None:
            slot.fill(0)  # 0 * a stale NaN would still be NaN
            examples = 0
        else:
            if op.grad is not slot:
                np.copyto(slot, op.grad)
            examples = op.examples
        return self._synchronous_step(examples)

    def average(self, op: Average) -> int:
        np.subtract(self.store.params, self.work, out=self.store.slots[self.rank])
        return self._synchronous_step(op.examples)

    def local_apply(self, op: LocalApply) -> None:
        if not finite(op.grad):
            self.counters[DROPPED] += 1
            return
        if self._local_rule is None:
            self._local_rule = LocalRule(self.strategy.local_rule, self.rank)
        self._local_rule.apply(self.work, op.grad)

    def elastic(self, op: Elastic) -> None:
        store = self.store
        for s, (a, b) in enumerate(store.bounds):
            mine = self.work[a:b]
            with store.locks[s]:
                centre = store.params[a:b]
                diff = np.subtract(mine, centre)
                diff *= op.alpha
                centre += diff
                store.versions[s] += 1
            mine -= diff
        self.counters[UPDATES] += 1

    def _synchronous_step(self, examples: int) -> int:
        """One synchronous step over the slots; see ``AllReduce``.

        Arrival order decides who counts: under the lock, the first N arrivals
        at the current step are recorded in ``contributors``; anyone else is
        late. Then three barriers among the N: all arrived; all shards summed
        (the i-th arrival sums shards s with s % N == i, over the contributors
        in rank order, so the sum does not depend on timing) and checked; all
        shards updated, after which the last one through opens the next step."""
        store = self.store
        sync = store.sync
        step = self._sync_step
        counted = self.workers - self.strategy.backup_workers
        store.slot_examples[self.rank] = examples
        with store.sync_lock:
            order = -1
            if sync[STEP] == step and sync[ARRIVED] < counted:
                order = int(sync[ARRIVED])
                store.contributors[order] = self.rank
                sync[ARRIVED] += 1
        if order < 0:
            return self._late(step)
        self._wait_count(ARRIVED, counted, step, "arrive at step")
        ranks = sorted(int(r) for r in store.contributors[:counted])
        shards = [s for s in range(len(store.bounds)) if s % counted == order]
        sums = self._reduce(ranks, shards)
        if not all(finite(acc) for acc in sums):
            sync[BAD_STEP] = step
        with store.sync_lock:
            sync[REDUCED] += 1
        self._wait_count(REDUCED, counted, step, "sum step")
        bad = sync[BAD_STEP] == step
        if not bad:
            for s, acc in zip(shards, sums):
                a, b = store.bounds[s]
                self.rule.apply(store.params[a:b], acc, store.shard_states[s],
                                UpdateInfo(step=step, staleness=0, worker=self.rank))
                store.versions[s] += 1
        with store.sync_lock:
            sync[APPLIED] += 1
            if sync[APPLIED] == counted:  # the last one through opens the next step
                sync[ARRIVED] = sync[REDUCED] = sync[APPLIED] = 0
                sync[STEP] = step + 1
        self._wait_step(step, "apply step")
        if order == 0:
            self.counters[DROPPED if bad else UPDATES] += 1
            if not bad:
                self.staleness[0] += 1
        self._sync_step = step + 1
        if not self.strategy.shared_params:
            np.copyto(self.work, store.params)
        return 0

    def _late(self, step: int) -> int:
        """Dropped: N others arrived first. Wait for the step to be applied,
        then join the current step."""
        self.counters[LATE] += 1
        self._wait_step(step, "apply step")
        current = int(self.store.sync[STEP])
        self._sync_step = current
        if not self.strategy.shared_params:
            np.copyto(self.work, self.store.params)
        return current - (step + 1)

    def _wait_count(self, column: int, target: int, step: int, what: str) -> None:
        store = self.store
        counts = store.sync
        if counts[column] < target:
            wait_until(lambda: counts[column] >= target, self.timeout,
                       lambda: store.control[1],
                       f"{target} workers to {what} {step}", self._spin)
        if NEEDS_FENCE:
            with store.sync_lock:
                pass  # acquire: see every write made before the others arrived

    def _wait_step(self, step: int, what: str) -> None:
        self._wait_count(STEP, step + 1, step, what)

    def _reduce(self, ranks: list[int], shards: list[int]) -> list:
        """The weighted mean of the counted slots, on each of ``shards``."""
        store = self.store
        if self._acc is None:
            self._acc = np.empty(store.params.size, dtype=store.params.dtype)
            self._tmp = np.empty_like(self._acc)
        examples = [int(store.slot_examples[k]) for k in ranks]
        sums = []
        for s in shards:
            a, b = store.bounds[s]
            sums.append(weighted_sum(store.slots[:, a:b], ranks, examples, self._acc[a:b],
                                     self._tmp[a:b]))
        return sums

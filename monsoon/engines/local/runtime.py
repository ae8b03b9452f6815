"""One worker of the local engine: interprets a strategy's ops on shared memory.

The same runtime serves a spawned process, a thread, and the inline runner
that ``serial`` uses. Op by op:

- ``Gradient``: the problem computes at the working parameters (the shared
  ones for shared strategies: zero copy). Sync workers write straight into
  their gradient slot.
- ``Apply``: the rule on the whole shared vector, no lock (Hogwild!).
- ``Fetch`` / ``Push``: per shard, under that shard's lock.
- ``AllReduce``: write slot; barrier; sum this worker's shards of every
  slot (in rank order, so the result does not depend on timing); barrier;
  apply the rule to those shards; barrier.

A non-finite gradient is never applied: it is counted in ``dropped``.
"""
from __future__ import annotations

import math
import os
import platform
from collections import Counter

import numpy as np

from ...rules import UpdateInfo
from ...strategies.ops import AllReduce, Apply, Fetch, Gradient, LocalStep, Push
from ..waiting import Aborted, wait_until
from .store import (APPLIED, ARRIVED, BAD_STEP, DROPPED, EXAMPLES, REDUCED, UPDATES,
                    ParameterStore)


# x86 keeps stores in order (TSO), so a counter seen raised implies the slot
# writes before it are visible; weaker CPUs (ARM) need the lock as a fence.
NEEDS_FENCE = platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686")


def finite(g: np.ndarray) -> bool:
    """One pass, no allocation: NaN and Inf propagate through a sum."""
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
        self._my_shards = [s for s in range(len(store.bounds)) if s % workers == rank]
        self._acc = None
        # Spin in barriers only when every worker can own a core.
        self._spin = workers <= (os.cpu_count() or 1)
        self._handlers = {Gradient: self.gradient, Apply: self.apply, Fetch: self.fetch,
                          Push: self.push, LocalStep: self.local_step, AllReduce: self.all_reduce}

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
        self.rule.apply(self.store.params, op.grad, self.store.state,
                        UpdateInfo(step=mine + others, staleness=staleness, worker=self.rank))
        self.counters[UPDATES] += 1
        self.staleness[staleness] += 1

    def fetch(self, op: Fetch) -> np.ndarray:
        store = self.store
        ticket = np.empty(len(store.bounds), dtype=np.int64)
        for s, (a, b) in enumerate(store.bounds):
            with store.locks[s]:
                ticket[s] = store.versions[s]
                np.copyto(self.work[a:b], store.params[a:b])
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
                                UpdateInfo(step=version, staleness=staleness, worker=self.rank))
                store.versions[s] = version + 1
            self.staleness[staleness] += 1
        self.counters[UPDATES] += 1

    def local_step(self, op: LocalStep) -> None:
        self.work -= op.lr * op.grad

    def all_reduce(self, op: AllReduce) -> None:
        """Three barriers per step: all gradients written; all shards summed
        (and checked: a non-finite sum anywhere drops the whole step, on every
        worker); all shards updated. Each worker sums and updates only its own
        shards, so the work of the update is spread over the workers."""
        store = self.store
        step = self._sync_step
        slot = store.slots[self.rank]
        if op.grad is None:
            slot.fill(0)  # 0 * a stale NaN would still be NaN
            store.weights[self.rank] = 0.0
        else:
            if op.grad is not slot:
                np.copyto(slot, op.grad)
            store.weights[self.rank] = op.weight
        self._barrier(ARRIVED, step, "write their gradients")
        sums = self._reduce(step)
        if not all(finite(acc) for acc in sums):
            store.sync[BAD_STEP] = step
        self._barrier(REDUCED, step, "sum their shards")
        bad = store.sync[BAD_STEP] == step
        if not bad:
            for s, acc in zip(self._my_shards, sums):
                a, b = store.bounds[s]
                self.rule.apply(store.params[a:b], acc, store.shard_states[s],
                                UpdateInfo(step=step, staleness=0, worker=self.rank))
                store.versions[s] += 1
        self._barrier(APPLIED, step, "apply step")
        if self.rank == 0:
            if bad:
                self.counters[DROPPED] += 1
            else:
                self.counters[UPDATES] += 1
                self.staleness[0] += 1
        self._sync_step = step + 1

    def _barrier(self, column: int, step: int, what: str) -> None:
        store = self.store
        counts = store.sync
        with store.sync_lock:
            counts[column] += 1
        target = self.workers * (step + 1)
        if counts[column] < target:
            wait_until(lambda: counts[column] >= target, self.timeout,
                       lambda: store.control[1], f"all {self.workers} workers to {what} {step}",
                       self._spin)
        if NEEDS_FENCE:
            with store.sync_lock:
                pass  # acquire: see every write made before the others arrived

    def _reduce(self, step: int) -> list:
        """sum_k weight_k * slot_k on each of this worker's shards, in rank
        order (so the result does not depend on timing)."""
        store = self.store
        if self._acc is None:
            self._acc = np.empty(store.params.size, dtype=store.params.dtype)
            self._tmp = np.empty_like(self._acc)
        weights = store.weights.tolist()
        equal = all(w == weights[0] for w in weights)
        sums = []
        for s in self._my_shards:
            a, b = store.bounds[s]
            acc, slots = self._acc[a:b], store.slots[:, a:b]
            if equal and self.workers > 1:
                np.add(slots[0], slots[1], out=acc)
                for k in range(2, self.workers):
                    acc += slots[k]
                acc *= weights[0]
            else:
                np.multiply(slots[0], weights[0], out=acc)
                tmp = self._tmp[a:b]
                for k in range(1, self.workers):
                    np.multiply(slots[k], weights[k], out=tmp)
                    acc += tmp
            sums.append(acc)
        return sums

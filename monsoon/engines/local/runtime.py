"""One worker of the local engine: interprets a strategy's ops on shared memory.

The same runtime serves a spawned process, a thread, and the inline runner
that ``serial`` uses. The loop, ``LocalStep`` and ``LocalApply`` are the
shared interpreter's (``server/worker.py``); the monitor's abort flag ends
the loop before the next op. Op by op:

- ``Gradient``: the problem computes at the working parameters (the shared
  ones for shared strategies: zero copy). Sync workers write straight into
  their gradient slot (the replicated step's alternate with the step). A
  model's buffers go to the worker's slot after it, for the curve rows and
  snapshot checkpoints, at most every ``BUFFERS_EVERY_S`` (on a GPU each
  copy waits for the device); an exact run with a folder keeps them from
  before it too, for a stop (``checkpointing.py``).
- ``Apply``: the rule on the whole shared vector, no lock (Hogwild!).
- ``Fetch`` / ``Push``: per shard, under that shard's lock. A push counts
  the examples of the gradients it carries (``Worker.release``): an accrued
  sum that a stop leaves unpushed is not counted, and a resumed run does
  those batches again. Shard 0 counts it again, and a push dropped at the
  worker, under its lock (``store.landed``: a row's counts, read with the
  parameters). A worker resumed with its own copy (EASGD's x_i) keeps it:
  its first Fetch takes the centre's versions, not its values.
- ``AllReduce`` / ``Average``: write the slot, then one synchronous step
  (``synchronous.py``): sharded (each worker sums and applies 1/N of the
  vector, three barriers) or, for small models, replicated (every worker
  applies the mean to its own replica, one barrier). Average also writes
  what the inner rule's steps added to the shared sums (``store.sum_slots``)
  and starts the next round from them (Local AdaAlter, ``server/summed.py``).
- ``Clock``: SSP's clock tick, and its bound (``clocks.py``).
- ``LocalApply`` / ``Elastic``: the inner rule on the private working copy;
  EASGD's exchange with the centre, per shard under its lock (compressed,
  ``--compress``: the worker reads the centre, sends D = C(alpha (x_i - x~)
  + e), and both apply D: x~ += D shard by shard, x_i -= D).

A non-finite gradient is never applied: it is counted in ``dropped`` (a
local step's: in ``local_counts``, with the local steps applied); nor is an
exchange from a copy that is not finite (``server/elastic.py``).

The arrays are the store's kind (``monsoon/arrays.py``): NumPy in shared
memory, or tensors on the device the workers' problem computes on.
"""
from __future__ import annotations

import os
import time
from collections import Counter

import numpy as np

from ... import arrays
from ...problems.buffers import flat as flat_buffers
from ...rules import UpdateInfo
from ...strategies.ops import (AllReduce, Apply, Average, Clock, Elastic, Fetch, Gradient, Push,
                               SGDPass, weighted)
from ...compressors.messages import Sender
from ...server.core import ServerCore
from ...server.reduce import into_slot
from ...server.summed import SharedSums
from ...server.worker import Worker
from ...monitor.waiting import HOT_TURNS, Aborted
from ...record.live import add_loss
from .checkpointing import keeps_step_buffers
from .clocks import LocalClocks
from .store import (ABORT, DROPPED, EXAMPLES, LOCAL_APPLIED, LOCAL_DROPPED, STALE_MAX,
                    STALE_N, STALE_SUM, UPDATES, WRITING, ParameterStore)
from .synchronous import ReplicatedStep, ShardedStep

BUFFERS_EVERY_S = 0.02  # the most often a worker copies its buffers for the curve rows
BUFFERS_SHARE = 0.02    # and the most of its time those copies take (large buffers)


class SharedCounts(Counter):
    """A worker's staleness counts, kept in its row of the store's
    ``stale_counts`` too as they change (``ParameterStore.lost_report``).
    The row is written through a memoryview: a count is on the hot path
    of every push."""

    def __init__(self, row):
        super().__init__()
        self.cells, self.last = memoryview(row), len(row) - 1

    def __setitem__(self, staleness, count) -> None:
        cell = staleness if staleness < self.last else self.last
        self.cells[cell] += count - dict.get(self, staleness, 0)
        dict.__setitem__(self, staleness, count)


class SharedSender(Sender):
    """A worker's sender whose byte and message counts are copied into its
    row of the store's ``sent_counts`` (``SENT_FIELDS``' order) after each
    message it counts (``ParameterStore.lost_report``). Its counts stay
    plain attributes: a message's bookkeeping is on the hot path of every
    push, and a write through a memoryview costs a fraction of a
    shared-array property's. A byte count the worker's program adds
    outside a message (what an all-reduce receives) reaches the row with
    the next message."""

    def __init__(self, compression, rank: int, row):
        super().__init__(compression, rank)
        self.cells = memoryview(row)

    def _publish(self) -> None:
        cells = self.cells
        cells[0], cells[1] = self.sent_bytes, self.raw_bytes
        cells[2], cells[3] = self.received_bytes, self.messages

    def _encode(self, v):
        out = super()._encode(v)
        self._publish()
        return out

    def _plain(self, v):
        out = super()._plain(v)
        self._publish()
        return out

    def dense(self, nbytes: int, received: int = 0) -> None:
        super().dense(nbytes, received)
        self._publish()

    def uncount_last(self) -> None:
        super().uncount_last()
        self._publish()


class WorkerRuntime(Worker):
    engine_name = "local"

    def __init__(self, rank: int, workers: int, store: ParameterStore, problem, rule,
                 strategy, timeout: float, live: bool = True, start_step: int = 0,
                 checkpoint_every: int = 0, work0: np.ndarray | None = None):
        super().__init__(rank, problem, strategy, None)  # the working parameters: below
        self.start_step = start_step  # synchronous steps already done (a resumed run)
        self.checkpoint_every = checkpoint_every
        self.workers = workers
        self.store = store
        self.rule = rule
        self.timeout = timeout
        self.live = live  # the monitor reads the shared parameters during the run
        self.counters = store.counters[rank]
        # every worker's update count, read twice a Hogwild! step: a memoryview's
        # cells cost a fraction of a NumPy column sum on the hot path
        self._all_updates = memoryview(store.counters[:, UPDATES])
        self.local_counts = store.local_counts[rank]
        # with live series: this worker's losses and staleness, for the monitor
        self._live = store.live[rank] if store.live is not None else None
        # this worker's buffer slot, for curve rows and snapshot checkpoints
        # (None: no buffers, or neither a curve nor a folder)
        self._buffers = store.buffers[rank] if store.buffers is not None else None
        self._buffers_due = 0.0  # perf_counter time of the next copy
        # an exact run's buffers from before this step's forward pass, for a
        # stop that leaves the step unapplied (None: not kept)
        self.step_buffers = None
        self._keep_step_buffers = keeps_step_buffers(store)
        self.step_examples = 0  # the examples the last gradient counted (``undo_step``)
        self.carried = 0  # the examples of the push under way (``store.landed``)
        self.staleness = SharedCounts(store.stale_counts[rank])
        self._sync = None
        self._grad_out = None
        # a resumed private copy (EASGD's x_i) that the program's first Fetch
        # meets the centre with but does not replace (``fetch``)
        self.keeps_copy = False
        if store.replicated:
            self._sync = ReplicatedStep(self)
            self.work = self._sync.params  # a private replica
            self._grad_out = self._sync.slot[0]  # then each step's slot, in turn
        else:
            if strategy.synchronous:
                self._sync = ShardedStep(self)
                self._grad_out = store.slots[rank]  # gradients land straight in the slot
            self.work = store.params if strategy.shared_params else arrays.copy(store.params)
            if work0 is not None and not strategy.shared_params:
                arrays.copyto(self.work, work0)  # a resumed private copy
                self.keeps_copy = True
        # Local AdaAlter's sums, shared in the store (None: the inner rule keeps none)
        self.shared_sums = SharedSums(store.sums) if store.sums is not None else None
        if self.shared_sums is not None:
            self.shared_sums.start(self.local_rule, self.work)
        self._others_at_read = 0
        self._prefetch = problem.prefetch
        # Gradients read parameters others are updating (Hogwild!): staleness
        # is counted from the read.
        self._reads_shared = (strategy.shared_params and workers > 1
                              and not strategy.synchronous)
        # the server's update on the whole vector (Hogwild!'s Apply: its
        # version is every worker's updates, in shared memory), and per shard
        self.server = ServerCore(store.params, rule, store.state, store.readers(),
                                 staleness=self.staleness)
        self.shards = self.server.shards(store.bounds)
        self.admits = self.server.admits  # a push's check: the server's (counts the drop)
        if workers == 1:
            self.server.readers = None  # a lone worker's read is never stale
        # Spin in barriers only when every worker can own a core, and flat
        # out (no yield) only between processes.
        self._spin = workers <= (os.cpu_count() or 1)
        self._hot_turns = HOT_TURNS if self._spin and store.processes else 0
        self.sender = None  # messages.Sender: compresses Average's drift
        self.handlers.update({Apply: self.apply, Fetch: self.fetch, Push: self.push,
                              AllReduce: self.all_reduce, Average: self.average,
                              SGDPass: self.sgd_pass})
        self.ssp = LocalClocks(self).install(self.handlers) if Clock in strategy.uses else None

    # -- driving a program -------------------------------------------------
    def run(self, program, between_ops=None) -> None:
        """Run ``program`` to its end, or until the monitor aborts the run
        (``Aborted``). ``between_ops()`` (inline runner only) is called
        after every op, for metrics."""
        store = self.store
        self.program, self.halt = program, store.control[ABORT:ABORT + 1]
        # A diverging run computes on non-finite parameters; it says so through
        # its status and message (the monitor's check, dropped_updates), not
        # through NumPy's warnings, which would print once per code line.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if self._sync is not None:
                self._sync.begin()
            self.advance(None, between_ops)
        if self._sync is not None:
            self._sync.finish()
        elif self.workers == 1 and self.strategy.shared_params:  # serial's end
            self.rule.finish(store.params, store.state)

    def halted(self) -> None:
        raise Aborted()

    def on_stop(self) -> None:
        """The worker stopped at a step boundary (``synchronous.Stopped``)."""
        if self._sync is not None:
            self._sync.on_stop()

    def on_abort(self) -> None:
        """The monitor aborted the run (a divergence, the target, a lost
        peer): a replicated step's worker 0 still hands over the parameters
        the run reached."""
        if self._sync is not None:
            self._sync.on_abort()

    def _updates(self) -> int:
        """Every worker's updates so far (the shared vector's version)."""
        return sum(self._all_updates)

    def _updates_by_others(self) -> int:
        return self._updates() - int(self.counters[UPDATES])

    # -- ops -----------------------------------------------------------------
    def gradient(self, op: Gradient):
        if self._reads_shared:
            self._others_at_read = self._updates_by_others()
            if not self.strategy.needs_all_workers:
                self.server.read(self.rank)  # Hogwild!: this gradient reads them now
        if op.next is not None and self._prefetch is not None:
            self._prefetch(op.next)  # a Dataset problem loads it while this one computes
        if self._keep_step_buffers:
            self.step_buffers = self.problem.kept_state()  # a GPU's: not waited for
        loss, grad = self.problem.gradient(self.work, op.indices, self._grad_out)
        if self._buffers is not None and time.perf_counter() >= self._buffers_due:
            self.publish_buffers()  # the forward moved them (BatchNorm's statistics)
        grad = weighted(grad, op.weight)
        if self.held is None:
            self.counters[EXAMPLES] += len(op.indices)
            self.step_examples = len(op.indices)
        else:  # a pushing program's: counted with the push (``server/worker.py``)
            self.held += len(op.indices)
        if self._live is not None:
            self._count_loss(loss)
        return loss, grad

    def _count_loss(self, loss) -> None:
        """The loss into this worker's live row (its ``WRITING`` mark odd
        meanwhile: the monitor reads the cells whole)."""
        live = self._live
        live[WRITING] += 1
        add_loss(live, loss)
        live[WRITING] += 1

    def _stale(self, staleness: int) -> None:
        live = self._live
        live[STALE_SUM] += staleness
        live[STALE_N] += 1
        if staleness > live[STALE_MAX]:
            live[STALE_MAX] = staleness

    def publish_buffers(self) -> None:
        """Copy the model's buffers into this worker's slot (the curve rows);
        the next copy comes after ``BUFFERS_EVERY_S``, or later where copies
        would take over ``BUFFERS_SHARE`` of the worker's time."""
        began = time.perf_counter()
        self._buffers[:] = flat_buffers(self.problem.state())
        now = time.perf_counter()
        self._buffers_due = now + max(BUFFERS_EVERY_S, (now - began) / BUFFERS_SHARE)

    def undo_step(self) -> None:
        """A stop left this worker's step unapplied: the examples its
        gradient counted are taken out (the resumed run counts them), and
        its model's buffers go back to those kept from before that step's
        forward pass."""
        self.counters[EXAMPLES] -= self.step_examples
        self.step_examples = 0
        if self.step_buffers is not None:
            self.problem.load_state(self.step_buffers)
            if self._buffers is not None:
                self.publish_buffers()

    def apply(self, op: Apply) -> None:
        counters, server = self.counters, self.server
        mine = int(counters[UPDATES])
        # the version: every worker's updates; the read's, this worker's now
        # plus the others' at its read
        server.version = self._updates() if self.workers > 1 else mine
        staleness = server.push(self.rank, op.grad, mine + self._others_at_read, op.loss)
        if staleness is None:
            self.count_dropped()
            return
        counters[UPDATES] += 1
        if self._live is not None:
            self._stale(staleness)

    def sgd_pass(self, op: SGDPass) -> float:
        lr = self.rule.learning_rate(UpdateInfo(step=0)) * op.decay
        loss = self.problem.sgd_pass(self.store.params, op.indices, lr)
        self.counters[EXAMPLES] += len(op.indices)
        if self._live is not None:
            self._count_loss(loss)
        self.counters[UPDATES] += len(op.indices)
        return loss

    def fetch(self, op: Fetch) -> np.ndarray:
        store = self.store
        ticket = np.empty(len(store.bounds), dtype=np.int64)
        # EASGD's program starts with a Fetch (x_i = the centre); a worker
        # resumed with its copy keeps it, as the uninterrupted run's did
        keep, self.keeps_copy = self.keeps_copy, False
        for s, (a, b) in enumerate(store.bounds):
            with store.holding(s, self.rank):
                ticket[s] = store.versions[s]
                self.shards[s].read(self.rank, None if keep else self.work[a:b])
        self.took_centre(ticket)
        return ticket

    def send_push(self, grad, ticket) -> None:
        store = self.store
        shards = len(store.bounds)
        worst = 0  # the push's staleness: its stalest slice's (``ServerCore.push``)
        for i in range(shards):
            s = (i + self.rank) % shards  # start at different shards: less lock contention
            a, b = store.bounds[s]
            core = self.shards[s]
            with store.holding(s, self.rank):
                core.version = int(store.versions[s])  # the shard's, in shared memory
                worst = max(worst, core.push(self.rank, grad[a:b], int(ticket[s]),
                                             checked=True, count=False))
                store.versions[s] = core.version
                if s == 0:
                    store.landed[EXAMPLES] += self.carried
                    store.landed[UPDATES] += 1
        self.staleness[worst] += 1
        if self._live is not None:
            self._stale(worst)
        self.counters[UPDATES] += 1

    def all_reduce(self, op: AllReduce) -> int:
        grad = op.grad
        examples = op.examples if grad is not None else 0
        if self.store.replicated:
            return self._sync.contribute(grad, examples)
        into_slot(self._grad_out, grad)  # this worker's slot (``store.slots[rank]``), one view
        return self._after_step(self._sync.contribute(examples))

    def average(self, op: Average) -> int:
        store, sums = self.store, self.shared_sums
        # a_k, where the sums are shared, for the step's mean (``ShardedStep._apply``)
        self.drift(store.params, store.slots[self.rank], sums, store.sum_slots)
        return self._after_step(self._sync.contribute(op.examples))

    def _after_step(self, behind: int) -> int:
        self.restart(self.store.params, self.shared_sums)  # a private model: from the average
        return behind

    def count_examples(self, examples: int) -> None:
        self.counters[EXAMPLES] += examples
        self.carried = examples

    def count_dropped(self) -> None:
        self.counters[DROPPED] += 1
        if self.held is not None:  # a push dropped here: it never reaches shard 0
            store = self.store
            with store.holding(0, self.rank):
                store.landed[EXAMPLES] += self.carried
                store.landed[DROPPED] += 1

    def count_local(self, applied: bool) -> None:
        self.local_counts[LOCAL_APPLIED if applied else LOCAL_DROPPED] += 1

    def send_elastic(self, op: Elastic) -> None:
        store = self.store
        worst = 0  # the exchange's staleness: its stalest shard's (``server/elastic.py``)
        # Shards go one at a time, each under its own lock: another worker's exchanges
        # landing between two of them count here (at the stalest shard) and again in
        # this worker's next exchange, so its total can pass the others' exchanges.
        compressed = self.sender is not None and self.sender.compression.active
        if compressed:
            # Zhang et al.'s asynchronous exchange with the difference compressed:
            # read x~, send D = C(alpha (x_i - x~) + e); x~ += D, x_i -= D
            _, sent = self.elastic_difference(store.params, op.alpha)
        for s, (a, b) in enumerate(store.bounds):
            mine = self.work[a:b]
            with store.holding(s, self.rank):
                worst = max(worst, self.exchanged(s, int(store.versions[s])))
                if compressed:
                    self.shards[s].add(sent[a:b])
                else:
                    diff = self.shards[s].elastic(mine, op.alpha)
                store.versions[s] += 1
            if not compressed:
                mine -= diff
        self.staleness[worst] += 1
        if self._live is not None:
            self._stale(worst)
        self.counters[UPDATES] += 1

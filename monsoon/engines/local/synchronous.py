"""The local engine's synchronous step: every counted worker's contribution
is in its slot, and the weighted mean of the slots is applied once.

Two ways to run one step, chosen per run by the model's size
(``server/shards.py``'s ``replicates``):

``ShardedStep`` (large models; backup workers; local SGD's averaging), a
reduce-scatter: the i-th of the N counted arrivals sums the shards
s % N == i over the counted slots, in rank order, and applies the rule to
those shards of the shared parameters (and, for an Average whose inner
rule keeps sums, adds the mean of the workers' ``sum_slots`` to those
shards of ``store.sums``: Local AdaAlter, ``server/summed.py``). Three
barriers: all arrived (the first N count, later ones are late: backup
workers); all shards summed and checked (a non-finite sum anywhere drops
the whole step); all shards updated. Without backup workers the barriers
need no lock: each worker raises its own mark (``store.marks``) and worker 0 closes the step. Two
workers of equal batches sum, scale and check a shard in one compiled pass
(``kernels.mean_of_two_finite``).

``ReplicatedStep`` (small models, up to ``REPLICATE_MAX_BYTES``; sync
without backups): as after DDP's all-reduce, every worker holds a replica
of the parameters and rule state and applies the same mean to it, so one
barrier per step is enough. Slots are double-buffered by step parity (a
worker is at most one step ahead of the slowest reader). Summing in rank
order keeps the replicas bit-identical; worker 0 publishes its replica as
it ends (done, stopped, aborted), and copies it, the buffer slots and the
applied steps' counts into the snapshot ring every ``control[SNAP_EVERY]``
steps (unless the ring is full, or the copy takes over ``SNAP_SHARE`` of
its time) and, once the ring has room, after the monitor asks for a row.

Invariants: a non-finite mean is never applied (the step counts in
``dropped``). Checkpoints and stops happen at step boundaries only, so a
resumed run ends bit-identical to an uninterrupted one. Every
``checkpoint_every`` steps the parameters and rule state go to the store's
checkpoint buffer (replicated: worker 0; sharded: the last worker through
the step) once the monitor has taken the previous one. On ``STOP`` the
first worker to see it at a boundary sets ``STOP_AT`` and every worker
stops there (``Stopped``), handing its compressor state at that boundary to
the monitor (``checkpointing.hand_over_sender``), which writes the final
checkpoint. Every wait has the run's timeout.
"""
from __future__ import annotations

import time

import numpy as np

from ... import arrays
from ...record.checkpoints import next_checkpoint
from ...server.reduce import WeightedMean, finite, step_sums
from ...server.core import ServerCore
from ...server.summed import SharedSums
from ...monitor.waiting import Aborted, wait_until
from ...shared_memory import NEEDS_FENCE  # where set, the store's lock fences a counter
from .checkpointing import hand_over_sender, save_buffers, save_sender, save_traffic
from .store import (ABORT, APPLIED, ARRIVED, BAD_STEP, CKPT_STEP, DROPPED, EXAMPLES, LATE,
                    READY, REDUCED, SNAP_ASKED, SNAP_EVERY, SNAP_READ, SNAP_SERVED, SNAP_WRITTEN,
                    STEP, STOP, STOP_AT, UPDATES)


# The bound on replicated steps is server/shards.py's REPLICATE_MAX_BYTES: above
# it a full reduce + apply per worker costs more than the two barriers it saves
# (see bench/sync_sweep.py).

# The share of worker 0's time that copying loss-curve snapshots may take: a
# copy every step slows a multi-MB model's steps visibly (bench/sync_sweep.py).
SNAP_SHARE = 0.02


def aligned_copy(a: np.ndarray, align: int = 64) -> np.ndarray:
    """A private copy of ``a`` starting on an ``align``-byte boundary, so
    every replica is laid out alike (vectorised kernels may round their
    edges differently at different alignments)."""
    raw = np.empty(a.nbytes + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    np.copyto(out, a)
    return out


class Stopped(Aborted):
    """The monitor asked the workers to stop, and this step boundary is where."""


class _Step:
    def __init__(self, runtime):
        self.rt = runtime
        self.store = runtime.store
        self.rank = runtime.rank
        self.workers = runtime.workers
        self.step = runtime.start_step  # the next step this worker joins (resumed: skipped)
        self.sent = None  # the step of this worker's last message (compressed: encoded)
        self.control = control = self.store.control
        self.every = runtime.checkpoint_every if self.store.ckpt is not None else 0
        # the step after which rank 0 saves the next checkpoint (None: none)
        self.next_ckpt = next_checkpoint(self.step, self.every) if self.rank == 0 else None

        def abort_or_stopped():
            return control[ABORT] or (control[STOP_AT] and self.step >= control[STOP_AT])

        self._leave = abort_or_stopped

    def _wait(self, ready, what: str, may_stop: bool = False) -> None:
        """``may_stop``: nothing of the step is applied yet, so a stop may end
        the wait, and then this worker stops at this step's boundary
        (``Stopped``, as at ``_boundary``: the monitor's final checkpoint
        waits for every worker to have stopped so)."""
        rt = self.rt
        if not ready():
            try:
                wait_until(ready, rt.timeout,
                           self._leave if may_stop else (lambda: self.store.control[ABORT]),
                           what, rt._spin, rt._hot_turns)
            except Aborted:
                control = self.control
                if may_stop and not control[ABORT] and control[STOP_AT] \
                        and self.step >= control[STOP_AT]:
                    raise Stopped() from None
                raise
        if NEEDS_FENCE:
            with self.store.holding_sync(self.rank):
                pass  # acquire: see every write made before the others arrived

    def _publish(self, counters, index: int, value: int) -> None:
        """Raise a counter others wait on, after every write before it."""
        if NEEDS_FENCE:
            with self.store.holding_sync(self.rank):  # release
                counters[index] = value
        else:
            counters[index] = value

    def begin(self) -> None:
        """Called once the run has started, before the worker's first op."""

    def finish(self) -> None:
        """Called once the worker's program has ended."""
        self._hand_over()

    def on_stop(self) -> None:
        """Called when the worker stops at a step boundary."""
        self._hand_over()

    def _hand_over(self) -> None:
        """This worker's compressor state where it stopped or ended, for the
        monitor's final checkpoint: from before its last message where that
        was for the step it left unapplied (a wait it left on the stop), and
        then its buffers from before that step (``checkpointing.py``), and
        that step's examples uncounted (the summary's are the applied steps')."""
        unapplied = self.sent == self.step
        if unapplied:
            self.rt.undo_step()
        sender = self.rt.sender
        if sender is not None:
            hand_over_sender(self.store, sender, self.rank, self.step, before_last=unapplied)
            if unapplied:  # the resumed run sends that message again: counted there
                sender.uncount_last()

    def on_abort(self) -> None:
        """Called when the monitor aborts the run (the shared parameters are
        the run's: nothing to hand over)."""

    def _checkpoint_step(self, step: int) -> None:
        """Before arriving at checkpoint step ``step``: wait until the monitor
        has taken the previous checkpoint out of the buffer (it takes each
        one as it falls due, so this wait is over at once unless it fell a
        whole interval behind), so that no checkpoint is skipped; then this
        worker's compressor state, byte counts and model buffers go to the
        store (``checkpointing.save_sender``, ``save_traffic``, ``save_buffers``). Nothing of the
        step is applied yet: a stop may end the wait."""
        control = self.control
        if control[CKPT_STEP]:
            self._wait(lambda: control[CKPT_STEP] == 0,
                       f"the monitor to write the checkpoint of step {int(control[CKPT_STEP])}",
                       may_stop=True)
        save_sender(self.store, self.rt.sender, self.rank, step, self.every)
        save_traffic(self.store, self.rt.sender, self.rank, step, self.every)
        save_buffers(self.store, self.rt.problem, self.rank, step)

    def _boundary(self) -> None:
        """A checkpoint is due, or a stop was asked for (see the module doc)."""
        control = self.control
        if self.step == self.next_ckpt:
            self.next_ckpt += self.every
            self._save_checkpoint()  # the buffer is free (``_checkpoint_step``)
        if control[STOP]:
            with self.store.holding_sync(self.rank):
                if control[STOP_AT] == 0:
                    control[STOP_AT] = self.step
            if self.step >= control[STOP_AT]:
                raise Stopped()

    def _save_checkpoint(self) -> None:
        raise NotImplementedError


class ReplicatedStep(_Step):
    def __init__(self, runtime):
        super().__init__(runtime)
        store = self.store
        self.params = aligned_copy(store.params)
        self.state = type(store.state)(*(aligned_copy(a) for a in store.state))
        self.core = ServerCore(self.params, runtime.rule, self.state, staleness=runtime.staleness)
        acc, tmp = aligned_copy(store.params), aligned_copy(store.params)
        # The arrival marks and control cells through memoryviews: a cell
        # reads as a Python int, without NumPy's scalar machinery, which
        # costs microseconds a call when it runs cold between two gradients.
        self.arrivals = memoryview(store.arrivals)
        self.cells = memoryview(self.control)
        self.others = [k for k in range(self.workers) if k != self.rank]
        # Per step parity: this worker's slot, everyone's slots and examples,
        # the mean (compiled for equal weights, WeightedMean otherwise).
        self.slot = [store.rep_slots[parity, self.rank] for parity in (0, 1)]
        self.slots = [store.rep_slots[parity] for parity in (0, 1)]
        self.examples = [store.rep_examples[parity] for parity in (0, 1)]
        self.mean = [WeightedMean(list(store.rep_slots[parity]), acc, tmp) for parity in (0, 1)]
        self.acc = acc
        self.scale = acc.dtype.type(1.0 / self.workers)
        from ...server.kernels import equal_mean_finite_for  # Numba: workers only, at start-up

        self.equal_mean_finite = equal_mean_finite_for(acc.dtype)
        self._snap_at, self._snap_cost = -np.inf, 0.0  # the last snapshot: when, how long
        # worker 0: the examples of the steps applied so far (a resumed run's
        # are its counters', restored before any worker starts)
        self._applied_examples = int(store.counters[:, EXAMPLES].sum())

    def contribute(self, grad, examples: int) -> int:
        """Write ``grad`` (None: nothing) to this step's slot, wait for the
        others, apply the mean to the replica. Returns 0 (nobody is late).
        This runs between two gradients of tiny models, where every call
        counts: the views and the reducer are built once, in ``__init__``."""
        step = self.step
        parity = step & 1
        slot = self.slot[parity]
        if grad is None:
            slot.fill(0)  # 0 * a stale NaN would still be NaN
        else:
            self.sent = step
            if grad is not slot:
                np.copyto(slot, grad)
        counts = self.examples[parity]
        counts[self.rank] = examples
        target = step + 1
        if self.every and target % self.every == 0:
            self._checkpoint_step(target)
        arrivals = self.arrivals
        self._publish(arrivals, self.rank, target)
        for k in self.others:
            if arrivals[k] < target:
                self._wait(lambda: arrivals[k] >= target, f"worker {k} to arrive at step {step}",
                           may_stop=True)
        acc = self.acc
        ok = self.equal_mean_finite(self.slots[parity], counts, acc, self.scale)
        if ok >= 0:  # every worker's examples equal this one's
            total = examples * self.workers
        else:  # unequal examples
            listed = counts.tolist()
            ok, total = finite(self.mean[parity](listed)), sum(listed)
        rt = self.rt
        ok = self.core.apply_sum(acc, step, self.rank, ok=bool(ok), counts=int(self.rank == 0))
        if self.rank == 0:
            rt.counters[UPDATES if ok else DROPPED] += 1
            if rt.live:
                self._live_step(target, total)
        self.step = target
        rt._grad_out = self.slot[target & 1]  # the next gradient lands in the next slot
        if target == self.next_ckpt or self.cells[STOP]:
            self._boundary()
        return 0

    def _live_step(self, target: int, examples: int) -> None:
        """Worker 0, after applying step ``target - 1`` of ``examples``
        examples: a snapshot for a row the monitor's clock made due, or
        every ``SNAP_EVERY`` steps."""
        self._applied_examples += examples
        cells = self.cells
        every, asked = cells[SNAP_EVERY], cells[SNAP_ASKED]
        if asked != cells[SNAP_SERVED]:  # a row the monitor's clock made due
            if self._snapshot(self.control, asked=True):
                self._publish(self.control, SNAP_SERVED, asked)
        elif every and target % every == 0:
            self._snapshot(self.control)

    def _snapshot(self, control, asked: bool = False) -> bool:
        """Worker 0: this step's parameters into the snapshot ring, unless it
        is full, or (not ``asked`` by the monitor, whose rows keep clear of
        their cost) the last copy took more than ``SNAP_SHARE`` of the time
        since it was made (the others wait for worker 0 at the next step).
        Whether it was written."""
        store = self.store
        ring = store.snap_params
        written = int(control[SNAP_WRITTEN])
        if ring is None or written - control[SNAP_READ] >= len(ring):
            return False
        began = time.perf_counter()
        if not asked and (began - self._snap_at) * SNAP_SHARE < self._snap_cost:
            return False
        i = written % len(ring)
        np.copyto(ring[i], self.params)
        if store.snap_buffers is not None:  # its own: this step's; the others': as they are
            self.rt.publish_buffers()
            np.copyto(store.snap_buffers[i], store.buffers)
        counters = store.counters
        # the examples of the steps applied (the others may have counted
        # their next batch already)
        store.snap_meta[i] = (time.perf_counter(), counters[0, UPDATES],
                              self._applied_examples, counters[0, DROPPED])
        self._publish(control, SNAP_WRITTEN, written + 1)
        self._snap_at, self._snap_cost = began, time.perf_counter() - began
        return True

    def _save_checkpoint(self) -> None:
        ckpt = self.store.ckpt
        np.copyto(ckpt["params"], self.params)
        for dst, src in zip(ckpt["state"], self.state):
            np.copyto(dst, src)
        self._publish(self.control, CKPT_STEP, self.step)

    def on_stop(self) -> None:
        """Worker 0 hands its replica and rule state to the store: the
        monitor writes the final checkpoint, and returns the parameters,
        from there."""
        self._hand_over()
        if self.rank == 0:
            for dst, src in zip(self.store.state, self.state):
                np.copyto(dst, src)
            self._publish_params(self.step)

    def on_abort(self) -> None:
        """As ``on_stop``: the replica is at a step boundary (an abort
        leaves a wait before the step's mean, or ends the program between
        ops), and without it the run would return the initial parameters."""
        self.on_stop()

    def _publish_params(self, step: int) -> None:
        np.copyto(self.store.params, self.params)
        self._publish(self.store.published, 0, step)

    def finish(self) -> None:
        if self.step == 0:
            return
        if self.rank == 0:
            self.on_stop()  # the hand-over too
            return
        self._hand_over()
        published = self.store.published
        self._wait(lambda: published[0] >= self.step, f"worker 0 to publish step {self.step}")
        if not np.array_equal(self.params, self.store.params, equal_nan=True):
            raise RuntimeError(f"worker {self.rank}'s replica of the parameters differs from "
                               f"worker 0's after step {self.step}; please report this bug")


class ShardedStep(_Step):
    def __init__(self, runtime):
        super().__init__(runtime)
        self.next_ckpt = None  # the last worker through a step saves (see contribute)
        from ...server.kernels import mean_of_two_finite_for  # Numba: at start-up, off the clock

        params = self.store.params
        self.acc, self.tmp = arrays.empty_like(params), arrays.empty_like(params)
        # on a device: the weighted mean in torch (``reduce.WeightedMean``)
        self.two = None if arrays.is_tensor(params) else mean_of_two_finite_for(params.dtype)
        self.half = None if self.two is None else params.dtype.type(0.5)
        # Local AdaAlter's shared sums (``store.sums``), or None
        self.sums = SharedSums(self.store.sums) if self.store.sums is not None else None

    def begin(self) -> None:
        """With backup workers the first N arrivals count: wait (bounded)
        until every worker has left the start signal's wait, so that all
        start the first step together, as the sim's do. The start signal is
        polled with a back-off of up to a millisecond, and the first to wake
        could otherwise run whole steps (all of a short run) before the last
        one wakes, which would then skip them."""
        if self.rt.strategy.backup_workers:
            status = self.store.status
            self._wait(lambda: not (status == READY).any(), "every worker to start",
                       may_stop=True)

    def contribute(self, examples: int) -> int:
        """The slot is written; run the step's three barriers. Returns how
        many steps the others completed without this worker (late only)."""
        store = self.store
        sync = store.sync
        step = self.step
        rt = self.rt
        counted = self.workers - rt.strategy.backup_workers
        store.slot_examples[self.rank] = examples
        if examples:  # a message (``all_reduce``: none without examples)
            self.sent = step
        if self.every and (step + 1) % self.every == 0:
            self._checkpoint_step(step + 1)
        if counted == self.workers:
            return self._contribute_all(step)
        control = self.control
        with store.holding_sync(self.rank):  # the lock STOP_AT is set under (``_boundary``)
            order = -1
            if control[STOP_AT] and step >= control[STOP_AT]:
                order = -2  # a worker stopped here: counted, this one would wait for no one
            elif sync[STEP] == step and sync[ARRIVED] < counted:
                order = int(sync[ARRIVED])
                store.contributors[order] = self.rank
                sync[ARRIVED] += 1
            open_step = sync[STEP] == step  # late to a step not yet applied
        if order == -2:
            raise Stopped()
        if order < 0:
            return self._late(step, open_step)
        self._wait_count(ARRIVED, counted, step, "arrive at step", may_stop=True)
        ranks = sorted(int(r) for r in store.contributors[:counted])
        shards = [s for s in range(len(store.bounds)) if s % counted == order]
        sums, ok = self._reduce(ranks, shards)
        if not ok:
            sync[BAD_STEP] = step
        with store.holding_sync(self.rank):
            sync[REDUCED] += 1
        self._wait_count(REDUCED, counted, step, "sum step")
        bad = sync[BAD_STEP] == step
        self._apply(ranks, shards, sums, step, bad)
        with store.holding_sync(self.rank):
            sync[APPLIED] += 1
            if sync[APPLIED] == counted:  # the last one through opens the next step
                sync[ARRIVED] = sync[REDUCED] = sync[APPLIED] = 0
                if self.every and (step + 1) % self.every == 0:  # the buffer is free
                    self._save_checkpoint(step + 1)  # nobody can apply until STEP moves on
                sync[STEP] = step + 1
        self._wait_count(STEP, step + 1, step, "apply step")
        if order == 0:
            rt.counters[DROPPED if bad else UPDATES] += 1
            if not bad:
                rt.staleness[0] += 1
        self.step = step + 1
        if self.control[STOP]:
            self._boundary()
        return 0

    def _contribute_all(self, step: int) -> int:
        """Every worker counts (no backups): the same three barriers without
        the lock. Each worker raises its own mark at each barrier
        (``store.marks``) and waits for everyone's; worker r sums and
        applies the shards s with s % N == r. Two workers meeting at the
        lock's counters took turns in the kernel (a futex sleep and wake-up
        each time) three times a step. Worker 0 completes the step (clock,
        counters, checkpoint) once all have applied: no other worker can
        apply the next step before worker 0 has arrived at it."""
        store, rt, rank = self.store, self.rt, self.rank
        arrived, summed, applied = store.marks
        target = step + 1
        self._publish(arrived, rank, target)
        self._wait_marks(arrived, target, step, "arrive at step", may_stop=True)
        ranks = list(range(self.workers))
        shards = [s for s in range(len(store.bounds)) if s % self.workers == rank]
        sums, ok = self._reduce(ranks, shards)
        if not ok:
            store.sync[BAD_STEP] = step
        self._publish(summed, rank, target)
        self._wait_marks(summed, target, step, "sum step")
        bad = store.sync[BAD_STEP] == step
        self._apply(ranks, shards, sums, step, bad)
        self._publish(applied, rank, target)
        self._wait_marks(applied, target, step, "apply step")
        if rank == 0:
            rt.counters[DROPPED if bad else UPDATES] += 1
            if not bad:
                rt.staleness[0] += 1
            if self.every and target % self.every == 0:  # the buffer is free
                self._save_checkpoint(target, ordered=False)
            store.sync[STEP] = target
        self.step = target
        if self.control[STOP]:
            self._boundary()
        return 0

    def _apply(self, ranks: list[int], shards: list[int], means: list, step: int,
               bad: bool) -> None:
        """This worker's ``shards`` take their ``means`` as update ``step``,
        unless it is ``bad`` (dropped: each shard's rule is told). Local
        AdaAlter (``server/summed.py``): on those shards, the shared sums
        then take the mean of what the counted workers' steps added
        (``store.sum_slots``). Between the barriers: every a_k is in, and
        no worker reads S before all applied."""
        sums, store = self.sums, self.store
        for s, acc in zip(shards, means):
            if self.rt.shards[s].apply_sum(acc, step, self.rank, ok=not bad):
                store.versions[s] += 1
        if sums is None or bad:
            return
        examples = [int(store.slot_examples[k]) for k in ranks]
        for s in shards:  # the drift's scratch is free once its shard is applied
            a, b = store.bounds[s]
            sums.add_mean([slots[:, a:b] for slots in store.sum_slots], ranks, examples,
                          self.acc[a:b], self.tmp[a:b], a, b)

    def _wait_marks(self, marks, target: int, step: int, what: str,
                    may_stop: bool = False) -> None:
        self._wait(lambda: marks.min() >= target, f"{self.workers} workers to {what} {step}",
                   may_stop)

    def _save_checkpoint(self, step: int, ordered: bool = True) -> None:
        """``ordered``: called under the sync lock (else the write is published)."""
        store = self.store
        arrays.copyto(store.ckpt["params"], store.params)
        for dst, src in zip(store.ckpt["state"], store.state):
            arrays.copyto(dst, src)
        if ordered:
            self.control[CKPT_STEP] = step
        else:
            self._publish(self.control, CKPT_STEP, step)

    def _late(self, step: int, open_step: bool) -> int:
        """Dropped: N others arrived first. Wait for the step to be applied,
        then join the next one, as the sim's late workers do: one that
        arrived while the step was still open (``open_step``) joins the step
        after it, whatever this worker's wake-up let the others do
        meanwhile (it would otherwise skip batches for no slowness of its
        own, the last one included); one that arrived after the step was
        applied was slower than a whole step, and joins the current step.
        Returns the steps skipped. Its message of the step, if it sent one,
        is dropped: its sender goes back to before it (``Sender.take_back``)."""
        self.rt.counters[LATE] += 1
        if self.sent == step and self.rt.sender is not None:
            self.rt.sender.take_back()
        self._wait_count(STEP, step + 1, step, "apply step", may_stop=True)
        current = step + 1 if open_step else int(self.store.sync[STEP])
        self.step = current
        return current - (step + 1)

    def _wait_count(self, column: int, target: int, step: int, what: str,
                    may_stop: bool = False) -> None:
        counts = self.store.sync
        self._wait(lambda: counts[column] >= target, f"{target} workers to {what} {step}",
                   may_stop)

    def _reduce(self, ranks: list[int], shards: list[int]) -> tuple[list, bool]:
        """The weighted mean of the counted slots on each of ``shards``, and
        whether all of it is finite. Two equal parts (the usual case): one
        compiled pass a shard (``kernels.mean_of_two_finite``, the same bits)."""
        store = self.store
        examples = [int(store.slot_examples[k]) for k in ranks]
        bounds = [store.bounds[s] for s in shards]
        if self.two is not None and len(ranks) == 2 and examples[0] == examples[1] > 0:
            first, second = store.slots[ranks[0]], store.slots[ranks[1]]
            sums, ok = [], True
            for a, b in bounds:
                ok &= bool(self.two(first[a:b], second[a:b], self.acc[a:b], self.half))
                sums.append(self.acc[a:b])
            return sums, ok
        return step_sums(store.slots, ranks, examples, bounds, self.acc, self.tmp)

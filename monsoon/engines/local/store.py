"""The local parameter store: shared memory plus one lock and one version
counter per shard.

Everything workers share lives in one ``SharedArrays`` block:

- ``params``: the flat parameter vector, and the rule state arrays beside it
  (on a GPU, ``to_device``: tensors there, with readers, slots and ``ckpt``);
- ``reader.*[k]``: what a delay-aware rule remembers of worker k's last read
  (AdaRevision's gradient sum, DC-ASGD's parameters sent to k);
- ``versions[s]``: updates applied to shard s (a push: a locked in-place
  update), ``landed``: shard 0's pushes, with examples (``row_copy``);
  ``lock_owner``, ``lock_claims``: whose each lock is (``holding``);
- ``slots[k]``, ``slot_examples[k]``: worker k's contribution to the current
  synchronous step and its examples; ``sync[STEP]`` counts completed steps,
  ``sync[ARRIVED|REDUCED|APPLIED]`` the arrivals at its three barriers,
  ``contributors`` the ranks that count (arrival order), ``sync[BAD_STEP]`` a
  step whose sum is not finite; without backup workers ``marks[b, k]``
  instead: the steps worker k is through at barrier b, raised by k alone;
- ``sums.<i>``, ``sum_slots.<i>[k]``: Local AdaAlter's shared sums S and what
  worker k's steps added to them this round (``server/summed.py``);
- replicated synchronous steps (small models, ``synchronous.py``):
  ``rep_slots[step % 2, k]``, ``rep_examples``, ``arrivals[k]`` and
  ``published``; ``snap.params[i]``, ``snap.meta[i]``: a ring of loss-curve
  snapshots worker 0 writes every ``control[SNAP_EVERY]`` steps, read by the
  monitor without asking (``control[SNAP_WRITTEN|SNAP_READ]``);
- ``buffers[k]``: worker k's model buffers after its last gradient, for
  curve rows and snapshot checkpoints (``snap.buffers[i]``: the ring's);
- ``clocks[k]``: the SSP clocks worker k has finished (``clocks.py``);
- ``counters[k]``: worker k's examples, updates, dropped updates and late
  (backup) gradients, ``local_counts[k]`` its local steps on its own copy
  (local SGD, EASGD: applied, and dropped for a non-finite gradient), and
  ``live[k]`` (losses: ``live.add_loss``'s cells; staleness sum, count, max,
  the monitor resets it), ``sent_counts[k]``, ``stale_counts[k]`` (its sender's and
  staleness counts: ``lost_report``), by worker k only: no lock; ``status``, ``control``;
- ``ckpt.*`` (synchronous checkpoints): one step boundary's parameters and rule state.

Locks are ``multiprocessing`` locks for processes, ``threading`` locks for
threads. After a lock-free wait on a counter, a reader takes and releases the
lock once, which orders its later reads after the writer's (weak memory order).
The monitor releases the locks of a worker killed holding them.
"""
from __future__ import annotations

import contextlib
import threading
import time

import numpy as np

from ... import arrays
from ...record.live import LOSS_CELLS
from ...rules import Rule
from ...server.shards import shard_bounds
from ...record.progress import DROPPED, EXAMPLES, LATE, UPDATES  # noqa: F401 - re-exported
from ...shared_memory import SharedArrays

# counters columns (EXAMPLES, UPDATES, DROPPED, LATE): a checkpoint's
# ``counters`` layout (``record/progress.py``), which holds the store's as they are
# local_counts columns
LOCAL_APPLIED, LOCAL_DROPPED = 0, 1
# sync columns
STEP, ARRIVED, REDUCED, APPLIED, BAD_STEP = 0, 1, 2, 3, 4
# control columns: START and ABORT; STOP (the monitor asks synchronous
# workers to stop at a step boundary), STOP_AT (the step they stop at, set
# by the first worker to see STOP), CKPT_STEP (the step the checkpoint
# buffer holds, 0: empty); SNAP_ASKED (snapshot requests the monitor raised
# for the loss curve) and SNAP_SERVED (the last one a replicated step served);
# SNAP_EVERY, SNAP_WRITTEN, SNAP_READ: the replicated step's snapshot ring
(START, ABORT, STOP, STOP_AT, CKPT_STEP, SNAP_ASKED, SNAP_SERVED, SNAP_EVERY, SNAP_WRITTEN,
 SNAP_READ) = range(10)
# the ring holds at most this many snapshots, and at most this many bytes
SNAP_RING, SNAP_RING_BYTES = 64, 16 << 20
# live columns (``live[k]``, with live series): the losses' cells, staleness, and
# WRITING, odd while worker k writes its losses (``live_figures`` reads them whole)
STALE_SUM, STALE_N, STALE_MAX, WRITING = range(LOSS_CELLS, LOSS_CELLS + 4)
# ``sent_counts[k]`` columns: worker k's ``Sender`` counts (``runtime.SharedSender``);
# ``stale_counts[k, s]``: its pushes of staleness s (the last cell: that and over)
SENT_FIELDS = ("sent", "raw", "received", "messages")
STALE_BINS = 1024
LIVE_TRIES = 100  # readings of a worker's losses before its last whole one stands in
# status values
STARTING, READY, RUNNING, DONE, FAILED, ABORTED = range(6)
# how long the monitor watches an owner-less lock a dead worker claimed
ORPHAN_WATCH_S = 0.5


class ParameterStore:
    def __init__(self, w0: np.ndarray, rule: Rule, workers: int, shards: int,
                 sync_slots: bool, backend: str, mp_context=None, replicated: bool = False,
                 checkpoint_buffer: bool = False, snapshot_ring: bool = False,
                 live: bool = False, extra_layout: dict | None = None,
                 sums: list | None = None, buffers: np.ndarray | None = None):
        """``sums``: the initial shared sums (``summed.initial_sums``), or None;
        ``buffers``: the model's starting buffers, flat, for every worker's
        slot (None: no slots)."""
        n = w0.size
        dtype = str(w0.dtype)
        template = rule.init(n, w0.dtype)
        reader = rule.init_reader(n, w0.dtype)
        layout = {"params": ((n,), dtype),
                  "versions": ((shards,), "int64"),
                  "lock_owner": ((shards + 1,), "int64"),
                  "lock_claims": ((workers,), "int64"),
                  "counters": ((workers, 4), "int64"),
                  "landed": ((4,), "int64"),
                  "local_counts": ((workers, 2), "int64"),
                  "sent_counts": ((workers, len(SENT_FIELDS)), "int64"),
                  "stale_counts": ((workers, STALE_BINS), "int64"),
                  "status": ((workers,), "int64"),
                  "clocks": ((workers,), "int64"),
                  "control": ((10,), "int64"),
                  "sync": ((5,), "int64"),
                  "contributors": ((workers,), "int64"),
                  "slot_examples": ((workers,), "int64")}
        for field, arr in zip(template._fields, template):
            layout["state." + field] = (arr.shape, str(arr.dtype))
        for field, arr in zip(reader._fields, reader):
            layout["reader." + field] = ((workers,) + arr.shape, str(arr.dtype))
        if live:
            layout["live"] = ((workers, LOSS_CELLS + 4), "float64")
        if sync_slots and replicated:
            layout["rep_slots"] = ((2, workers, n), dtype)
            layout["rep_examples"] = ((2, workers), "int64")
            layout["arrivals"] = ((workers,), "int64")
            layout["published"] = ((1,), "int64")
            if snapshot_ring:
                row = w0.nbytes + (0 if buffers is None else workers * buffers.size * 8)
                ring = max(2, min(SNAP_RING, SNAP_RING_BYTES // max(row, 1)))
                layout["snap.params"] = ((ring, n), dtype)
                layout["snap.meta"] = ((ring, 4), "float64")
                if buffers is not None:
                    layout["snap.buffers"] = ((ring, workers, buffers.size), "float64")
        elif sync_slots:
            layout["slots"] = ((workers, n), dtype)
            layout["marks"] = ((3, workers), "int64")  # steps each worker is through, per barrier
        if checkpoint_buffer:  # worker 0 copies a step's parameters here (synchronous.py)
            layout["ckpt.params"] = ((n,), dtype)
            for field, arr in zip(template._fields, template):
                layout["ckpt.state." + field] = (arr.shape, str(arr.dtype))
        for i, arr in enumerate(sums or ()):
            layout[f"sums.{i}"] = (arr.shape, str(arr.dtype))
            layout[f"sum_slots.{i}"] = ((workers,) + arr.shape, str(arr.dtype))
        if buffers is not None:
            layout["buffers"] = ((workers, buffers.size), "float64")
        layout.update(extra_layout or {})  # e.g. the senders' checkpoint slots (checkpointing.py)
        self.memory = SharedArrays(layout, in_process=(backend != "processes"))
        self.memory["params"][:] = w0
        for i, arr in enumerate(sums or ()):
            self.memory[f"sums.{i}"][:] = arr
        if buffers is not None:
            self.memory["buffers"][:] = buffers
        for field, arr in zip(template._fields, template):
            self.memory["state." + field][:] = arr
        self.memory["sync"][BAD_STEP] = -1
        self.state_type = type(template)
        self.reader_type = type(reader)
        self.bounds = shard_bounds(n, shards)
        self.processes = backend == "processes"
        if self.processes:
            self.locks = [mp_context.Lock() for _ in range(shards)]
            self.sync_lock = mp_context.Lock()
        else:
            self.locks = [threading.Lock() for _ in range(shards)]
            self.sync_lock = threading.Lock()
        self._attach()

    def _attach(self):
        m = self.memory
        self.params = m["params"]
        self.versions = m["versions"]
        self.lock_owner = m["lock_owner"]
        self.lock_claims = m["lock_claims"]
        self.counters = m["counters"]
        self.landed = m["landed"]
        self.local_counts = m["local_counts"]
        self.sent_counts, self.stale_counts = m["sent_counts"], m["stale_counts"]
        self.status = m["status"]
        self.clocks = m["clocks"]
        self.control = m["control"]
        self.sync = m["sync"]
        self.contributors = m["contributors"]
        self.slot_examples = m["slot_examples"]
        self.slots = m.arrays.get("slots")
        self.marks = m.arrays.get("marks")
        self.replicated = "rep_slots" in m.arrays
        if self.replicated:
            self.rep_slots = m["rep_slots"]
            self.rep_examples = m["rep_examples"]
            self.arrivals = m["arrivals"]
            self.published = m["published"]
        self.live = m.arrays.get("live")
        count = sum(1 for name in m.arrays if name.startswith("sums."))
        self.sums = [m[f"sums.{i}"] for i in range(count)] if count else None
        self.sum_slots = [m[f"sum_slots.{i}"] for i in range(count)] if count else None
        self.snap_params = m.arrays.get("snap.params")
        self.snap_meta = m.arrays.get("snap.meta")
        self.buffers = m.arrays.get("buffers")
        self.snap_buffers = m.arrays.get("snap.buffers")
        self.state = self.state_type(*(m["state." + f] for f in self.state_type._fields))
        self.ckpt = None
        if "ckpt.params" in m.arrays:
            self.ckpt = {"params": m["ckpt.params"],
                         "state": self.state_type(*(m["ckpt.state." + f]
                                                    for f in self.state_type._fields))}
        readers = [m["reader." + f] for f in self.reader_type._fields]
        self.has_readers = bool(readers)
        self.device = None  # host memory (``to_device``)
        self._readers = None

    def to_device(self, device) -> None:
        """Keep the parameters, rule state, readers, slots and checkpoint
        buffer as tensors on ``device`` from now on (threads and the inline
        runner only: a process cannot share them). Called once, after a
        resumed run's arrays are restored."""
        import torch

        if self.processes:
            raise ValueError("worker processes share host memory, not a device's")

        def moved(a):
            return torch.from_numpy(np.ascontiguousarray(a)).to(device)

        self.device = torch.device(device)
        self.params = moved(self.params)
        self.state = self.state_type(*(moved(a) for a in self.state))
        self._readers = {f: moved(self.memory["reader." + f]) for f in self.reader_type._fields}
        if self.slots is not None:
            self.slots = moved(self.slots)
        if self.sums is not None:
            self.sums = [moved(a) for a in self.sums]
            self.sum_slots = [moved(a) for a in self.sum_slots]
        if self.ckpt is not None:
            self.ckpt = {"params": moved(self.ckpt["params"]),
                         "state": self.state_type(*(moved(a) for a in self.ckpt["state"]))}

    def readers(self) -> list | None:
        """What the server remembers of each worker's last read, by worker;
        None for rules that remember nothing."""
        if not self.has_readers:
            return None
        readers = self._readers or {f: self.memory["reader." + f]
                                    for f in self.reader_type._fields}
        fields = [readers[f] for f in self.reader_type._fields]
        return [self.reader_type(*(r[k] for r in fields)) for k in range(len(self.counters))]

    def __getstate__(self):
        # Locks travel separately, as process arguments (multiprocessing only
        # lets them cross at process creation); see ``attach_locks``.
        return {"memory": self.memory, "state_type": self.state_type,
                "reader_type": self.reader_type, "bounds": self.bounds,
                "processes": self.processes}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.locks, self.sync_lock = None, None
        self._attach()

    def attach_locks(self, locks, sync_lock) -> None:
        self.locks, self.sync_lock = locks, sync_lock

    @contextlib.contextmanager
    def holding(self, s: int, rank: int):
        """Shard ``s``'s lock (``s == len(bounds)``: the synchronous step's,
        ``holding_sync``), held by worker ``rank``, who takes at most one at
        a time. It writes its claim (``lock_claims[rank]`` = 1 + the lock),
        takes the lock, writes itself as owner (``lock_owner[s]`` = 1 +
        rank); on the way out it clears the owner, releases, clears the
        claim. So a worker that dies holding the lock is its owner, or, in
        the moment between taking and marking it (or clearing and
        releasing), its claimant (``release_locks_of``)."""
        lock = self.locks[s] if s < len(self.locks) else self.sync_lock
        self.lock_claims[rank] = s + 1
        lock.acquire()
        self.lock_owner[s] = rank + 1
        try:
            yield
        finally:
            self.lock_owner[s] = 0
            try:
                lock.release()
            except ValueError:  # the monitor took this worker for dead and released it
                pass
            self.lock_claims[rank] = 0

    def holding_sync(self, rank: int):
        """The synchronous step's lock, as ``holding`` takes a shard's."""
        return self.holding(len(self.locks), rank)

    def release_locks_of(self, rank: int) -> list[int]:
        """Release the locks a dead worker ``rank`` held (the monitor, once
        its process has exited), so the survivors do not wait on them for
        ever; its half-applied update stays, as any asynchronous update may.
        The locks it owned, and the one it claimed if that has no owner and
        stays untakeable for ``ORPHAN_WATCH_S`` (a live holder's owner-less
        moment lasts a few bytecodes). The locks released (``len(bounds)``:
        the synchronous step's)."""
        locks = list(self.locks) + [self.sync_lock]
        claimed = int(self.lock_claims[rank]) - 1
        released = []
        for i, lock in enumerate(locks):
            owner = int(self.lock_owner[i])
            if owner == rank + 1:
                self.lock_owner[i] = 0
            elif not (owner == 0 and i == claimed and self._orphaned(i, lock)):
                continue
            try:
                lock.release()
            except ValueError:  # not held after all
                continue
            released.append(i)
        self.lock_claims[rank] = 0
        return released

    def _orphaned(self, i: int, lock) -> bool:
        """Lock ``i`` is held by no live worker: for ``ORPHAN_WATCH_S`` no
        one could take it and no one wrote itself as its owner."""
        deadline = time.monotonic() + ORPHAN_WATCH_S
        while time.monotonic() < deadline:
            if self.lock_owner[i] != 0:
                return False
            if lock.acquire(False):
                lock.release()
                return False
            time.sleep(0.002)
        return self.lock_owner[i] == 0

    @property
    def aborted(self) -> bool:
        return bool(self.control[ABORT])

    def abort(self) -> None:
        self.control[ABORT] = 1

    def totals(self) -> np.ndarray:
        """Examples, updates, dropped updates and late gradients, summed over workers."""
        return self.counters.sum(axis=0)

    def row_copy(self, timeout: float):
        """The parameters (a host copy) and ``landed``, read together under
        shard 0's lock, for a curve row; None where the lock is not had
        within ``timeout`` (a worker lost holding it: the monitor releases
        it at a later wake). ``landed``: the pushes shard 0 applied in this
        run, in ``counters``' columns (their examples; the pushes dropped at
        a worker, with theirs), written under that lock, where a worker's
        ``counters`` count a push's examples before it lands, its update after."""
        lock = self.locks[0]
        if not lock.acquire(True, timeout):
            return None
        try:
            return np.array(arrays.to_host(self.params), copy=True), self.landed.copy()
        finally:
            lock.release()

    def local_totals(self) -> tuple[int, int]:
        """Local steps applied and dropped, summed over workers."""
        applied, dropped = self.local_counts.sum(axis=0)
        return int(applied), int(dropped)

    def live_figures(self, workers: int) -> tuple[dict, tuple]:
        """Each worker's cumulative figures for ``Recorder.live``, and the
        staleness (sum, count, max since the last call)."""
        live, counters = self.live, self.counters
        figures = {k: {"losses": self._losses(k),
                       "examples": int(counters[k, EXAMPLES]),
                       "updates": int(counters[k, UPDATES])} for k in range(workers)}
        biggest = float(live[:, STALE_MAX].max())
        live[:, STALE_MAX] = 0  # a worker's max written meanwhile is lost: a live figure
        return figures, (float(live[:, STALE_SUM].sum()), int(live[:, STALE_N].sum()), biggest)

    def _losses(self, k: int) -> list:
        """Worker k's loss cells, read whole: its ``WRITING`` mark even (no
        write under way) and the same after the reading; where a worker
        paused mid-write keeps it odd, its last whole reading stands in."""
        row, kept = self.live[k], self.__dict__.setdefault("_losses_read", {})
        for _ in range(LIVE_TRIES):
            mark = row[WRITING]
            if not mark % 2:
                cells = row[:LOSS_CELLS].tolist()
                if row[WRITING] == mark:
                    kept[k] = cells
                    return cells
        return kept.get(k, [0.0] * LOSS_CELLS)

    def sent(self) -> int:
        """The bytes the workers' senders have sent (a lost worker's until it was lost)."""
        return int(self.sent_counts[:, 0].sum())

    def lost_report(self, rank: int) -> dict:
        """What worker ``rank``, lost without a report, counted until then,
        as ``RunTally.add`` reads a report: its staleness counts (those of
        ``STALE_BINS - 1`` and over at that one) and its sender's counts (no
        residual: it went with the worker). Its examples and updates are in
        ``counters``."""
        stale = self.stale_counts[rank]
        return {"staleness": {int(s): int(stale[s]) for s in np.flatnonzero(stale)},
                "traffic": {**{k: int(v) for k, v in zip(SENT_FIELDS, self.sent_counts[rank])},
                            "residual_norm": 0.0}}

    def close(self) -> None:
        for name in ("_readers", "params", "versions", "counters", "landed", "local_counts",
                     "sent_counts", "stale_counts", "status",
                     "clocks", "control", "sync", "contributors", "slot_examples", "slots", "marks", "state",
                     "rep_slots", "rep_examples", "arrivals", "published", "ckpt",
                     "snap_params", "snap_meta", "snap_buffers", "buffers", "live", "sums", "sum_slots"):
            self.__dict__.pop(name, None)
        self.memory.close()

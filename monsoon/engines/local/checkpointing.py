"""What the local engine saves and restores (the file format and counts
are ``record/checkpoints.py``'s and ``record/progress.py``'s).

Two kinds of checkpoint, by strategy:

- exact (``serial``; ``sync`` and the other strategies whose workers share
  the parameters and meet at every step): taken at a step boundary, so the
  parameters and the rule state are those after exactly ``step`` steps, and
  a resumed run skips those steps' batches and ends bit-identical (the data
  order is a pure function of the seed and the step, ``batches.py``; a
  model's draws, Dropout's, of the seed, rank and gradients done: ``seed_rng``).
- snapshot (``async``, ``hogwild``, ``local-sgd``, ``easgd``): the shared
  parameters and rule state as the monitor reads them while workers run (a
  racy read), each worker's position from the examples it has done, and the
  private copies the workers report when they stop. A stopped worker lands
  every batch it counted (``server/worker.py``'s ``LANDING``; a pushing
  worker counts its batches when it pushes them), so the final checkpoint's
  positions and updates agree. Resuming carries such a run on rather than
  replaying it.

Runs of a compiled per-example loop (sparse Hogwild!, serial) count their
position in epochs (one op is one epoch's pass): they are checkpointed at
the end of an epoch, at most once per epoch; serial's are exact.

Either way the checkpoint holds the counters (and, where workers take local
steps, ``local_updates`` and ``dropped_local_updates``) and the recorder's
rows up to it, and the ``totals`` known then (``monitor/tally.py``): the
workers' own counts (staleness, traffic, SSP's clocks) in a stopped run's
final one, serial's, sync's periodic ones (``save_traffic``) and a snapshot
a run ended on (written again); other snapshots, none (``tally.restarted``).
An exact one of a compressed run holds each worker's sender state too
(``save_sender``, ``hand_over_sender``); all, the buffers (below).

Snapshot checkpoints, and serial's, cost at most about 5% of a run: after
each write, the next waits at least 19 times as long as the write took (the
interval in updates is a floor, not a promise, on models whose updates take
microseconds). Every step-boundary checkpoint of the other exact strategies
is written: their workers fill a buffer at the step and go on, the monitor
copies it out and writes the copy, and the workers wait at the next
checkpoint step only if the monitor has not yet taken the previous one.
"""
from __future__ import annotations

import time

import numpy as np

from ...problems.buffers import combine, flat, unflat
from ...record import checkpoints
from ...record.progress import counters_counts, counts

# After a write taking t seconds, the next waits COST_FACTOR * t: <= 5% of the run.
COST_FACTOR = 19


class RunCheckpoints(checkpoints.Checkpointer):
    """The shared keeper, with the local engine's cost floor, counters,
    positions and private copies (the monitor hands it the curve's rows to
    write; a resumed run's go to the recorder)."""

    def __init__(self, directory, every: int, resume_dir, ident: dict, exact: bool, recorder):
        super().__init__(directory, every, resume_dir, ident, recorder)
        self.exact = exact
        self.ready_at = 0.0  # perf_counter time before which no periodic write is due

    def allowed(self) -> bool:
        """Whether a periodic checkpoint may be written now (the cost floor)."""
        return time.perf_counter() >= self.ready_at

    # -- reading ----------------------------------------------------------
    @staticmethod
    def restore(start, store) -> None:
        start.restore(store.params, store.state)
        store.counters[:] = start.saved.arrays["counters"]
        store.local_counts[0] = start.local  # the local steps' totals go on from worker 0's row

    # -- writing ----------------------------------------------------------
    def write(self, *, params, state, counters: np.ndarray, positions, time_s: float, rows,
              reason: str, exact: bool, private: dict | None = None,
              extra: dict | None = None, local: tuple[int, int] | None = None,
              totals: dict | None = None):
        """``extra``: more arrays (the senders' ``sender.<name>``);
        ``local``: the local steps applied and dropped (None: none taken);
        ``totals``: the counts known so far (``tally.run_totals``), which
        only the final checkpoint of a parallel run has whole."""
        if not self.directory:
            return None
        t0 = time.perf_counter()
        arrays = {"counters": counters, **(extra or {}),
                  **checkpoints.private_arrays(private or {})}
        meta = counts(reason, **counters_counts(counters), exact=exact, positions=positions,
                      local=local, totals=totals)
        self.save(meta["updates"] + meta["dropped"], float(time_s), params, state, meta, arrays,
                  rows)
        end = time.perf_counter()
        self.ready_at = end + COST_FACTOR * (end - t0)
        return self.last_path


# -- compressed runs: each worker's sender (error-feedback residual, the
# compressor's random stream or PowerSGD's Q) -------------------------------
#
# Every worker writes its sender's state into the store at each checkpoint
# step s (s % every == 0), before it arrives at the step's barrier, so that
# it is there once worker 0 (or the last through a sharded step) hands the
# step's parameters to the monitor. The slots are double-buffered by
# checkpoint (rows s // every % 2) and tagged with s (-1 while written): the
# monitor copies them with the step's parameters, before it frees the
# buffer, and workers wait for the buffer before they write the next
# checkpoint's, so the slots hold s then; it checks that every tag reads s
# before and after its copy all the same.
#
# A third row (``STOP_ROW``) holds each worker's state at the step boundary
# where it stopped or ended, written as it does (``hand_over_sender``), so
# that the monitor's final checkpoint of a stopped run has it whatever the
# step (with no periodic checkpoints too). A worker encodes its message of
# a step before it arrives there (``compressing``); one that then stops
# without the step applied (it left the arrival wait: another stopped at
# that boundary) hands over its state from before that message. The slots
# exist wherever the run has a folder and its checkpoints hold senders.

TAG = "ckpt.sender.tag"
STOP_ROW = 2


def sender_slots(compression, n: int, dtype, workers: int) -> dict:
    """The store's extra layout for the senders' checkpoint slots."""
    layout = {TAG: ((3, workers), "int64")}
    for name, (shape, dt) in compression.sender_layout(n, dtype).items():
        layout["ckpt.sender." + name] = ((3, workers) + tuple(shape), dt)
    return layout


def hands_over_senders(store) -> bool:
    """Whether the store has the senders' slots (a worker's sender then keeps
    its state from before its last message: ``Sender.keep_previous``)."""
    return TAG in store.memory.arrays


def save_sender(store, sender, rank: int, step: int, every: int) -> None:
    """In a worker, at checkpoint step ``step``: its sender's state into its slot."""
    if TAG in store.memory.arrays:
        _write_sender(store, step // every % 2, rank, step,
                      sender.state(store.params.size, store.params.dtype))


def hand_over_sender(store, sender, rank: int, step: int, before_last: bool) -> None:
    """In a worker that stopped or ended at step boundary ``step``: its
    sender's state there into the stop row; ``before_last``: its last
    message was for step ``step`` itself, which was not applied, so the
    state from before that message."""
    if TAG in store.memory.arrays:
        _write_sender(store, STOP_ROW, rank, step,
                      sender.state(store.params.size, store.params.dtype, before_last))


def _write_sender(store, row: int, rank: int, step: int, state: dict) -> None:
    arrays = store.memory.arrays
    tags = arrays[TAG]
    tags[row, rank] = -1
    for name, value in state.items():
        arrays["ckpt.sender." + name][row, rank] = value
    tags[row, rank] = step


def read_senders(store, step: int, every: int, stopped: bool = False) -> dict | None:
    """In the monitor: every sender's state at checkpoint step ``step`` (or,
    ``stopped``, where the workers stopped or ended: the stop row), as a
    checkpoint's ``sender.<name>`` arrays (workers first); {} where the run
    keeps none; None where the slots do not hold that step (a stop between
    checkpoint steps, workers two checkpoints on, or a worker that did not
    hand its state over: one lost)."""
    arrays = store.memory.arrays
    if TAG not in arrays:
        return {}
    if stopped:
        row = STOP_ROW
    elif not every or step % every:
        return None
    else:
        row = step // every % 2
    tags = arrays[TAG][row]
    if not (tags == step).all():
        return None
    out = {k.replace("ckpt.", "", 1): np.array(v[row], copy=True) for k, v in arrays.items()
           if k.startswith("ckpt.sender.") and k != TAG}
    return out if (tags == step).all() else None


# -- the senders' byte counts at checkpoint steps (exact runs) -------------
#
# A periodic checkpoint carries the run's totals so far (``monitor/tally.py``)
# where they are at hand: each worker writes its sender's counts
# (``Sender.stats``) beside its sender state (``save_sender``: at checkpoint
# step s, before it arrives there, its message of step s-1 counted), into
# row s // every % 2, tagged with s (-1 while written); the monitor reads
# them with the step's parameters. sync's staleness needs no slot: one
# count at 0 per applied step. Rows that do not all hold s (a backup worker
# skipped the step, a worker lost) leave the checkpoint's counts restarting
# there.

TRAFFIC, TRAFFIC_TAG = "ckpt.traffic", "ckpt.traffic.tag"
TRAFFIC_FIELDS = ("sent", "raw", "received", "messages", "residual_norm")


def traffic_slots(workers: int) -> dict:
    """The store's extra layout for the senders' counts at checkpoint steps."""
    return {TRAFFIC: ((2, workers, len(TRAFFIC_FIELDS)), "float64"),
            TRAFFIC_TAG: ((2, workers), "int64")}


def save_traffic(store, sender, rank: int, step: int, every: int) -> None:
    """In a worker, at checkpoint step ``step``: its sender's counts into its row."""
    arrays = store.memory.arrays
    if TRAFFIC in arrays:
        row, stats = step // every % 2, sender.stats()
        arrays[TRAFFIC_TAG][row, rank] = -1
        arrays[TRAFFIC][row, rank] = [stats[k] for k in TRAFFIC_FIELDS]
        arrays[TRAFFIC_TAG][row, rank] = step


def read_traffic(store, step: int, every: int) -> dict | None:
    """In the monitor: every worker's sender counts at checkpoint step
    ``step``, {rank: ``Sender.stats``}; None where the rows do not all hold
    that step (or the run keeps none)."""
    arrays = store.memory.arrays
    if TRAFFIC not in arrays or not every or step % every:
        return None
    row = step // every % 2
    tags = arrays[TRAFFIC_TAG][row]
    if not (tags == step).all():
        return None
    rows = np.array(arrays[TRAFFIC][row], copy=True)
    if not (tags == step).all():
        return None
    return {rank: {k: (float(v) if k == "residual_norm" else int(v))
                   for k, v in zip(TRAFFIC_FIELDS, values)}
            for rank, values in enumerate(rows)}


# -- a model's buffers (BatchNorm's running statistics) ---------------------
#
# An exact run's periodic checkpoint holds the buffers of the strategy's
# rule (``strategy.buffers``; sync: worker 0's) at its step. Every worker
# copies its buffers (``buffers.flat``) into its row of ``ckpt.buffers``
# where it writes its sender's state (``save_sender``: at checkpoint step s,
# before it arrives there, once the monitor has taken the previous
# checkpoint), tagged with s (-1 while written); the monitor combines the
# rows tagged s, of the workers that reached s, with the step's parameters.
# A worker whose stop leaves its step unapplied puts back the buffers it
# kept from before that step's forward pass (``synchronous.py``), so its
# report, and the final checkpoint that combines the reports as the
# result does, hold them at the stop's boundary. The rows exist wherever
# an exact parallel run has a folder and its model has buffers; their
# presence tells the workers to keep them (``keeps_step_buffers``).
# Serial's hold the problem's own; a snapshot, the workers' curve slots
# (``store.buffers``) combined as the monitor reads them, and a stopped
# run's final one, the buffers the workers reported, combined.

BUFFERS, BUFFERS_TAG = "ckpt.buffers", "ckpt.buffers.tag"


def buffer_slots(buffers: np.ndarray, workers: int) -> dict:
    """The store's extra layout for the buffers' checkpoint rows
    (``buffers``: the model's, flat)."""
    return {BUFFERS: ((workers, buffers.size), "float64"), BUFFERS_TAG: ((workers,), "int64")}


def keeps_step_buffers(store) -> bool:
    """Whether a worker keeps its buffers from before each step's forward
    pass (the store has the buffers' checkpoint rows)."""
    return BUFFERS in store.memory.arrays


def save_buffers(store, problem, rank: int, step: int) -> None:
    """In a worker, at checkpoint step ``step``: its model's buffers into its row."""
    arrays = store.memory.arrays
    if BUFFERS in arrays:
        tags = arrays[BUFFERS_TAG]
        tags[rank] = -1
        arrays[BUFFERS][rank] = flat(problem.state())
        tags[rank] = step


def read_buffers(store, step: int, template: dict | None, rule: str) -> dict | None:
    """In the monitor: the buffers at checkpoint step ``step``, combined by
    ``rule`` over the rows tagged ``step`` (``template``: the buffers'
    names and shapes), as a checkpoint's ``buffer.<name>`` arrays; {} where
    the run keeps none; None where no row holds that step (with backup
    workers, every worker may have skipped it)."""
    arrays = store.memory.arrays
    if BUFFERS not in arrays:
        return {}
    tags = arrays[BUFFERS_TAG]
    rows = {k: unflat(arrays[BUFFERS][k], template) for k in np.flatnonzero(tags == step)}
    rows = {int(k): row for k, row in rows.items() if tags[k] == step}  # none rewritten meanwhile
    return checkpoints.held_buffers(combine(rows, rule)) if rows else None

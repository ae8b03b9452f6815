"""What the local engine saves and restores (the file format is
``record/checkpoints.py``).

Two kinds of checkpoint, by strategy:

- exact (``serial``; ``sync`` and the other strategies whose workers share
  the parameters and meet at every step): taken at a step boundary, so the
  parameters and the rule state are those after exactly ``step`` steps, and
  a resumed run skips those steps' batches and ends bit-identical to an
  uninterrupted one (the data order is a pure function of the seed and the
  step, see ``strategies/batches.py``; no other random state is drawn).
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
rows up to it. The final checkpoint of a stopped run also holds what the
workers counted themselves (staleness, traffic, SSP's clocks: ``totals``,
``engines/tally.py``); a periodic one cannot, so a run resumed from it
counts those from there on. An exact checkpoint of a compressed run also
holds each worker's sender state (``save_sender``, ``hand_over_sender``); a
serial run's, the model's buffers (``buffer.<name>``: BatchNorm's).

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

from ...strategies.batches import batches_in, part_bounds
from ...record import checkpoints
from ...record.checkpoints import examples_after
from .store import DROPPED, EXAMPLES, LATE, UPDATES

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
    def start(self, w0: np.ndarray, rule, workers: int, sender: dict | None = None,
              buffers: dict | None = None):
        """``sender``: one worker's sender layout, where checkpoints hold them;
        ``buffers``: the model's (``buffer_arrays``), where they hold them."""
        extra = {"counters": ((workers, 4), "int64")}
        for name, (shape, dtype) in (sender or {}).items():
            extra["sender." + name] = ((workers,) + tuple(shape), dtype)
        for name, arr in (buffers or {}).items():
            extra[name] = (arr.shape, arr.dtype)
        return super().start(w0, rule, workers, extra)

    @staticmethod
    def restore(start, store) -> None:
        start.restore(store.params, store.state)
        store.counters[:] = start.saved.arrays["counters"]
        meta = start.saved.meta  # the local steps' totals go on from worker 0's row
        store.local_counts[0] = (meta.get("local_updates", 0), meta.get("dropped_local_updates", 0))

    # -- writing ----------------------------------------------------------
    def snapshot_positions(self, strategy, counters: np.ndarray, n: int, batch_size: int,
                           kernel: bool = False):
        """Each worker's batches done (epochs, for a compiled loop), from its
        examples (snapshot checkpoints)."""
        workers = counters.shape[0]
        if kernel:
            return [int(counters[r, EXAMPLES]) // max(1, b - a)
                    for r, (a, b) in enumerate(part_bounds(n, workers, r)
                                               for r in range(workers))]
        if strategy.synchronous:  # every worker walks the global plan
            steps = batches_in(int(counters[:, EXAMPLES].sum()), n, batch_size)
            return [steps] * workers
        return checkpoints.positions_from_examples(counters[:, EXAMPLES], n, batch_size)

    @staticmethod
    def snapshot_counters(strategy, counters: np.ndarray, positions, n: int, batch_size: int,
                          kernel: bool = False) -> np.ndarray:
        """The counters a snapshot checkpoint holds, agreeing with its
        ``positions``. Where every worker walks the global plan (synchronous:
        local SGD), one stopped between averages may have counted local
        steps past the common position, or not reached it; the resumed run
        does every batch after that position, so the examples are those of
        its first ``positions[0]`` batches (totals on row 0, as
        ``exact_counters``), not the workers' own, or the totals would end
        off an uninterrupted run's by the difference."""
        if kernel or not strategy.synchronous:
            return counters
        out = counters.copy()
        out[:, EXAMPLES] = 0
        out[0, EXAMPLES] = examples_after(positions[0] if positions else 0, n, batch_size)
        return out

    @staticmethod
    def snapshot_local(strategy, local, positions, n: int, batch_size: int,
                       kernel: bool = False):
        """The local steps (applied, dropped) a snapshot checkpoint holds,
        agreeing with its ``positions`` as ``snapshot_counters``'s examples
        do: where every worker walks the global plan, each takes a local
        step on its part of every batch (a part may be empty only in an
        epoch's short last batch), so those of the first ``positions[0]``
        batches, less the dropped ones."""
        if local is None or kernel or not strategy.synchronous or not positions:
            return local
        workers, per_epoch = len(positions), -(-n // batch_size)
        tail = min(n - (per_epoch - 1) * batch_size, workers)
        full, rest = divmod(int(positions[0]), per_epoch)
        taken = full * ((per_epoch - 1) * workers + tail) + rest * workers
        applied, dropped = local
        return max(0, taken - int(dropped)), int(dropped)

    def exact_counters(self, step: int, workers: int, dropped: int, late: int, n: int,
                       batch_size: int, backups: int = 0) -> np.ndarray:
        """The counters after exactly ``step`` steps, totals on row 0.
        ``dropped`` and ``late`` are the totals when the monitor writes it,
        workers may be steps on by then: at most one drop a step, and at most
        ``backups`` late gradients a step, are counted up to ``step``."""
        counters = np.zeros((workers, 4), dtype=np.int64)
        counters[0, EXAMPLES] = examples_after(step, n, batch_size)
        counters[0, DROPPED] = min(dropped, step)
        counters[0, UPDATES] = step - counters[0, DROPPED]
        counters[0, LATE] = min(late, step * backups)
        return counters

    def write(self, *, params, state, counters: np.ndarray, positions, time_s: float, rows,
              reason: str, exact: bool, private: dict | None = None,
              extra: dict | None = None, local: tuple[int, int] | None = None,
              totals: dict | None = None):
        """``extra``: more arrays (the senders' ``sender.<name>``);
        ``local``: the local steps applied and dropped (None: none taken);
        ``totals``: the tally's counts so far (``RunTally.totals``), which
        only the final checkpoint has whole."""
        if not self.directory:
            return None
        t0 = time.perf_counter()
        updates = int(counters[:, UPDATES].sum())
        dropped = int(counters[:, DROPPED].sum())
        arrays = {"counters": counters, **(extra or {})}
        for rank, copy in (private or {}).items():
            arrays[f"worker.{rank}.params"] = copy
        meta = {"updates": updates, "examples": int(counters[:, EXAMPLES].sum()),
                "dropped": dropped, "positions": [int(p) for p in positions],
                "exact": bool(exact), "reason": reason}
        if local is not None:
            meta["local_updates"], meta["dropped_local_updates"] = (int(v) for v in local)
        if totals is not None:
            meta["totals"] = totals
        self.save(updates + dropped, float(time_s), params, state, meta, arrays, rows)
        end = time.perf_counter()
        self.ready_at = end + COST_FACTOR * (end - t0)
        return self.last_path


def buffer_arrays(problem) -> dict:
    """The model's buffers as a checkpoint's ``buffer.<name>`` arrays ({}: none);
    at least 1-d, as a checkpoint stores them (a counter is a 0-d tensor)."""
    state = problem.state()
    return {"buffer." + k: np.atleast_1d(v) for k, v in (state or {}).items()}


def restore_buffers(ckpt, problem) -> None:
    prefix = "buffer."
    saved = {k[len(prefix):]: v for k, v in ckpt.arrays.items() if k.startswith(prefix)}
    if saved:
        shapes = {k: np.shape(v) for k, v in problem.state().items()}
        problem.load_state({k: v.reshape(shapes[k]) for k, v in saved.items()})


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

"""How far a run got, as its checkpoints record it (the file format is
``checkpoints.py``): the counts in a checkpoint's meta, each worker's
position in its data plan, and the ``counters`` array.

- The meta's counts (``counts``): ``examples``, ``dropped`` and ``reason``
  in every engine's, and where the engine has them ``step`` (steps or
  versions done), ``updates``, ``exact``, ``positions`` (each worker's
  batches done), the local steps (``local_updates``,
  ``dropped_local_updates``) and the tally's ``totals``; ``Start``
  (``checkpoints.py``) reads them back.
- ``counters``: one row a worker, the columns ``EXAMPLES``, ``UPDATES``,
  ``DROPPED``, ``LATE`` (the local engine's store keeps its counters in
  this layout, the sim writes its workers' so).
- An exact checkpoint, taken at a step boundary, is after exactly ``step``
  steps: every worker is at batch ``step`` of the global plan and the
  examples are those of the plan's first ``step`` batches
  (``exact_counters``), whatever the workers counted past it.
- A snapshot checkpoint (taken while workers run) places each worker from
  the examples it has done (``snapshot_positions``): worker k walks part k
  of the data; where every worker walks the global plan (synchronous:
  local SGD), worker k takes part k of each batch, and its position is the
  batches whose parts hold its examples (``part_batches_in``): workers
  stopped between two averages may be steps apart, and each resumes at its
  own batch, so a resumed run does every batch once and ends with an
  uninterrupted run's totals (the local steps it records agree with those
  positions, ``snapshot_local``). A compiled per-example loop counts its
  position in epochs of its part.
"""
from __future__ import annotations

import numpy as np

from ..strategies.batches import batches_in, part_bounds

# the columns of a checkpoint's ``counters`` (one row a worker)
EXAMPLES, UPDATES, DROPPED, LATE = 0, 1, 2, 3
COLUMNS = 4


def counters_shapes(workers: int) -> dict:
    """The ``counters`` array a checkpoint holds, as ``checkpoints.shapes``'s ``extra``."""
    return {"counters": ((workers, COLUMNS), "int64")}


def counts(reason: str, examples, dropped, *, step=None, updates=None, exact=None,
           positions=None, local=None, totals=None, **more) -> dict:
    """A checkpoint's meta of how far its run got (None: not recorded);
    ``local``: the local steps (applied, dropped); ``more``: the engine's
    own keys, as they are."""
    meta = {"examples": int(examples), "dropped": int(dropped), "reason": reason}
    for key, value in (("step", step), ("updates", updates)):
        if value is not None:
            meta[key] = int(value)
    if exact is not None:
        meta["exact"] = bool(exact)
    if positions is not None:
        meta["positions"] = [int(p) for p in positions]
    if local is not None:
        meta["local_updates"], meta["dropped_local_updates"] = (int(v) for v in local)
    if totals is not None:
        meta["totals"] = totals
    return {**meta, **more}


def counters_counts(counters: np.ndarray) -> dict:
    """The meta's ``updates``, ``examples`` and ``dropped``: a ``counters``
    array's totals."""
    return {"updates": int(counters[:, UPDATES].sum()),
            "examples": int(counters[:, EXAMPLES].sum()),
            "dropped": int(counters[:, DROPPED].sum())}


def examples_after(steps: int, n: int, batch_size: int) -> int:
    """Examples in the first ``steps`` batches of a global plan (an epoch's
    last batch may be short)."""
    per_epoch = -(-n // batch_size)
    full, rest = divmod(int(steps), per_epoch)
    return full * n + min(rest * batch_size, n)


def positions_from_examples(examples, n: int, batch_size: int, before=None) -> list[int]:
    """Each worker's batches done in its own part's plan, from the examples
    it has done (worker k walks part k of ``len(examples)``), after its
    ``before`` ones (a resumed attempt's ``Start.positions``; none: 0)."""
    workers = len(examples)
    return [p0 + batches_in(int(ex), b - a, batch_size)
            for p0, ex, (a, b) in zip(before or [0] * workers, examples,
                                      (part_bounds(n, workers, r) for r in range(workers)))]


def snapshot_positions(strategy, examples, n: int, batch_size: int,
                       kernel: bool = False) -> list[int]:
    """Each worker's batches done (epochs, for a compiled loop), from the
    examples each has done in the whole run (a snapshot checkpoint)."""
    workers = len(examples)
    if kernel:
        return [int(ex) // max(1, b - a)
                for ex, (a, b) in zip(examples, (part_bounds(n, workers, r)
                                                 for r in range(workers)))]
    if strategy.synchronous:  # every worker walks the global plan, its part of each batch
        return [part_batches_in(int(ex), n, batch_size, workers, r)
                for r, ex in enumerate(examples)]
    return positions_from_examples(examples, n, batch_size)


def _parts(n: int, batch_size: int, workers: int, rank: int) -> tuple[int, int, int]:
    """The global plan's batches an epoch, and rank's part of a full batch
    and of the epoch's last (short where ``batch_size`` does not divide ``n``)."""
    per_epoch = -(-n // batch_size)
    tail = n - (per_epoch - 1) * batch_size
    full = part_bounds(batch_size, workers, rank)
    last = part_bounds(tail, workers, rank)
    return per_epoch, full[1] - full[0], last[1] - last[0]


def part_batches_in(examples: int, n: int, batch_size: int, workers: int, rank: int) -> int:
    """How many batches of the global plan rank's parts of its first
    ``examples`` examples fill (``split``): the fewest that hold them, so a
    worker past a batch whose part was empty (nothing to compute) is placed
    before it and passes it again for nothing."""
    per_epoch, full, last = _parts(n, batch_size, workers, rank)
    epoch = (per_epoch - 1) * full + last
    if n <= 0 or epoch <= 0:
        return 0
    done, rest = divmod(int(examples), epoch)
    if rest == 0:
        within = 0
    elif rest <= (per_epoch - 1) * full:
        within = -(-rest // full)
    else:  # into the epoch's last batch
        within = per_epoch
    return done * per_epoch + within


def snapshot_local(strategy, local, positions, n: int, batch_size: int, kernel: bool = False):
    """The local steps (applied, dropped) a snapshot checkpoint holds,
    agreeing with its ``positions``: where every worker walks the global
    plan, each takes a local step on its part of every batch it has done
    (a part may be empty only in an epoch's short last batch), so those of
    each worker's first ``positions[k]`` batches, less the dropped ones (a
    racing read may see a gradient counted whose local step is not yet)."""
    if local is None or kernel or not strategy.synchronous or not positions:
        return local
    workers, taken = len(positions), 0
    for rank, position in enumerate(positions):
        per_epoch, _, last = _parts(n, batch_size, workers, rank)
        done, rest = divmod(int(position), per_epoch)
        taken += done * (per_epoch - 1 + (last > 0)) + rest
    applied, dropped = local
    return max(0, taken - int(dropped)), int(dropped)


def exact_counters(step: int, workers: int, dropped: int, late: int, n: int,
                   batch_size: int, backups: int = 0) -> np.ndarray:
    """The counters after exactly ``step`` steps, totals on row 0.
    ``dropped`` and ``late`` are the totals when the checkpoint is written,
    workers may be steps on by then: at most one drop a step, and at most
    ``backups`` late gradients a step, are counted up to ``step``."""
    counters = np.zeros((workers, COLUMNS), dtype=np.int64)
    counters[0, EXAMPLES] = examples_after(step, n, batch_size)
    counters[0, DROPPED] = min(dropped, step)
    counters[0, UPDATES] = step - counters[0, DROPPED]
    counters[0, LATE] = min(late, step * backups)
    return counters

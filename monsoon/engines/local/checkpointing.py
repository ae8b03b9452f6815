"""What the local engine saves and restores (the file format is
``engines/checkpoints.py``).

Two kinds of checkpoint, by strategy:

- exact (``serial``; ``sync`` and the other strategies whose workers share
  the parameters and meet at every step): taken at a step boundary, so the
  parameters and the rule state are those after exactly ``step`` steps, and
  a resumed run skips those steps' batches and ends bit-identical to an
  uninterrupted one (the data order is a pure function of the seed and the
  step, see ``strategies/batches.py``; no other random state is drawn).
- snapshot (``async``, ``hogwild``, ``local-sgd``, ``easgd``): the shared
  parameters and rule state as the monitor reads them while workers run (a
  racy read, as the loss curve's), each worker's position in its data plan
  from the examples it has done, and the private copies the workers report
  when they stop. These strategies are not deterministic on real workers,
  so resuming carries the run on rather than replaying it.

Runs of a compiled per-example loop (sparse Hogwild!, serial) count their
position in epochs (one op is one epoch's pass): they are checkpointed at
the end of an epoch, at most once per epoch; serial's are exact.

Either way the checkpoint holds the counters (examples, updates, dropped)
and the recorder's rows up to it, so totals and the loss curve carry on.

Checkpoints cost at most about 5% of a run: after each write, the next waits
at least 19 times as long as the write took (the interval in updates is a
floor, not a promise, on models whose updates take microseconds).
"""
from __future__ import annotations

import time

import numpy as np

from ...strategies.batches import batches_in, part_bounds
from .. import checkpoints
from .store import DROPPED, EXAMPLES, LATE, UPDATES

# After a write taking t seconds, the next waits COST_FACTOR * t: <= 5% of the run.
COST_FACTOR = 19


def exact_checkpoints(strategy) -> bool:
    """Whether the engine checkpoints this strategy at step boundaries."""
    return strategy.single_worker or (strategy.synchronous and strategy.shared_params)


def examples_after(steps: int, n: int, batch_size: int) -> int:
    """Examples in the first ``steps`` batches of a global plan (an epoch's
    last batch may be short)."""
    per_epoch = -(-n // batch_size)
    full, rest = divmod(int(steps), per_epoch)
    return full * n + min(rest * batch_size, n)


class RunCheckpoints:
    def __init__(self, directory, every: int, resume_dir, ident: dict, exact: bool):
        self.directory = directory
        self.every = every
        self.resume_dir = resume_dir
        self.ident = ident
        self.exact = exact
        self.last_path = None
        self.ready_at = 0.0  # perf_counter time before which no periodic write is due

    def allowed(self) -> bool:
        """Whether a periodic checkpoint may be written now (the cost floor)."""
        return time.perf_counter() >= self.ready_at

    # -- reading ----------------------------------------------------------
    def shapes(self, rule, w0: np.ndarray, workers: int) -> dict:
        template = rule.init(w0.size, w0.dtype)
        shapes = {"params": (w0.shape, w0.dtype), "counters": ((workers, 4), "int64")}
        for field, arr in zip(template._fields, template):
            shapes["state." + field] = (arr.shape, arr.dtype)
        return shapes

    def load(self, rule, w0: np.ndarray, workers: int):
        if not self.resume_dir:
            return None
        return checkpoints.load_latest(self.resume_dir, self.ident,
                                       self.shapes(rule, w0, workers))

    @staticmethod
    def restore(ckpt, store) -> None:
        store.params[:] = ckpt.arrays["params"]
        for field, arr in zip(store.state._fields, store.state):
            arr[...] = ckpt.arrays["state." + field]
        store.counters[:] = ckpt.arrays["counters"]

    @staticmethod
    def positions(ckpt, workers: int) -> list[int]:
        return [int(p) for p in ckpt.meta["positions"]][:workers]

    @staticmethod
    def private_copy(ckpt, rank: int):
        return ckpt.arrays.get(f"worker.{rank}.params")

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
        out = []
        for rank in range(workers):
            a, b = part_bounds(n, workers, rank)
            out.append(batches_in(int(counters[rank, EXAMPLES]), b - a, batch_size))
        return out

    def exact_counters(self, step: int, workers: int, dropped: int, late: int, n: int,
                       batch_size: int) -> np.ndarray:
        """The counters after exactly ``step`` steps, totals on row 0."""
        counters = np.zeros((workers, 4), dtype=np.int64)
        counters[0, EXAMPLES] = examples_after(step, n, batch_size)
        counters[0, DROPPED] = min(dropped, step)
        counters[0, UPDATES] = step - counters[0, DROPPED]
        counters[0, LATE] = late
        return counters

    def write(self, *, params, state, counters: np.ndarray, positions, time_s: float, rows,
              reason: str, exact: bool, private: dict | None = None):
        if not self.directory:
            return None
        t0 = time.perf_counter()
        updates = int(counters[:, UPDATES].sum())
        arrays = {"params": params, "counters": counters}
        for field, arr in zip(state._fields, state):
            arrays["state." + field] = arr
        for rank, copy in (private or {}).items():
            arrays[f"worker.{rank}.params"] = copy
        meta = {**self.ident, "updates": updates,
                "examples": int(counters[:, EXAMPLES].sum()),
                "dropped": int(counters[:, DROPPED].sum()),
                "positions": [int(p) for p in positions], "exact": bool(exact),
                "time_s": float(time_s), "reason": reason,
                "rows": [dict(r) for r in rows if r["updates"] <= updates]}
        self.last_path = checkpoints.save(self.directory, updates + int(counters[:, DROPPED].sum()),
                                          meta, arrays)
        end = time.perf_counter()
        self.ready_at = end + COST_FACTOR * (end - t0)
        return self.last_path

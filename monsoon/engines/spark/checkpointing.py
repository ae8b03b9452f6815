"""Checkpoints of the spark engine: the driver's server state, written with
``engines/checkpoints.py`` (atomic, no pickle, refuses another run's).

The driver holds everything a run needs to carry on: the parameters, the
rule state, the counters and the loss curve so far, and where each worker
is in its data plan (sync: batches done; async: push periods done). Only
finished jobs ever change that state, so a checkpoint taken between them
is exact: a sync run resumed from one ends bit-identical to an
uninterrupted run (a test checks), and an async worker carries on with the
push period after its last applied one (work in flight when the run
stopped is recomputed, never applied twice). Not kept: a delay-aware
rule's per-worker read records (they restart empty), and local-sgd's and
easgd's private worker state (they write no checkpoints, and refuse
``--resume``).
"""
from __future__ import annotations

import numpy as np

from .. import checkpoints


class DriverCheckpoints:
    def __init__(self, engine, problem, strategy, rule, workers, batch_size, seed, recorder):
        self.directory = engine.checkpoint_dir
        self.every = engine.checkpoint_every if engine.checkpoint_dir else 0
        self.resume_dir = engine.resume_dir
        self.ident = checkpoints.identity(problem, strategy, rule, workers, batch_size, seed)
        self.recorder = recorder
        self.last_path = None
        self.next_at = None

    def load(self, w0, rule, extra_shapes: dict | None = None):
        """The checkpoint to resume from (None: a fresh run); its loss curve
        is handed to the recorder."""
        if not self.resume_dir:
            return None
        template = rule.init(w0.size, w0.dtype)
        shapes = {"params": (w0.shape, w0.dtype), **(extra_shapes or {})}
        for field, arr in zip(template._fields, template):
            shapes["state." + field] = (arr.shape, arr.dtype)
        ckpt = checkpoints.load_latest(self.resume_dir, self.ident, shapes)
        self.recorder.resume(ckpt.meta["rows"])
        return ckpt

    def due(self, updates: int) -> bool:
        if not self.every:
            return False
        if self.next_at is None:
            self.next_at = (updates // self.every + 1) * self.every
        return updates >= self.next_at

    def save(self, updates: int, now: float, params, state, meta: dict,
             arrays: dict | None = None) -> None:
        if not self.directory:
            return
        self.next_at = (updates // self.every + 1) * self.every if self.every else None
        rows = [dict(r) for r in self.recorder.settled_rows() if r["updates"] <= updates]
        all_arrays = {"params": params, **(arrays or {})}
        for field, arr in zip(state._fields, state):
            all_arrays["state." + field] = arr
        self.last_path = checkpoints.save(self.directory, updates,
                                          {**self.ident, **meta, "updates": updates,
                                           "time_s": now, "rows": rows}, all_arrays)


def restore_state(ckpt, state) -> None:
    for field, arr in zip(state._fields, state):
        arr[...] = ckpt.arrays["state." + field]


def staleness_arrays(counts) -> dict:
    keys = sorted(counts)
    return {"staleness.values": np.array(keys, dtype=np.int64),
            "staleness.counts": np.array([counts[k] for k in keys], dtype=np.int64)}

"""Checkpoints of the spark engine: the driver's server state, written with
the shared ``record/checkpoints.py`` (atomic, no pickle, refuses another
run's).

The driver holds everything a run needs to carry on: the parameters, the
rule state, the counters and the loss curve so far, and where each worker
is in its data plan (sync: batches done; async: each worker's steps done). Only
finished jobs ever change that state, so a checkpoint taken between them
is exact: a sync run resumed from one ends bit-identical to an
uninterrupted run (a test checks), and an async worker carries on with the
step after its last applied push (work in flight when the run
stopped is recomputed, never applied twice). Not kept: a delay-aware
rule's per-worker read records (they restart empty), and the private
worker copies of local-sgd and easgd (they refuse ``--resume``).
"""
from __future__ import annotations

from ...record.checkpoints import Checkpointer, restore_state, staleness_arrays


def DriverCheckpoints(engine, problem, strategy, rule, workers, batch_size, seed, recorder):
    return Checkpointer.for_engine(engine, problem, strategy, rule, workers, batch_size, seed,
                                   recorder)


__all__ = ["DriverCheckpoints", "restore_state", "staleness_arrays"]

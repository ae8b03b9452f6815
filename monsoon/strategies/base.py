"""The Strategy protocol: the communication pattern, written once.

A strategy says who computes which gradient on which copy of the
parameters, and when the rule runs. Its ``program(job)`` is a generator
yielding the ops of ``ops.py``; an engine runs one program per worker.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .batches import Budget


@dataclass(frozen=True)
class WorkerJob:
    """What one worker is told: who it is and what data budget it has."""
    rank: int
    workers: int
    n_examples: int
    batch_size: int
    seed: int
    budget: Budget
    start_step: int = 0   # steps already done (a resumed run skips their batches)
    kernel: bool = False  # the problem has a compiled per-example SGD loop the engine can run


class Strategy:
    name = "strategy"
    # True: workers compute on the server's parameters themselves (no Fetch);
    # False: each worker computes on a private copy that Fetch refreshes.
    shared_params = True
    # True: the worker loop contains a barrier (AllReduce): one lost worker
    # stalls the rest, so the engine fails fast instead of carrying on.
    needs_all_workers = False
    # True: the program uses AllReduce or Average (the engine keeps gradient slots).
    synchronous = False
    # Synchronous strategies: how many of the workers are spares (the step
    # takes the first workers - backup_workers contributions).
    backup_workers = 0
    # Strategies with local steps (local SGD, EASGD): the rule each worker
    # applies to its private copy; the engine's rule then runs on the server.
    local_rule = None

    def program(self, job: WorkerJob):
        raise NotImplementedError

    def validate(self, workers: int, batch_size: int, n_examples: int) -> None:
        if workers > n_examples:
            raise ConfigError(f"{workers} workers but only {n_examples} training examples; "
                              f"use at most {n_examples} workers")

    def describe(self) -> dict:
        return {"strategy": self.name}

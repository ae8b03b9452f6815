"""Which examples each worker visits, as a pure function of the seed.

Every epoch ``e`` has one global permutation, drawn from ``(seed, e)``. All
plans are cut from it, so a strategy with one worker visits exactly the
batches ``serial`` visits:

- ``global_batches``: consecutive chunks of ``batch_size`` (serial, sync;
  sync then splits each chunk among its workers with ``split``);
- ``slice_batches``: worker k's contiguous slice of each epoch's
  permutation, in chunks (Hogwild!, as in Niu et al.'s experiments);
- ``shard_batches``: worker k's fixed data shard, a random part of the
  data drawn once from the seed (so shards are alike, not ranges of a
  sorted file), re-permuted each epoch (Downpour: each replica owns a part
  of the data).

A budget is either ``epochs`` (each plan covers its data that many times) or
``steps`` (the total number of gradient steps over all workers).
"""
from __future__ import annotations

from dataclasses import dataclass

import math

import numpy as np


@dataclass(frozen=True)
class Budget:
    epochs: int | None = None
    steps: int | None = None

    def steps_for(self, rank: int, workers: int) -> int | None:
        """Worker ``rank``'s share of a step budget (None: go by epochs)."""
        if self.steps is None:
            return None
        return self.steps // workers + (1 if rank < self.steps % workers else 0)


def permutation(n: int, rng: np.random.Generator) -> np.ndarray:
    """``rng.permutation(n)``, the same order, held in 32-bit integers where
    they suffice: half the memory a worker keeps per epoch (32 MiB instead of
    64 for 4M examples)."""
    order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    rng.shuffle(order)
    return order


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return permutation(n, np.random.default_rng([seed, epoch]))


def block_permutation(n: int, seed: int, epoch: int, block: int = 512) -> np.ndarray:
    """Blocks of ``block`` consecutive examples, the blocks in a random order
    drawn from ``(seed, epoch)``. On data stored in a random order (see
    SparseLinear, which shuffles its rows once), this is statistically a
    shuffle, while memory is read sequentially: faster per example than a
    full permutation on sparse data larger than the caches."""
    starts = np.arange(0, n, block)
    order = np.random.default_rng([seed, epoch]).permutation(len(starts))
    return np.concatenate([np.arange(starts[b], min(starts[b] + block, n)) for b in order])


def part_bounds(n: int, workers: int, rank: int) -> tuple[int, int]:
    """Where rank's part starts and stops when ``n`` items are cut into
    ``workers`` contiguous parts whose sizes differ by at most one."""
    base, extra = divmod(n, workers)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def split(indices: np.ndarray, workers: int, rank: int) -> np.ndarray:
    """Rank's part of ``indices`` (see ``part_bounds``)."""
    start, stop = part_bounds(len(indices), workers, rank)
    return indices[start:stop]


def tail_weight(size: int, batch_size: int, rows: int) -> float:
    """The weight of a batch of ``size`` examples in a plan whose epoch holds
    ``rows``: its size over a full batch's (``min(batch_size, rows)``). Only
    an epoch's short last batch weighs less than 1. A gradient is a mean
    over its batch, so unweighted, each example of a 64-row tail would count
    16 times as much as one of a full 1024-row batch, and an adaptive rule
    (AdaGrad, Adam) would take up to that much larger a step on the rare
    features the tail holds, at the end of every epoch: the last step of an
    asynchronous worker is such a batch."""
    full = min(batch_size, rows)
    return size / full if size < full else 1.0


def chunk_sizes(rows: int, batch_size: int, steps: int | None = None) -> set:
    """The sizes of the batches ``_run`` cuts from epochs of ``rows``
    examples: ``batch_size``, and the short last batch of an epoch where the
    plan reaches it (``steps`` None: whole epochs; else that many batches)."""
    if rows <= 0 or steps == 0:
        return set()
    sizes = {batch_size} if rows >= batch_size else set()
    if rows % batch_size and (steps is None or steps >= -(-rows // batch_size)):
        sizes.add(rows % batch_size)
    return sizes


def _chunks(order: np.ndarray, batch_size: int):
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def _run(epoch_order, batch_size: int, budget: Budget, max_steps: int | None):
    steps = 0
    epoch = 0
    while True:
        if budget.steps is None and epoch >= budget.epochs:
            return
        order = epoch_order(epoch)
        if len(order) == 0:
            return
        for batch in _chunks(order, batch_size):
            if max_steps is not None and steps >= max_steps:
                return
            yield batch
            steps += 1
        epoch += 1


def skip(batches, steps: int):
    """``batches`` without its first ``steps`` (a resumed run's done steps)."""
    for _ in range(steps):
        if next(batches, None) is None:
            break
    return batches


def batches_in(examples: int, per_epoch: int, batch_size: int) -> int:
    """How many batches of a plan hold its first ``examples`` examples, when
    each epoch gives it ``per_epoch`` examples in chunks of ``batch_size``."""
    if per_epoch <= 0:
        return 0
    full, rest = divmod(int(examples), per_epoch)
    return full * -(-per_epoch // batch_size) + -(-rest // batch_size)


def lookahead(batches):
    """``(batch, next_batch)`` pairs (``next_batch`` None at the end): what a
    ``Gradient`` op tells a problem that prefetches its data."""
    batch = next(batches, None)
    for following in batches:
        yield batch, following
        batch = following
    if batch is not None:
        yield batch, None


def budget_steps(n: int, batch_size: int, budget: Budget) -> int:
    """How many batches ``global_batches`` yields: the step budget, or every
    started epoch's batches (the last of each short where ``batch_size``
    does not divide ``n``)."""
    if budget.steps is not None:
        return budget.steps
    return math.ceil(budget.epochs) * -(-n // batch_size)


def global_batches(n: int, batch_size: int, seed: int, budget: Budget):
    return _run(lambda e: epoch_permutation(n, seed, e), batch_size, budget, budget.steps)


def slice_batches(n: int, batch_size: int, seed: int, budget: Budget, rank: int, workers: int):
    return _run(lambda e: split(epoch_permutation(n, seed, e), workers, rank),
                batch_size, budget, budget.steps_for(rank, workers))


def shard_batches(n: int, batch_size: int, seed: int, budget: Budget, rank: int, workers: int):
    # Sorted, so that one worker's single shard is arange(n) and it visits
    # exactly serial's batches.
    shard = np.sort(split(permutation(n, np.random.default_rng([seed, 1 << 30])), workers, rank))
    return _run(lambda e: shard[epoch_permutation(len(shard), seed, e)], batch_size, budget, budget.steps_for(rank, workers))

"""Where a run's server keeps the parameters, whatever engine carries it.

Split into shards: ``shard_count`` shards (as asked, else one per worker, up
to ``DEFAULT_MAX_SHARDS``, none of fewer than the engine's ``min_shard``
parameters), each a contiguous slice (``shard_bounds``: sizes differ by at
most one), with its own version, rule state and lock; or, for the
synchronous steps of small parameters (``replicates``: up to
``REPLICATE_MAX_BYTES``, no backup workers), a replica in every worker, to
which each applies the same mean, as after DDP's all-reduce (the local
engine's CPU workers: ``engines/local/synchronous.py``; the sim takes the
same choice).
"""
from __future__ import annotations

import numpy as np

# Parameter-server shards default to one per worker, up to this many.
DEFAULT_MAX_SHARDS = 8
# Where a shard is a process of its own (ray), a run makes no shard of fewer
# parameters than this (1 MiB of float32): a smaller one costs a process start
# and one more call on every push and read, and moves too few bytes to gain
# from the split.
MIN_PROCESS_SHARD = 1 << 18
# Synchronous steps replicate the parameters in every worker up to this size.
REPLICATE_MAX_BYTES = 1 << 21


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous slices of ``n`` parameters whose sizes differ by
    at most one."""
    base, extra = divmod(n, shards)
    bounds, start = [], 0
    for s in range(shards):
        stop = start + base + (1 if s < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def shard_count(requested: int | None, workers: int, n_params: int,
                min_shard: int = 1) -> int:
    """The parameter-server shards a run uses: as asked, else one per
    worker up to ``DEFAULT_MAX_SHARDS`` and none of fewer than ``min_shard``
    parameters; never more than the parameters."""
    default = min(workers, DEFAULT_MAX_SHARDS, -(-n_params // min_shard))
    return max(1, min(requested or default, n_params))


def replicates(strategy, params: np.ndarray) -> bool:
    """Whether a run's synchronous steps are replicated: every worker keeps
    its own copy of small parameters and applies the same mean itself
    (``engines/local/synchronous.py``), instead of one shared copy."""
    return replicates_bytes(strategy, params.nbytes)


def replicates_bytes(strategy, nbytes: int) -> bool:
    """``replicates`` for parameters of ``nbytes`` bytes."""
    return (strategy.synchronous and strategy.shared_params
            and strategy.backup_workers == 0 and nbytes <= REPLICATE_MAX_BYTES)

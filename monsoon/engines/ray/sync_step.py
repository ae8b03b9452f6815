"""A Ray worker's part of one synchronous step, as calls on the shards.

``call`` runs a batch of shard calls at once, ``[(shard, method, args)]``,
and returns their replies in order: the worker's ``ray.get`` of remote
calls (``worker.py``), or a test's threads over plain ``Shard`` objects, so
a test drives the very protocol a worker runs.

Each target shard is sent its part in one ``contribute`` call, which
returns once the shard has applied the step (``shard.py``).
"""
from __future__ import annotations


def step_replies(call, shards, targets, step: int, rank: int, parts, examples: int, gen: int,
                 whole_finite: bool) -> dict:
    """Each target shard's reply to worker ``rank``'s part of ``step``,
    by shard index: (slice, steps missed, counted?) or ("regroup", gen,
    members)."""
    replies = call([(shards[s], "contribute",
                     (step, rank, parts[s], examples, gen, whole_finite)) for s in targets])
    return dict(zip(targets, replies))

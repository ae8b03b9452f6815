"""A Ray worker's part of one synchronous step, as calls on the shards.

``call`` runs a batch of shard calls at once, ``[(shard, method, args)]``,
and returns their replies in order: the worker's ``ray.get`` of remote
calls (``worker.py``), or a test's threads over plain ``Shard`` objects, so
a test drives the very protocol a worker runs.

One shard, or no backup workers: each shard is sent its part in one
``contribute`` call, which returns once the shard has applied the step
(``shard.py``). Every worker counts, so the shards apply the same parts.

Backup workers on several shards: which of the step's arrivals count is
one decision, shard 0's, for every shard. The worker hands its part to
each other shard first (``offer``, answered at once), then contributes to
shard 0 (``decide``), which counts the first ``counted`` workers to reach
it, as ``contribute`` does; then it tells the other shards whom shard 0
counted (``settle``): the first such call applies the step there on those
parts. So the shards apply the same workers' parts, and a non-finite one
drops the step on all of them. A worker counted has its parts on every
shard before shard 0 counts it, so a worker lost at any point never holds
a step up (its backups cover it, as on one shard), and a worker whose
upload is slow is the one left out. It costs two round trips more than
one ``contribute``: ``offer`` and ``settle``.

Elastic sync takes no backup workers (``strategies/sync.py``), so a
regroup meets only the first way, where a shard that applied the step
while another regroups it is kept (``worker.py``).
"""
from __future__ import annotations


def step_replies(call, shards, targets, step: int, rank: int, parts, examples: int, gen: int,
                 whole_finite: bool, backups: bool = False) -> dict:
    """Each target shard's reply to worker ``rank``'s part of ``step``,
    by shard index: (slice, steps missed, counted?) with ``stop`` and
    ``applied`` (``shard.StepReply``), or ("regroup", gen, members).
    ``targets``: the shards yet to apply the step (all but those that
    applied it while others regrouped); ``backups``: the step counts the
    first of more workers, which takes every shard."""
    if backups and len(shards) > 1:
        return _decided(call, shards, step, rank, parts, examples, gen, whole_finite)
    replies = call([(shards[s], "contribute",
                     (step, rank, parts[s], examples, gen, whole_finite)) for s in targets])
    return dict(zip(targets, replies))


def _decided(call, shards, step, rank, parts, examples, gen, whole_finite) -> dict:
    """The step with shard 0 deciding which workers count, for every shard."""
    rest = range(1, len(shards))
    call([(shards[s], "offer", (step, rank, parts[s], examples, whole_finite)) for s in rest])
    first = call([(shards[0], "decide", (step, rank, parts[0], examples, gen, whole_finite))])[0]
    if isinstance(first[0], str):  # a regroup: no shard has applied the step
        return {0: first}
    settled = call([(shards[s], "settle", (step, rank, first[3], first[1])) for s in rest])
    return {0: first.less_ranks(), **dict(zip(rest, settled))}

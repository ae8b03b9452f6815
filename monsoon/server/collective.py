"""A synchronous step's server side, written once for every engine whose
workers meet at a collective (AllReduce: sync SGD; Average: local SGD,
DiLoCo; Local AdaAlter's sums).

Once the counted workers' contributions x_k (a gradient, or a drift
centre - copy_k) are where the step is taken (slots in shared memory, a
shard actor's arrivals, the sim's slots, the Spark driver's results):

    mean = sum_k (n_k / sum_j n_j) x_k     (``reduce.step_sums``: rank
                                            order, shard by shard)
    applied = every contribution was finite, and so is the mean on every shard
    applied: each shard's rule takes its mean as update ``step``
             (``ServerCore.apply_sum``); else each is told of the drop
    applied, and the inner rule's sums shared: S += the weighted mean of
             the workers' a_k (``summed.SharedSums.add_mean``)

``apply_mean`` does that; the engine brings how the contributions reach it,
its barriers, and where it counts the step (applied or dropped). Every
engine's mean is the same function on the same parts in the same order,
so their steps agree to the last bit. Invariant: nothing is applied on any
shard unless it is applied on every shard.
"""
from __future__ import annotations

from .reduce import step_sums


def apply_mean(cores, contributions, ranks: list[int], examples: list[int], bounds, acc, tmp,
               step: int, ok: bool = True, sums=None, sum_parts=None, **update) -> bool:
    """The step of the module docstring: the weighted mean of
    ``contributions[k]`` (k in ``ranks``, sorted, with ``examples``) on each
    shard [a, b) of ``bounds``, into ``acc`` (``tmp``: scratch like it),
    applied as update ``step`` by ``cores``: one ``ServerCore`` per shard
    (shard s's update marked as worker s), or one for the whole vector (a
    replica: ``acc`` whole). ``ok`` False: a contribution was not finite
    as a whole, and the step is dropped. ``sums`` (``SharedSums``): S takes
    the mean of ``sum_parts`` (per field, worker k's a_k at ``[k]``) once
    the step is applied (``acc`` and ``tmp``, free by then, its scratch).
    ``update``: ``apply_sum``'s loss and counts. Whether it was applied."""
    means, finite = step_sums(contributions, ranks, examples, bounds, acc, tmp)
    ok = ok and finite
    if len(cores) == 1:
        means = [acc]
    for s, (core, mean) in enumerate(zip(cores, means)):
        core.apply_sum(mean, step, s, ok=ok, **update)
    if ok and sums is not None:
        sums.add_mean(sum_parts, ranks, examples, acc, tmp)
    return ok

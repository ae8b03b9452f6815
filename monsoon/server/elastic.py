"""EASGD's exchange with the centre (Zhang, Choromanska, LeCun, NIPS 2015),
the worker's side of it checked once for every engine:

    d = alpha (x_i - x~);   x~ += d;   x_i -= d

(or, compressed, D = C(alpha (x_i - x~) + e) in d's place:
``Worker.elastic_difference``). How the exchange travels is the engine's
(``Worker.send_elastic``: shard by shard under their locks, actor calls, a
Spark segment's result, a collective, events on a virtual clock); the
centre's side is ``ServerCore.elastic`` and ``ServerCore.add``.

Invariant: the centre is always finite (it starts finite, and no exchange
from a copy that is not finite reaches it). Nothing checks a worker's private
copy x_i between exchanges: its inner rule drops a non-finite gradient
(``core.LocalUpdate``), but a finite one can still overflow x_i (a
diverging learning rate, a bad batch). An exchange with such a copy would
pull the centre to inf or NaN, and through the centre every other worker,
and the run would end with non-finite parameters and nothing said. So
``exchange`` sends x_i only where it is finite (``Worker.admits``, the
check a push's gradient passes: where the engine's server core is at hand,
``ServerCore.admits`` also counts the drop and tells the rule). Else the
exchange is dropped, as a non-finite push is: counted (``count_dropped``;
summary.json's dropped_updates, beside the exchanges applied in updates),
the centre not moved, and the worker restarts from the centre with fresh
inner-rule state (``Worker.skip_elastic``: it reads the centre, as its
program's first Fetch did; ``LocalUpdate.reset``: a rule's state, momentum's
velocity say, may have overflowed with the copy, and kept it would make the
restarted copy non-finite at its first step, every later exchange dropped),
so that its next exchange has a finite copy to send. An engine whose
exchange is a collective (torch) joins it with nothing for that worker.

With the centre finite and alpha in [0, 1], d is finite whenever x_i is,
short of x_i - x~ overflowing (|x_i| + |x~| past the dtype's largest value
in some coordinate).

An exchange is an update, at async's staleness (ALGORITHMS.md): the
centre's version at it less the one x_i last met (its last exchange, or its
read at its start or a restart: ``Worker.took_centre``, ``exchanged``; Spark's
driver keeps the copies and counts alike), once however many shards, at the
stalest one's. (Torch's synchronous round moves the centre once: 0.)
"""
from __future__ import annotations


def exchange(worker, op):
    """``worker``'s ``Elastic`` op (the module docstring): sent by its
    engine (``send_elastic``) where its private copy is finite; else
    dropped, counted, and the copy restarted from the centre
    (``skip_elastic``) with its inner rule's state fresh (``reset``).
    Returns what the engine's handler returns."""
    if worker.admits(worker.work):
        return worker.send_elastic(op)
    worker.count_dropped()
    worker.local_rule.reset()
    return worker.skip_elastic(op)

"""Local AdaAlter's synchronised sums (Xie et al. 2019), written once for
every engine's ``Average`` (local SGD, DiLoCo).

An inner rule whose state holds sums over every gradient it applied
(``Rule.summed_state``: AdaGrad's sums of squares) scales each step by them.
With a sum per worker, each worker scales its steps by its own statistics,
and the averaged copies settle where sum_k D_k grad f_k = 0 (D_k: worker
k's diagonal scaling), above the minimum of sum_k f_k wherever the workers'
data differ. So the sums are synchronised each round, as the drifts are:

    every worker starts the round from the shared sums S;
    worker k sends what its steps added, a_k = s_k - S;
    S <- S + sum_k (n_k / sum_j n_j) a_k   (``weighted_sum``: rank order,
                                            n_k: the examples behind k's drift)
    every worker starts the next round from S.

The mean (not the sum, as async's pushes add) keeps a worker's steps the
size of one copy's: a round's progress is the mean of its drifts. A round
whose mean drift is not finite is dropped whole: S takes nothing from it.

``SharedSums`` holds S (whole, or a shard's slice; NumPy arrays, shared
memory, or tensors where the worker's state lives on a device) and does the
three steps on it; the engine brings only how a_k travels to where the mean
is taken and how S comes back (``engines/*``: shared memory, events, shard
actors, a gather, a Spark job's results). Every engine's mean is the same
function on the same parts in the same order, so local and sim agree bit
for bit. Invariants: S changes only in ``add_mean``; a_k is taken against
the S the worker started the round from (``start``), which no worker's
``add_mean`` changes until every worker has sent its a_k.
"""
from __future__ import annotations

import numpy as np

from .. import arrays
from .reduce import weighted_sum


def initial_sums(inner, n: int, dtype) -> list | None:
    """The summed fields of a fresh state of ``inner`` (its initial
    accumulator), one array a field, or None where the run keeps none."""
    if inner is None or not inner.summed_state:
        return None
    state = inner.init(n, np.dtype(dtype))
    return [np.array(getattr(state, name), copy=True) for name in inner.summed_state]


class SharedSums:
    """S: one array per field of ``Rule.summed_state`` (views allowed)."""

    __slots__ = ("sums",)

    def __init__(self, sums):
        self.sums = list(sums)

    @classmethod
    def of(cls, inner, n: int, dtype) -> "SharedSums | None":
        """Fresh sums for ``inner`` on ``n`` parameters; None where it keeps none."""
        sums = initial_sums(inner, n, dtype)
        return None if sums is None else cls(sums)

    @property
    def nbytes(self) -> int:
        """What one worker's a_k (or S) weighs on a wire."""
        return sum(arrays.nbytes(s) for s in self.sums)

    def count(self, sender) -> None:
        """A worker's traffic (``messages.Sender``): a_k sent and S received,
        dense, beside the drift's message (whose size stays the last sent)."""
        if sender is not None:
            sender.sent_bytes += self.nbytes
            sender.raw_bytes += self.nbytes
            sender.received_bytes += self.nbytes

    def start(self, local, like) -> None:
        """Worker copy ``local`` (``core.LocalUpdate``, stepping arrays like
        ``like``: its working parameters) starts the round from S."""
        for mine, shared in zip(local.sums(like), self.sums):
            arrays.copyto(mine, shared)

    def added(self, local, like, out=None) -> list:
        """Write a_k = what ``local``'s steps added to S since ``start`` into
        ``out`` (one array a field, of S's kind; None: new ones); returns it."""
        if out is None:
            out = [arrays.empty_like(s) for s in self.sums]
        for mine, shared, o in zip(local.sums(like), self.sums, out):
            arrays.copyto(o, mine)
            o -= shared
        return out

    def add_mean(self, parts, ranks: list[int], examples: list[int], acc, tmp,
                 a: int = 0, b: int | None = None) -> None:
        """S[a:b] += the example-weighted mean of the workers' a_k:
        ``parts[i][k]`` is worker k's a_k of field i on [a, b), ``ranks``
        sorted; ``acc`` and ``tmp`` are scratch of that slice's shape."""
        for field, shared in zip(parts, self.sums):
            shared[a:b] += weighted_sum(field, ranks, examples, acc, tmp)

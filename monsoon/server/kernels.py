"""The synchronous steps' mean of ``reduce.py``, compiled (Numba, ``nogil=True``).

``equal_mean_finite(slots, counts, out, scale)`` does, in one call, what
``reduce.WeightedMean`` followed by ``reduce.finite`` does when every worker
saw as many examples:

    out = slots[0];  out += slots[k] for k = 1..N-1 (rank order);  out *= scale

with ``scale`` = 1/N in ``out``'s own type, and returns 1 if ``out`` is
finite, 0 if not, -1 (nothing written) when the counts differ or are zero,
for the caller to fall back to ``WeightedMean``. The operations, their
order and their types are those of ``WeightedMean`` (no fast-math, so no
fused multiply-add and no reassociation), so the bits are the same; a test
holds them equal.

With two parts (the usual case) the sum, the scaling and the check are one
pass over the slots (``mean_of_two_finite``) instead of three; the sharded
step runs the same pass on each of its shards, in place of BLAS copy, axpy,
scal and asum (four passes).

Why compiled: on a model as small as seed 001's 1-16-1 net, the separate
BLAS/NumPy calls for the mean and the check cost a visible share of a step
(``bench/seed_overhead.py``).
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def mean_of_two_finite(a, b, out, scale):
    """``out = (a + b) * scale`` in one vectorised pass (contiguous 1-D
    arrays); 1 if ``out`` is finite, else 0. The sharded step calls it on
    each of its shards, the replicated step through ``equal_mean_finite``."""
    bad = False
    for i in range(out.shape[0]):
        v = (a[i] + b[i]) * scale
        out[i] = v
        bad |= (v - v) != 0  # NaN and +-Inf give NaN
    return 0 if bad else 1


@numba.njit(nogil=True, cache=True)
def equal_mean_finite(slots, counts, out, scale):
    parts, n = slots.shape[0], out.shape[0]
    first = counts[0]
    if first == 0:
        return -1
    for k in range(1, parts):
        if counts[k] != first:
            return -1
    if parts == 2:  # the usual case
        return mean_of_two_finite(slots[0], slots[1], out, scale)
    bad = False
    for i in range(n):
        out[i] = slots[0, i]
    for k in range(1, parts):
        for i in range(n):
            out[i] += slots[k, i]
    for i in range(n):
        v = out[i] * scale if parts > 1 else out[i]  # one part: a copy, unscaled
        out[i] = v
        bad |= (v - v) != 0
    return 0 if bad else 1


def equal_mean_finite_for(dtype):
    """The kernel, compiled (or loaded from the cache) now, before the clock
    starts; for a type it does not take, a stand-in that always says -1."""
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        return _unhandled
    slots = np.zeros((2, 4), dtype=dtype)
    equal_mean_finite(slots, np.ones(2, dtype=np.int64), np.empty(4, dtype=dtype),
                      np.dtype(dtype).type(0.5))
    return equal_mean_finite


def _unhandled(slots, counts, out, scale) -> int:
    return -1


def mean_of_two_finite_for(dtype):
    """``mean_of_two_finite`` compiled (or loaded from the cache) now, or
    None for a type it does not take."""
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    two = np.zeros(4, dtype=dtype)
    mean_of_two_finite(two, two, np.empty(4, dtype=dtype), np.dtype(dtype).type(0.5))
    return mean_of_two_finite

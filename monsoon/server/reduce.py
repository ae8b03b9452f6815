"""The synchronous step's sum, shared by every engine so that they agree to
the last bit: sum_k (examples_k / total) * contribution_k, over the counted
workers in rank order (so the result does not depend on arrival order).

When every worker saw as many examples (the usual case), the mean is
(c_0 + c_1 + ...) * (1 / N), and on float32/float64 it runs as BLAS copy,
axpy with a = 1 and scal: y + 1 * x rounds once with or without FMA, so the
bits are those of NumPy's add and multiply, whatever the slicing. BLAS is
used because NumPy's ufunc machinery costs a visible share of a small
model's step (bench/seed_overhead.py).

``step_sums`` is that sum shard by shard, with the one check a step needs:
a non-finite sum in any shard drops the whole step (every engine's rule)."""
from __future__ import annotations

import math

import numpy as np
from scipy.linalg import blas

from .. import arrays

_ASUM = {np.dtype("float32"): blas.sasum, np.dtype("float64"): blas.dasum}
_AXPY_SCAL = {np.dtype("float32"): (blas.saxpy, blas.sscal),
              np.dtype("float64"): (blas.daxpy, blas.dscal)}


def finite(g: np.ndarray) -> bool:
    """One pass, no allocation: NaN and Inf propagate through a sum of
    absolute values (BLAS asum, faster than NumPy's pairwise sum; a finite
    vector only fails if its 1-norm overflows, i.e. it is garbage). A
    tensor (on its device): one sum, one number read back."""
    if arrays.is_tensor(g):
        return arrays.finite(g)
    asum = _ASUM.get(g.dtype)
    if asum is not None and g.flags.c_contiguous and g.size:
        return math.isfinite(asum(g))
    return math.isfinite(float(np.add.reduce(g, axis=None)))


def into_slot(slot, grad) -> bool:
    """An ``AllReduce``'s contribution written into its worker's ``slot``:
    ``grad``, or zeros where the op has none (0 times a stale NaN would
    still be NaN). Returns whether it had one."""
    if grad is None:
        slot[...] = 0
        return False
    if grad is not slot:  # not computed in place (a compressed message)
        arrays.copyto(slot, grad)
    return True


class WeightedMean:
    """The weighted mean of fixed contribution arrays (``parts``, in rank
    order) into ``out``; ``tmp`` is scratch of the same shape. Checked once,
    called every step with the examples behind each part."""

    def __init__(self, parts: list, out: np.ndarray, tmp: np.ndarray):
        self.parts = parts
        self.out = out
        self.tmp = tmp
        self.scale = 1.0 / len(parts)
        blas_ops = None if arrays.is_tensor(out) else _AXPY_SCAL.get(out.dtype)
        # BLAS writes ``out`` in place only if it is contiguous, and reads
        # the parts without a copy only if they are contiguous, of its type.
        if blas_ops is not None and out.flags.c_contiguous and all(
                p.dtype == out.dtype and p.flags.c_contiguous for p in parts):
            self.axpy, self.scal = blas_ops
        else:
            self.axpy = self.scal = None

    def __call__(self, examples: list[int]) -> np.ndarray:
        parts, out = self.parts, self.out
        first = examples[0]
        if first and examples.count(first) == len(examples):  # equal weights
            arrays.copyto(out, parts[0])
            if len(parts) == 1:
                return out
            if self.axpy is not None:
                for part in parts[1:]:
                    self.axpy(part, out, a=1.0)
                self.scal(self.scale, out)
            else:
                for part in parts[1:]:
                    out += part
                out *= self.scale
            return out
        total = sum(examples)
        weights = [e / total if total else 0.0 for e in examples]
        xp = arrays.namespace(out)
        xp.multiply(parts[0], weights[0], out=out)
        for part, wk in zip(parts[1:], weights[1:]):
            xp.multiply(part, wk, out=self.tmp)
            out += self.tmp
        return out


def weighted_sum(contributions, ranks: list[int], examples: list[int], out: np.ndarray,
                 tmp: np.ndarray) -> np.ndarray:
    """Write the example-weighted mean of ``contributions[k]`` (k in
    ``ranks``, sorted) into ``out``; ``tmp`` is scratch of the same shape."""
    return WeightedMean([contributions[k] for k in ranks], out, tmp)(examples)


def step_sums(contributions, ranks: list[int], examples: list[int], bounds, out, tmp
              ) -> tuple[list, bool]:
    """A synchronous step's sums: on each shard [a, b) of ``bounds``, the
    weighted mean of ``contributions[k][a:b]`` (k in ``ranks``, sorted)
    written into ``out[a:b]`` (``tmp``: scratch like ``out``). Returns those
    views, in ``bounds``' order, and whether every one is finite (if not,
    the step is dropped on every shard)."""
    sums = [WeightedMean([contributions[k][a:b] for k in ranks], out[a:b], tmp[a:b])(examples)
            for a, b in bounds]
    return sums, all(finite(acc) for acc in sums)

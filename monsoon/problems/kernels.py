"""Compiled per-example SGD loops (Numba, ``nogil=True``): one call runs a
whole slice of an epoch, with no Python per example, so Hogwild! threads run
them truly in parallel on one shared weight vector, without locks.

Sparse linear model, example i with features u (CSR row i), z = x_i.w + b:

    d = dl/dz (logistic, hinge or squared)
    w_u <- w_u - lr (d x_iu + lam w_u / d_u)    for u in row i only
    b   <- b - lr d

As scikit-learn's SGD does, the compiled loop takes arrays and integer codes
only; validation and names stay in Python (``sparse_linear.py``).
"""
from __future__ import annotations

import math

import numba
import numpy as np

LOSS_CODES = {"logistic": 0, "hinge": 1, "squared": 2}


@numba.njit(nogil=True, cache=True)
def sparse_sgd_pass(indptr, indices, data, y, w, order, lr, lam, inv_degree, loss_code):
    """Per-example SGD over the rows in ``order``, in place on ``w``;
    returns the sum of the losses seen (each before its own update)."""
    bias = w.shape[0] - 1
    total = 0.0
    for k in range(order.shape[0]):
        i = order[k]
        start, end = indptr[i], indptr[i + 1]
        z = w[bias]
        for p in range(start, end):
            z += w[indices[p]] * data[p]
        yi = y[i]
        if loss_code == 0:
            s = 2.0 * yi - 1.0
            sz = s * z
            if sz > 0:
                e = math.exp(-sz)
                d = -s * e / (1.0 + e)
                total += math.log1p(e)
            else:
                e = math.exp(sz)
                d = -s / (1.0 + e)
                total += -sz + math.log1p(e)
        elif loss_code == 1:
            s = 2.0 * yi - 1.0
            if s * z < 1.0:
                d = -s
                total += 1.0 - s * z
            else:
                d = 0.0
        else:
            d = z - yi
            total += 0.5 * d * d
        for p in range(start, end):
            j = indices[p]
            w[j] -= lr * (d * data[p] + lam * w[j] * inv_degree[j])
        w[bias] -= lr * d
    return total


def warm_up(X, y, w, inv_degree, loss_code):
    """Compile for these dtypes now, not inside a timed run."""
    sparse_sgd_pass(X.indptr, X.indices, X.data, y, w.copy(), np.empty(0, dtype=np.int64),
                    0.0, 0.0, inv_degree, loss_code)


@numba.njit(nogil=True, cache=True)
def mf_sgd_pass(users, items, ratings, w, n_users, rank, order, lr, lam, inv_user_degree,
                inv_item_degree):
    """Per-rating SGD over ``order`` on the factors stored in ``w`` (L then R,
    row by row); returns the sum of squared errors / 2 seen."""
    item_base = n_users * rank
    total = 0.0
    for k in range(order.shape[0]):
        n = order[k]
        u, i = users[n], items[n]
        lu, ri = u * rank, item_base + i * rank
        pred = 0.0
        for f in range(rank):
            pred += w[lu + f] * w[ri + f]
        e = ratings[n] - pred
        total += 0.5 * e * e
        su, si = lam * inv_user_degree[u], lam * inv_item_degree[i]
        for f in range(rank):
            a, b = w[lu + f], w[ri + f]
            w[lu + f] = a + lr * (e * b - su * a)
            w[ri + f] = b + lr * (e * a - si * b)
    return total

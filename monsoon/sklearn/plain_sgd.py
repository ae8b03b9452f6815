"""scikit-learn's ``_plain_sgd`` epoch loop, on the compiled ``kernel``, with
``n_jobs`` Hogwild! threads.

Same arguments and results as scikit-learn's (weights updated in place;
returns weights, intercept, average weights, average intercept and the
number of epochs), except that the data come as arrays (CSR
``indptr/indices/data`` or a dense C-ordered array, used as they are: no
copy, no conversion, no re-sorting) instead of a ``SequentialDataset``.

Per epoch: the training rows (those not held out for early stopping) in a
random order (an index array shuffled in place; the data never move); one
thread runs them in order, several claim chunks of them (``kernel``); then
the weights are checked finite and the stopping rule is scikit-learn's:
the epoch's mean objective (or, with ``early_stopping``, the validation
score, on the weights with ``wscale`` folded in) must improve by ``tol`` at
least once in ``n_iter_no_change`` epochs; 'adaptive' then divides eta by
5 instead of stopping while eta > 1e-6.

Hot coordinates: with more than one thread, the features present in at
least ``HOT_SHARE`` of the rows (the ``HOT_MAX`` most frequent at most) get
per-thread copies, stored after the weights in one array (``W``). When
the first step's L2 shrink exceeds ``MAX_SHARED_DECAY`` (huge alpha * eta),
one thread runs: the weights would need folding every few steps.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from . import kernel as K

HOT_SHARE = 0.1
HOT_MAX = 64
HOT_SAMPLE = 4096
FLUSH_EVERY = 8
MAX_SHARED_DECAY = 0.1


def _first_decay(learning_rate, alpha, l1_ratio, eta0, power_t, optimal_init, t):
    """The L2 shrink of the first step, (1 - l1_ratio) eta alpha: the largest."""
    if learning_rate == K.OPTIMAL:
        eta = 1.0 / (alpha * (optimal_init + t - 1))
    elif learning_rate == K.INVSCALING:
        eta = eta0 / t ** power_t
    else:
        eta = eta0
    return (1.0 - l1_ratio) * eta * alpha


def hot_features(X, n_jobs: int) -> np.ndarray:
    """The features to copy per thread: those in at least HOT_SHARE of the
    rows, the HOT_MAX most frequent at most (none with one thread, or dense
    data). Counted on the first HOT_SAMPLE rows: a feature that frequent
    shows in any few thousand rows, and counting all would cost a pass."""
    if n_jobs <= 1 or not sp.issparse(X) or X.shape[0] == 0:
        return np.empty(0, dtype=np.int64)
    rows = min(X.shape[0], HOT_SAMPLE)
    degree = np.bincount(X.indices[X.indptr[0]:X.indptr[rows]], minlength=X.shape[1])
    hot = np.flatnonzero(degree >= max(2, HOT_SHARE * rows))
    if len(hot) > HOT_MAX:
        hot = hot[np.argsort(degree[hot])[::-1][:HOT_MAX]]
    return np.sort(hot).astype(np.int64)


def hash_table(hot):
    """A perfect hash of the hot feature ids for ``kernel.slot``:
    [multiplier, 2^B keys (empty: 2^64 - 1), 2^B slots], h(j) = (j m mod 2^64)
    >> (64 - B); tries odd multipliers until no two hot ids collide (None if
    none does)."""
    size = 1 << K.TABLE_BITS
    keys = hot.astype(np.uint64)
    rng = np.random.default_rng(20260)
    for _ in range(200):
        mult = np.uint64(rng.integers(1, 2 ** 63)) * np.uint64(2) + np.uint64(1)
        with np.errstate(over="ignore"):
            h = (keys * mult) >> np.uint64(64 - K.TABLE_BITS)
        if len(np.unique(h)) == len(h):
            table = np.zeros(1 + 2 * size, dtype=np.uint64)
            table[0] = mult
            table[1:1 + size] = np.iinfo(np.uint64).max
            table[1 + h.astype(np.int64)] = keys
            table[1 + size + h.astype(np.int64)] = np.arange(len(hot), dtype=np.uint64)
            return table
    return None


def _arrays(X):
    if sp.issparse(X):
        return X.indptr, X.indices, X.data, 0
    return np.zeros(1, dtype=np.int64), None, X.reshape(-1), X.shape[1]  # C-ordered: a view


def _with_copies(v, jobs, width):
    """``v`` followed by ``jobs`` regions of ``width`` per-thread copies."""
    return v if width == 0 else np.concatenate([v, np.zeros(jobs * width, dtype=v.dtype)])


def plain_sgd(weights, intercept, average_weights, average_intercept, loss_code, loss_param,
              penalty_type, alpha, l1_ratio, X, y, sample_weight, intercept_decay,
              validation_mask, early_stopping, validation_score_cb, n_iter_no_change, max_iter,
              tol, fit_intercept, verbose, shuffle, seed, weight_pos, weight_neg, learning_rate,
              eta0, power_t, t=1.0, average=0, n_jobs=1, hot=None):
    n_samples, n_features = X.shape
    indptr, indices, data, cols = _arrays(X)
    y = np.ascontiguousarray(y, dtype=data.dtype)
    sample_weight = np.ascontiguousarray(sample_weight, dtype=data.dtype)
    if penalty_type == K.L2:
        l1_ratio = 0.0
    elif penalty_type == K.L1:
        l1_ratio = 1.0
    optimal_init = 0.0
    if learning_rate == K.OPTIMAL:
        typw = math.sqrt(1.0 / math.sqrt(alpha))
        initial_eta0 = typw / max(1.0, K.loss_gradient(loss_code, loss_param, 1.0, -typw))
        optimal_init = 1.0 / (initial_eta0 * alpha)
    train = np.flatnonzero(~np.asarray(validation_mask, dtype=bool)).astype(np.int64)
    train_count = len(train)
    jobs = max(1, min(int(n_jobs), train_count // K.CHUNK or 1))
    if jobs > 1 and _first_decay(learning_rate, alpha, l1_ratio, eta0, power_t, optimal_init,
                                 t) > MAX_SHARED_DECAY:
        jobs = 1  # weights shrink so fast that the threads would fold wscale all the time
    hot = np.empty(0, dtype=np.int64) if jobs == 1 or hot is None else hot
    width = 0 if len(hot) == 0 else -(-len(hot) // 8) * 8 + 8  # own cache lines
    hot_table = hash_table(hot) if width else None
    if hot_table is None:
        hot, width = np.empty(0, dtype=np.int64), 0
    use_q = penalty_type in (K.L1, K.ELASTICNET)
    W = _with_copies(weights, jobs, width)
    Q = _with_copies(np.zeros(n_features if use_q else 1, dtype=weights.dtype), jobs,
                     width if use_q else 0)
    aw = average_weights if average_weights is not None else np.zeros(1, dtype=weights.dtype)
    longest = 1 if not width else cols if indices is None else int(np.diff(indptr).max())
    last = [(np.zeros(max(width, 1), dtype=weights.dtype),
             np.zeros(max(width, 1), dtype=weights.dtype),
             np.zeros(max(longest, 1), dtype=np.uint64))  # where a row's features live
            for _ in range(jobs)]
    shared_b = np.array([intercept], dtype=np.float64)

    cfg = np.zeros(K.N_CFG)
    cfg[[K.C_LOSS, K.C_LOSS_PARAM, K.C_PENALTY, K.C_ALPHA, K.C_L1_RATIO, K.C_LR, K.C_ETA,
         K.C_ETA0, K.C_POWER_T, K.C_T0, K.C_FIT_INTERCEPT, K.C_INTERCEPT_DECAY, K.C_AVERAGE,
         K.C_WEIGHT_POS, K.C_WEIGHT_NEG, K.C_STRIDE, K.C_COMPUTE_LOSS, K.C_FLUSH]] = [
        loss_code, loss_param, penalty_type, alpha, l1_ratio, learning_rate, eta0, eta0,
        power_t, optimal_init, fit_intercept, intercept_decay, average, weight_pos, weight_neg,
        jobs, bool(verbose or not early_stopping), FLUSH_EVERY]
    state = np.zeros(K.N_STATE)
    state[[K.S_T, K.S_WSCALE, K.S_INTERCEPT, K.S_AVG_B, K.S_AVG_INTERCEPT]] = \
        [t, 1.0, intercept, 1.0, average_intercept]
    state[K.S_SQ_NORM] = float(weights @ weights)
    state[K.S_L1_NORM] = float(np.abs(weights).sum())
    hot_idx = hot if width else np.empty(0, dtype=np.int64)
    wv = W[:n_features]  # the weights (a view of W)

    counter = np.zeros(8, dtype=np.int64)  # the next position to claim (own cache line)

    def run(st, order, lo, hi, k):
        return K.sgd_run(indptr, indices, data, cols, y, sample_weight, order, lo, hi, W, aw, Q,
                         hot_table, hot_idx, n_features + k * width, *last[k], shared_b, cfg, st,
                         counter)

    def reset_wscale(st):
        if average_weights is not None:
            np.add(average_weights, st[K.S_AVG_A] * wv, out=average_weights)
            np.divide(average_weights, st[K.S_AVG_B], out=average_weights)
            st[K.S_AVG_A], st[K.S_AVG_B] = 0.0, 1.0
        np.multiply(wv, st[K.S_WSCALE], out=wv)
        st[K.S_WSCALE] = 1.0

    rng = np.random.default_rng(seed)
    order = train  # shuffled in place each epoch: an index array, the data never move
    best_objective, best_score, no_improvement = math.inf, -math.inf, 0
    t_start = time.time()
    pool = ThreadPoolExecutor(jobs - 1) if jobs > 1 else None
    epoch = 0
    try:
        for epoch in range(max_iter):
            state[K.S_SUMLOSS] = state[K.S_OBJECTIVE] = 0.0
            if verbose > 0:
                print("-- Epoch %d" % (epoch + 1))
            if shuffle:
                K.shuffle(order, int(rng.integers(2 ** 31)))
            if jobs == 1:
                lo = 0
                while lo < train_count:
                    lo += run(state, order, lo, train_count, 0)
                    if lo < train_count:
                        reset_wscale(state)
            else:
                _hogwild_epoch(run, reset_wscale, cfg, state, order, train_count, jobs, pool,
                               shared_b, counter)
            state[K.S_INTERCEPT] = shared_b[0] if jobs > 1 else state[K.S_INTERCEPT]
            shared_b[0] = state[K.S_INTERCEPT]
            if early_stopping:  # the score needs the true weights
                reset_wscale(state)
            if not math.isfinite(state[K.S_INTERCEPT]) or not np.isfinite(wv).all():
                raise ValueError("Floating-point under-/overflow occurred at epoch #%d. Scaling "
                                 "input data with StandardScaler or MinMaxScaler might help."
                                 % (epoch + 1))
            mean_loss = state[K.S_SUMLOSS] / max(train_count, 1)
            objective = state[K.S_OBJECTIVE] / max(train_count, 1)
            if early_stopping:
                score = validation_score_cb(wv, state[K.S_INTERCEPT])
                if verbose > 0:
                    _report(wv, state, mean_loss, objective, t_start, score)
                no_improvement = no_improvement + 1 if (tol > -math.inf and
                                                        score < best_score + tol) else 0
                best_score = max(best_score, score)
            else:
                if verbose > 0:
                    _report(wv, state, mean_loss, objective, t_start)
                no_improvement = no_improvement + 1 if (tol > -math.inf and
                                                        objective > best_objective - tol) else 0
                best_objective = min(best_objective, objective)
            if no_improvement >= n_iter_no_change:
                if learning_rate == K.ADAPTIVE and cfg[K.C_ETA] > 1e-6:
                    cfg[K.C_ETA] /= 5
                    no_improvement = 0
                else:
                    if verbose:
                        print("Convergence after %d epochs took %.2f seconds"
                              % (epoch + 1, time.time() - t_start))
                    break
    finally:
        if pool is not None:
            pool.shutdown()
    reset_wscale(state)
    if W is not weights:
        weights[:] = wv
    return (weights, state[K.S_INTERCEPT], average_weights, state[K.S_AVG_INTERCEPT],
            epoch + 1)


def _hogwild_epoch(run, reset_wscale, cfg, state, order, n, jobs, pool, shared_b, counter):
    """One epoch on ``jobs`` threads claiming chunks of ``order`` from
    ``counter``; a round ends early only when wscale needs folding."""
    lo = 0
    while lo < n:
        counter[0] = lo
        states = []
        for _ in range(jobs):
            st = state.copy()
            st[K.S_SUMLOSS] = st[K.S_OBJECTIVE] = st[K.S_COUNT] = 0.0
            states.append(st)
        futures = [pool.submit(run, states[k], order, lo, n, k) for k in range(1, jobs)]
        run(states[0], order, lo, n, 0)
        for f in futures:
            f.result()
        reached = min(int(counter[0]), n)
        ahead = max(states, key=lambda st: st[K.S_T])  # the scalars: the furthest clock's
        for slot in (K.S_WSCALE, K.S_AVG_A, K.S_AVG_B, K.S_U, K.S_AVG_INTERCEPT, K.S_SQ_NORM,
                     K.S_L1_NORM):
            state[slot] = ahead[slot]
        for slot in (K.S_SUMLOSS, K.S_OBJECTIVE, K.S_COUNT):
            state[slot] += sum(st[slot] for st in states)
        target = state[K.S_T] + (reached - lo)
        state[K.S_T] = ahead[K.S_T]
        state[K.S_INTERCEPT] = shared_b[0]
        K.advance(cfg, state, int(target - state[K.S_T]))
        if reached < n:
            reset_wscale(state)
        lo = reached


def _report(wv, state, mean_loss, objective, t_start, score=None):
    line = ("Norm: %.2f, NNZs: %d, Bias: %.6f, T: %d, Avg. loss: %f, Objective: %f"
            % (math.sqrt(state[K.S_SQ_NORM]), np.count_nonzero(wv), state[K.S_INTERCEPT],
               state[K.S_COUNT], mean_loss, objective))
    print(line + ("" if score is None else ", Validation score: %f" % score))
    print("Total training time: %.2f seconds." % (time.time() - t_start))

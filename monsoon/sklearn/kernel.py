"""scikit-learn's per-example SGD loop (``_plain_sgd``, formulas and order
from ``sklearn/linear_model/_sgd_fast.pyx.tp``), compiled with ``nogil`` so
that ``n_jobs`` threads run it on one weight vector (Hogwild!, Niu, Recht,
Re and Wright, NIPS 2011). Per example: p = wscale (v . x) + b; eta by the
schedule; update = -eta clip(dloss(y, p)) class_weight sample_weight; the
L2 part by scaling (wscale *= 1 - (1 - l1_ratio) eta alpha); v += x update
/ wscale, b += update * decay ('adagrad', not scikit-learn's: w_j moves by
eta0 g_j / sqrt(G_j), G_j the sum of g_j^2, g_j = -slope x_j, Duchi, Hazan
and Singer 2011; the intercept likewise; eta0 scales the L2 part); ASGD (Bottou's sparse trick: the average is
(aw + a v) / b); the L1 part as truncated gradient (Tsuruoka et al. 2009).
The log-loss is kept as signed margins and summed after the epoch
(``plain_sgd.log_loss_sum``); a step whose written values' squares sum to
a non-finite number flags the vector for a scan (``S_SUSPECT``).

Threads claim chunks of CHUNK positions of the epoch's order (an atomic
add); the example at position c runs at scikit-learn's step t(lo) + c.
What the threads share, and how:
- RACED, on purpose (Hogwild!): the weights v, L1's per-feature q and
  adagrad's G_j, read and written without locks (a write may be lost).
- NOT RACED, per thread: wscale, the L1 total u, the ASGD scalars a and b,
  the clock t and the average intercept depend only on the step, so each
  thread advances its own copy through the others' steps (``advance``).
  wscale is folded only by the caller, between rounds: a thread stops
  claiming once its wscale is below WSCALE_THRESHOLD (``sgd_run``).
- NOT RACED, atomic: the intercept (and adagrad's G of it), read at each
  example, changed by atomic adds (``shared_b``); the claim counter.
- NOT RACED, atomic: the average weights. A write of scikit-learn's aw
  lost to another thread would stay in the average for good (issue #36:
  log-losses of 3-30 for 0.39), so threads keep S_j = aw_j + a_j v_j and a
  time stamp a_j per feature: before writing v_j a thread moves a_j
  forward to its a (an atomic max; only forward, so the stamps follow the
  leading thread's clock and v is sampled in the order the writes really
  happen) and adds v_j times the gap to S_j (an atomic add). The caller
  converts aw to S before a round and back (aw = S - a_j v) after it.
- NOT SHARED: the margins (each position is one thread's), the loss sums
  (per thread, added by the caller), the stopping rule (the caller's).
One thread (J = 1) runs scikit-learn's loop update for update: fits with
``shuffle=False`` agree with ``SGDClassifier``/``SGDRegressor`` to
rounding. Rows ahead are prefetched; loop indices are unsigned.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import int64, uint64

from .intrinsics import (atomic_add_float, fetch_add, fetch_max_f64, load_acquire, monotonic_ns, prefetch,
                         store_release)

# loss codes; sklearn's classification losses take y in {-1, 1}, log_loss y in {0, 1}
HINGE, SQUARED_HINGE, LOG, MODIFIED_HUBER, SQUARED, HUBER, EPS_INSENSITIVE, SQ_EPS_INSENSITIVE = \
    range(8)
NO_PENALTY, L1, L2, ELASTICNET = 0, 1, 2, 3
CONSTANT, OPTIMAL, INVSCALING, ADAPTIVE, ADAGRAD = 1, 2, 3, 4, 5
ADAGRAD_EPS = 1e-12  # added to sqrt(G): a feature's first gradient of 0 takes no step
MAX_DLOSS = 1e12
AHEAD_ROW, AHEAD_DATA, AHEAD_WEIGHTS = 16, 8, 3  # prefetch distances, in examples
CHUNK = 256  # examples a thread claims at a time
FAR_WEIGHTS = 1 << 17  # more weights than this: prefetch those of the rows ahead too
WSCALE_THRESHOLD = 1e-9
LOSS_NOW, LOSS_LATER = 1, 2  # cfg[C_COMPUTE_LOSS]: the loss in the loop, or its margins kept
MAX_FINITE = np.finfo(np.float64).max
JUDGE_CHUNK = 32  # examples a thread claims at a time while its speed is judged

# cfg slots
(C_LOSS, C_LOSS_PARAM, C_PENALTY, C_ALPHA, C_L1_RATIO, C_LR, C_ETA, C_ETA0, C_POWER_T, C_T0,
 C_FIT_INTERCEPT, C_INTERCEPT_DECAY, C_AVERAGE, C_WEIGHT_POS, C_WEIGHT_NEG, C_STRIDE,
 C_COMPUTE_LOSS, C_JUDGE_NS, C_JUDGE_SLACK_NS, C_JUDGE_LONG_NS, C_JUDGE_CLEARLY,
 C_JUDGE_SLOWER) = range(22)
N_CFG = 22
# counter slots (int64): the next position to claim, the judge's verdict, clock and count
K_NEXT, K_STOP, K_BEGAN, K_DONE, K_ARRIVED = 0, 1, 2, 3, 4
N_COUNTER = 8
# per-thread state slots
(S_T, S_WSCALE, S_INTERCEPT, S_AVG_A, S_AVG_B, S_AVG_INTERCEPT, S_U, S_SQ_NORM, S_L1_NORM,
 S_SUMLOSS, S_OBJECTIVE, S_COUNT, S_SUSPECT) = range(13)
N_STATE = 13


@numba.njit(inline="always")
def loss_value(code, param, y, p):
    if code == HINGE:
        z = p * y
        return param - z if z <= param else 0.0
    if code == SQUARED_HINGE:
        z = param - p * y
        return z * z if z > 0 else 0.0
    if code == LOG:  # log(1 + exp(p)) - y p, stable
        if p <= -37.0:
            return math.exp(p) - y * p
        if p <= 18.0:
            return math.log1p(math.exp(p)) - y * p
        return p + math.exp(-p) - y * p if p <= 33.3 else p - y * p
    if code == MODIFIED_HUBER:
        z = p * y
        if z >= 1.0:
            return 0.0
        if z >= -1.0:
            return (1.0 - z) * (1.0 - z)
        return -4.0 * z
    if code == SQUARED:
        return 0.5 * (p - y) * (p - y)
    if code == HUBER:
        r = abs(y - p)
        return 0.5 * r * r if r <= param else param * (r - 0.5 * param)
    r = abs(y - p) - param
    if code == EPS_INSENSITIVE:
        return r if r > 0 else 0.0
    return r * r if r > 0 else 0.0


@numba.njit(inline="always")
def loss_gradient(code, param, y, p):
    """d loss / d p, as scikit-learn's ``cy_gradient(y, p)``."""
    if code == HINGE:
        return -y if p * y <= param else 0.0
    if code == SQUARED_HINGE:
        z = param - p * y
        return -2.0 * y * z if z > 0 else 0.0
    if code == LOG:  # expit(p) - y, stable
        if p > -37.0:
            e = math.exp(-p)
            return ((1.0 - y) - y * e) / (1.0 + e)
        return math.exp(p) - y
    if code == MODIFIED_HUBER:
        z = p * y
        if z >= 1.0:
            return 0.0
        if z >= -1.0:
            return 2.0 * (1.0 - z) * -y
        return -4.0 * y
    if code == SQUARED:
        return p - y
    if code == HUBER:
        r = p - y
        if abs(r) <= param:
            return r
        return param if r >= 0 else -param
    z = y - p
    if code == EPS_INSENSITIVE:
        if z > param:
            return -1.0
        if -z > param:
            return 1.0
        return 0.0
    if z > param:
        return -2.0 * (z - param)
    if z < -param:
        return 2.0 * (-z - param)
    return 0.0


@numba.njit(inline="always")
def step_size(lr, eta, eta0, power_t, alpha, t0, t):
    if lr == OPTIMAL:
        return 1.0 / (alpha * (t0 + t - 1.0))
    if lr == INVSCALING:
        return eta0 / t ** power_t
    return eta


@numba.njit(inline="always")
def column(indices, pos, start):
    if indices is None:  # dense rows
        return pos - start
    return uint64(indices[pos])


@numba.njit(nogil=True, cache=True)
def sgd_range(indptr, indices, data, width, y, sample_weight, order, lo, hi, w, aw, q,
              shared_b, cfg, st, margins, counter, alast, gsq):
    """Examples ``order[lo:hi]`` (rows of CSR ``indptr/indices/data``, or of a
    dense C-ordered ``data`` with ``width`` columns when ``indices`` is
    None), updating ``w`` (and ``aw``, ``q``) in place and this thread's
    state ``st``; returns how many ran."""
    code, param = int(cfg[C_LOSS]), cfg[C_LOSS_PARAM]
    penalty, alpha, l1_ratio = int(cfg[C_PENALTY]), cfg[C_ALPHA], cfg[C_L1_RATIO]
    lr, eta, eta0, power_t, t0 = int(cfg[C_LR]), cfg[C_ETA], cfg[C_ETA0], cfg[C_POWER_T], cfg[C_T0]
    fit_intercept, decay = cfg[C_FIT_INTERCEPT] != 0, cfg[C_INTERCEPT_DECAY]
    average, weight_pos, weight_neg = cfg[C_AVERAGE], cfg[C_WEIGHT_POS], cfg[C_WEIGHT_NEG]
    stride, compute_loss = int(cfg[C_STRIDE]), int(cfg[C_COMPUTE_LOSS])
    n_features = aw.shape[0] if average > 0 else 0
    use_l1 = penalty == L1 or penalty == ELASTICNET
    shared_intercept = stride > 1
    adagrad = lr == ADAGRAD  # per-feature steps eta0 / sqrt(G_j) (module doc)
    lazy = average > 0 and stride > 1  # the threads' average: ``aw`` holds S (module doc)
    far_weights = indices is not None and w.shape[0] > FAR_WEIGHTS  # beyond L2: prefetch

    t, wscale, intercept = st[S_T], st[S_WSCALE], st[S_INTERCEPT]
    avg_a, avg_b, avg_intercept, u = st[S_AVG_A], st[S_AVG_B], st[S_AVG_INTERCEPT], st[S_U]
    sq_norm, l1_norm = st[S_SQ_NORM], st[S_L1_NORM]
    sumloss, objective, count = st[S_SUMLOSS], st[S_OBJECTIVE], st[S_COUNT]
    suspect = st[S_SUSPECT]

    done = 0
    for k in range(lo, hi):
        # unsigned indices: no negative-index wraparound code in the loops
        i = uint64(order[k])
        if indices is None:
            start, end = i * uint64(width), (i + uint64(1)) * uint64(width)
        else:
            start, end = uint64(indptr[i]), uint64(indptr[i + uint64(1)])
        # memory: the order is known, so start loading the rows ahead now
        if k + AHEAD_ROW < hi:
            r = uint64(order[k + AHEAD_ROW])
            prefetch(y, r)
            if indices is not None:
                prefetch(indptr, r)
        if k + AHEAD_DATA < hi:
            r = uint64(order[k + AHEAD_DATA])
            if indices is None:
                for pos in range(r * uint64(width), (r + uint64(1)) * uint64(width), uint64(8)):
                    prefetch(data, pos)
            else:
                lo_r, hi_r = uint64(indptr[r]), uint64(indptr[r + uint64(1)])
                for pos in range(lo_r, hi_r, uint64(8)):
                    prefetch(data, pos)
                for pos in range(lo_r, hi_r, uint64(16)):
                    prefetch(indices, pos)
        if far_weights and k + AHEAD_WEIGHTS < hi:
            r = uint64(order[k + AHEAD_WEIGHTS])
            for pos in range(uint64(indptr[r]), uint64(indptr[r + uint64(1)])):
                prefetch(w, indices[pos])
        dot = 0.0
        for pos in range(start, end):
            dot += w[column(indices, pos, start)] * data[pos]
        if shared_intercept:  # the shared intercept, as the weights are: as it is now
            intercept = shared_b[0]
        p = dot * wscale + intercept
        eta = step_size(lr, eta, eta0, power_t, alpha, t0, t)
        yi = y[i]
        if compute_loss == LOSS_LATER:  # signed: see the module doc
            margins[k] = p if yi == 0.0 else -p
        elif compute_loss == LOSS_NOW:
            cur = loss_value(code, param, yi, p)
            sumloss += cur
            objective += cur
        dloss = loss_gradient(code, param, yi, p)
        if compute_loss and penalty > 0:
            objective += alpha * ((1.0 - l1_ratio) * 0.5 * sq_norm + l1_ratio * l1_norm)
        class_weight = weight_pos if yi > 0.0 else weight_neg
        if dloss < -MAX_DLOSS:
            dloss = -MAX_DLOSS
        elif dloss > MAX_DLOSS:
            dloss = MAX_DLOSS
        update = -eta * dloss * (class_weight * sample_weight[i])
        if penalty >= L2:
            c = max(0.0, 1.0 - (1.0 - l1_ratio) * eta * alpha)
            wscale *= c
            sq_norm *= c * c
            l1_norm *= abs(c)
            if wscale < WSCALE_THRESHOLD and stride == 1:
                # sklearn's reset_wscale, inline, alone; threads stop claiming
                # work instead and the caller folds it (``sgd_run``)
                if average > 0:
                    for j in range(n_features):
                        aw[j] = (aw[j] + avg_a * w[j]) / avg_b
                    avg_a, avg_b = 0.0, 1.0
                for j in range(w.shape[0]):
                    w[j] *= wscale
                wscale = 1.0
        averaging = 0 < average <= t
        if update != 0.0:
            step = update / wscale
            gscale = -dloss * (class_weight * sample_weight[i])  # adagrad: the loss's slope
            l2acc = 0.0
            l1acc = 0.0
            for pos in range(start, end):
                j = column(indices, pos, start)
                old = w[j]
                if lazy and averaging:  # S_j += v_j (A - a_j), a_j = A: v_j's share so far
                    a = fetch_max_f64(alast, j, avg_a)
                    if avg_a > a:
                        atomic_add_float(aw, j, old * (avg_a - a))
                if adagrad:
                    gj = data[pos] * gscale
                    acc = gsq[j] + gj * gj
                    gsq[j] = acc
                    dv = eta0 * gj / ((math.sqrt(acc) + ADAGRAD_EPS) * wscale)
                    if averaging and not lazy:
                        aw[j] -= avg_a * dv
                else:
                    dv = data[pos] * step
                v = old + dv
                w[j] = v
                l2acc += v * v
                l1acc += abs(v)
            sq_norm = l2acc * (wscale * wscale)
            l1_norm = l1acc * wscale
            if not l2acc <= MAX_FINITE:  # inf or NaN: a weight may be non-finite
                suspect = 1.0
            if fit_intercept:
                bstep = update
                if adagrad:
                    if shared_intercept:
                        gb = atomic_add_float(shared_b, 1, gscale * gscale) + gscale * gscale
                    else:
                        gb = shared_b[1] + gscale * gscale
                        shared_b[1] = gb
                    bstep = eta0 * gscale / (math.sqrt(gb) + ADAGRAD_EPS)
                if shared_intercept:  # atomic: another thread's step is never lost
                    intercept = atomic_add_float(shared_b, 0, bstep * decay) + bstep * decay
                else:
                    intercept += bstep * decay
        if averaging:
            num = t - average + 1.0
            if update != 0.0 and not lazy and not adagrad:
                g = -avg_a * update / wscale
                for pos in range(start, end):
                    aw[column(indices, pos, start)] += g * data[pos]
            mu = 1.0 / num
            if num > 1:
                avg_b /= (1.0 - mu)
            avg_a += mu * avg_b * wscale
            avg_intercept += (intercept - avg_intercept) / num
        if use_l1:
            u += l1_ratio * eta * alpha
            for pos in range(start, end):
                j = column(indices, pos, start)
                z = w[j]
                nz = z
                if wscale * z > 0.0:
                    nz = max(0.0, z - (u + q[j]) / wscale)
                elif wscale * z < 0.0:
                    nz = min(0.0, z + (u - q[j]) / wscale)
                w[j] = nz
                q[j] += wscale * (nz - z)
                if lazy and averaging:  # scikit-learn's average takes the cut from its start
                    atomic_add_float(aw, j, alast[j] * (nz - z))
        t += 1.0
        count += 1.0
        done += 1
    if shared_intercept:
        intercept = shared_b[0]
    st[S_T], st[S_WSCALE], st[S_INTERCEPT] = t, wscale, intercept
    st[S_AVG_A], st[S_AVG_B], st[S_AVG_INTERCEPT], st[S_U] = avg_a, avg_b, avg_intercept, u
    st[S_SQ_NORM], st[S_L1_NORM] = sq_norm, l1_norm
    st[S_SUMLOSS], st[S_OBJECTIVE], st[S_COUNT] = sumloss, objective, count
    st[S_SUSPECT] = suspect
    return done


@numba.njit(nogil=True, cache=True)
def advance(cfg, st, steps):
    """Advance this thread's scalars through ``steps`` steps that other
    threads take (wscale, the L1 total u, the ASGD scalars, the clock):
    scikit-learn advances them once per step, whoever takes it."""
    penalty, alpha, l1_ratio = int(cfg[C_PENALTY]), cfg[C_ALPHA], cfg[C_L1_RATIO]
    lr, eta, eta0, power_t, t0 = int(cfg[C_LR]), cfg[C_ETA], cfg[C_ETA0], cfg[C_POWER_T], cfg[C_T0]
    average = cfg[C_AVERAGE]
    use_l1 = penalty == L1 or penalty == ELASTICNET
    t, wscale, intercept = st[S_T], st[S_WSCALE], st[S_INTERCEPT]
    avg_a, avg_b, avg_intercept, u = st[S_AVG_A], st[S_AVG_B], st[S_AVG_INTERCEPT], st[S_U]
    for _ in range(steps):
        eta = step_size(lr, eta, eta0, power_t, alpha, t0, t)
        if penalty >= L2:
            wscale *= max(0.0, 1.0 - (1.0 - l1_ratio) * eta * alpha)
        if 0 < average <= t:
            num = t - average + 1.0
            if num > 1:
                avg_b /= (1.0 - 1.0 / num)
            avg_a += avg_b * wscale / num
            avg_intercept += (intercept - avg_intercept) / num
        if use_l1:
            u += l1_ratio * eta * alpha
        t += 1.0
    st[S_T], st[S_WSCALE] = t, wscale
    st[S_AVG_A], st[S_AVG_B], st[S_AVG_INTERCEPT], st[S_U] = avg_a, avg_b, avg_intercept, u


@numba.njit(nogil=True, cache=True)
def judged_slower(elapsed, alone, cfg):
    """Whether threads that took ``elapsed`` ns for what one thread does in
    ``alone`` ns are slower. The bar falls from C_JUDGE_CLEARLY at the
    start to C_JUDGE_SLOWER at C_JUDGE_LONG_NS, plus C_JUDGE_SLACK_NS (the
    timer, an interrupt, a cold cache on the other core) until then: a
    short run has to be far slower to be judged, a long one only somewhat."""
    long = cfg[C_JUDGE_LONG_NS]
    if elapsed >= long:
        return elapsed > cfg[C_JUDGE_SLOWER] * alone
    bar = cfg[C_JUDGE_SLOWER] + (cfg[C_JUDGE_CLEARLY] - cfg[C_JUDGE_SLOWER]) * (1.0 - elapsed / long)
    return elapsed > bar * alone + cfg[C_JUDGE_SLACK_NS]


@numba.njit(nogil=True, cache=True)
def sgd_run(indptr, indices, data, width, y, sample_weight, order, lo, hi, w, aw, q,
            shared_b, cfg, st, counter, margins, alast, gsq):
    """One thread's share of the examples ``order[lo:hi]``; returns how many
    it ran. Alone (``cfg`` stride 1): all of them, in order. With others:
    it claims chunks of CHUNK positions from ``counter[K_NEXT]`` (an atomic
    add), so a thread the OS delays leaves its work to the others, and
    stops claiming once its ``wscale`` needs folding (the caller folds it
    and goes on from the counter). Before a chunk at position c it advances
    its scalars to step t(lo) + c - lo: every example runs at the step
    scikit-learn would give it.

    Judged (``cfg[C_JUDGE_NS]`` > 0, one thread's nanoseconds an example):
    while the threads' speed is being measured, they claim JUDGE_CHUNK
    positions at a time and count the examples done in ``counter[K_DONE]``;
    after each chunk a thread compares the time since the last of them
    arrived (``counter[K_BEGAN]``, stored by the thread whose arrival
    ``counter[K_ARRIVED]`` counts as the last) with what one thread would
    have taken for the examples done since. Until then the threads that
    are in run chunks unjudged: a thread the OS is still waking (a VM's
    idle vCPU) leaves the others working at full speed, and
    that time says nothing about the threads together. Judged slower
    (``judged_slower``): it raises ``counter[K_STOP]``, and every thread
    stops claiming (each finishes the chunk it holds, so the positions
    below ``counter[K_NEXT]`` are exactly those run). Not slower after
    C_JUDGE_LONG_NS: the judging ends and the chunks grow to CHUNK."""
    if int(cfg[C_STRIDE]) == 1:
        sgd_range(indptr, indices, data, width, y, sample_weight, order, lo, hi, w, aw, q,
                  shared_b, cfg, st, margins, counter, alast, gsq)
        return hi - lo
    judge = cfg[C_JUDGE_NS]
    chunk = CHUNK
    if judge > 0.0:
        chunk = JUDGE_CHUNK
        if fetch_add(counter, K_ARRIVED, 1) + 1 == int(cfg[C_STRIDE]):  # the last one in
            store_release(counter, K_BEGAN, monotonic_ns())
    t_lo = st[S_T]
    done = 0
    while st[S_WSCALE] >= WSCALE_THRESHOLD and load_acquire(counter, K_STOP) == 0:
        c = fetch_add(counter, K_NEXT, chunk)
        if c >= hi:
            advance(cfg, st, int(t_lo + (hi - lo) - st[S_T]))
            break
        advance(cfg, st, int(t_lo + (c - lo) - st[S_T]))
        end = min(c + chunk, hi)
        sgd_range(indptr, indices, data, width, y, sample_weight, order, c, end, w, aw, q,
                  shared_b, cfg, st, margins, counter, alast, gsq)
        done += end - c
        if judge > 0.0:
            began = load_acquire(counter, K_BEGAN)
            if began == 0:  # not everyone is in yet
                continue
            finished = fetch_add(counter, K_DONE, end - c) + (end - c)
            elapsed = monotonic_ns() - began
            if judged_slower(elapsed, judge * finished, cfg):
                store_release(counter, K_STOP, 1)
                break
            if elapsed >= cfg[C_JUDGE_LONG_NS]:
                judge, chunk = 0.0, CHUNK
    return done


@numba.njit(nogil=True, cache=True)
def shuffle(order, seed):
    """scikit-learn's epoch shuffle (``SequentialDataset.shuffle``), in
    place: Fisher-Yates front to back, position i swapped with
    i + r % (n - i), r from a 32-bit XorShift (Marsaglia 2003: shifts 13,
    17, 5; its state 0 replaced by 1) taken modulo 2^31. scikit-learn calls
    it every epoch with the same seed on the order the last epoch left, and
    so does ``plain_sgd``: a shuffled fit on one thread then visits the rows
    in scikit-learn's order, update for update."""
    x = uint64(seed) & uint64(0xFFFFFFFF)
    n = order.shape[0]
    for i in range(n - 1):
        if x == 0:
            x = uint64(1)
        x ^= (x << uint64(13)) & uint64(0xFFFFFFFF)
        x ^= x >> uint64(17)
        x ^= (x << uint64(5)) & uint64(0xFFFFFFFF)
        j = i + int64((x & uint64(0x7FFFFFFF)) % uint64(n - i))
        order[i], order[j] = order[j], order[i]

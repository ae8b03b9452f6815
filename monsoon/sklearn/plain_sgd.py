"""scikit-learn's ``_plain_sgd`` epoch loop, on the compiled ``kernel``, with
``n_jobs`` Hogwild! threads.

Same arguments and results as scikit-learn's (weights updated in place;
returns weights, intercept, average weights, average intercept and the
number of epochs), except that the data come as arrays (CSR
``indptr/indices/data`` or a dense C-ordered array, used as they are: no
copy, no conversion, no re-sorting) instead of a ``SequentialDataset``.

Per epoch: the training rows in scikit-learn's order (its shuffle of an
index array in place, ``kernel.shuffle``); one thread runs them in order,
or several claim chunks of them (``kernel``); then the log-loss is summed from the margins the kernel kept,
the weights are checked finite, and scikit-learn's stopping rule is
applied: the mean objective (or, with ``early_stopping``, the validation
score, on the weights with ``wscale`` folded in, where scikit-learn scores
the unscaled ones) must improve by ``tol`` once in ``n_iter_no_change``
epochs; 'adaptive' divides eta by 5 instead of stopping while eta > 1e-6.
Where the first step's L2 shrink exceeds ``MAX_SHARED_DECAY``, one thread
runs (the weights would need folding every few steps).

Threads pay only where their writes rarely meet: on power-law data every
thread writes the head of the distribution at nearly every example, and
each such write moves a cache line between cores. So ``n_jobs`` is a
ceiling, and a fit measures which way is faster on its own data
(``LayoutChooser``): once its epochs have taken ``PROBE_AFTER`` seconds it
runs half an epoch on one thread and the rest on the threads, judged as
they go (``run_epoch``, ``kernel.sgd_run``), runs later epochs the faster
way and measures again ``REPROBE`` epochs later (later still after a probe
the threads clearly lost); ``partial_fit``'s calls go on with one chooser.
A fit too short to probe runs as with ``n_jobs=1``. See bench/hogwild_sweep.py.

Where the epochs run on one thread, a helper sums the log-loss of the
epoch before (``log_loss_sum``) while the next runs: an epoch whose
verdict cannot stop the fit (fewer than ``n_iter_no_change - 1`` epochs
in a row without improvement) is judged an epoch late, from a second
margin buffer. The verdicts, their order and the fit are ``n_jobs=1``'s
to the bit. Not below ``SHARE_LOSS_ROWS`` rows, nor with ``verbose`` or
``early_stopping``.
"""
from __future__ import annotations

import functools
import math
import time

import numpy as np
import scipy.sparse as sp

from . import intrinsics
from . import kernel as K
from .helper_threads import Claimable, HelperThreads

MAX_SHARED_DECAY = 0.1
REPROBE = 16  # epochs between measurements of the thread layouts
PROBE_AFTER = 0.05  # seconds of epochs before the first (LayoutChooser)
# A probe's threads stop (``kernel.judged_slower``) once they are slower than
# one thread an example by a bar that falls from CLEARLY_SLOWER at their start
# to SLOWER at JUDGE_LONG seconds, give or take JUDGE_SLACK seconds (the clock,
# an interrupt, a cold cache on the other core) until then.
CLEARLY_SLOWER, SLOWER, JUDGE_SLACK, JUDGE_LONG = 1.5, 1.1, 50e-6, 2e-3
# Fewer training rows than this: the log-loss sums a helper would take over
# are worth less than its start and hand-overs, or, where the other core is
# busy (OpenBLAS's threads spin there after a large BLAS call), than what the
# helper takes from this thread's core (bench/hogwild_sweep.py).
SHARE_LOSS_ROWS = 30_000
SOFTPLUS_FLOOR = -100.0  # log_loss_sum

class LayoutChooser:
    """Whether the next epoch runs on one thread (``"one"``), on the threads
    (``"threads"``), or measures both (``"probe"``: its first half on one
    thread, the rest on the threads). Epoch 0 runs on one thread and warms
    the caches (first touches of the weights and the order). The first
    probe comes once the epochs have taken ``PROBE_AFTER`` seconds (at
    epoch 1 where one epoch takes that long), and ``REPROBE`` epochs after
    it another, because the load on the machine changes; after a probe
    whose threads were CLEARLY_SLOWER, twice as many epochs as the last
    wait (on a host where shared cache lines are dear, every probe). Other
    epochs run the faster layout of the last probe, per example. One thread
    wins ties within ``MARGIN``, because it is scikit-learn's exact loop.
    Why wait: a probe where the threads lose costs a share of a short fit,
    which gains little from threads anywhere."""

    MARGIN = 0.03

    def __init__(self, threads: bool):
        self.threads = threads
        self.best = "one"
        self.epochs = 0
        self.spent = 0.0  # seconds in epochs so far
        self.probed = None  # the epoch of the last probe
        self.interval = REPROBE  # epochs from it to the next

    def next(self) -> str:
        if not self.threads or self.epochs == 0:
            return "one"
        if self.probed is None:
            return "probe" if self.spent >= PROBE_AFTER else "one"
        return "probe" if self.epochs - self.probed >= self.interval else self.best

    def took(self, layout: str, per_example: dict[str, float], seconds: float) -> None:
        """``per_example``: seconds per example of each layout the epoch ran;
        ``seconds``: the epoch's."""
        self.epochs += 1
        self.spent += seconds
        if layout != "probe":
            return
        self.probed = self.epochs - 1
        one, threads = per_example["one"], per_example["threads"]
        self.best = "one" if one <= threads * (1 + self.MARGIN) else "threads"
        self.interval = 2 * self.interval if threads > CLEARLY_SLOWER * one else REPROBE


def run_epoch(layout: str, run_part, n: int, clock=time.perf_counter) -> dict:
    """Positions ``[0, n)`` of an epoch in ``layout`` (``LayoutChooser``),
    by ``run_part(layout, lo, hi, judge)``, which returns the position it
    reached; returns the seconds per example of each layout it ran.

    A probe runs its first half on one thread, then the rest on the threads,
    judged against that half's speed (``judge``: one thread's seconds an
    example): where they are slower, they stop within a few hundred
    microseconds (``kernel.sgd_run``) and one thread finishes the epoch.
    Where they win or tie they run the whole half."""
    def timed(part, lo, hi, judge=0.0):
        began = clock()
        reached = run_part(part, lo, hi, judge)
        return reached, clock() - began

    if layout != "probe":
        return {layout: timed(layout, 0, n)[1] / max(n, 1)}
    half = n // 2
    one = timed("one", 0, half)[1] / max(half, 1)
    reached, spent = timed("threads", half, n, one)
    if reached < n:
        run_part("one", reached, n, 0.0)
    return {"one": one, "threads": spent / max(reached - half, 1)}


def log_loss_sum(margins, block=1 << 16) -> float:
    """Sum over an epoch of the log-loss softplus(z) = log(1 + e^z), from
    the signed margins z the kernel kept (``kernel``'s module doc), with
    numpy's vectorised exp and log1p, cheaper than a log1p in the loop.
    Blocks of ``block`` examples bound the temporaries.

    softplus(z) = max(z, 0) + log1p(e^-|z|), with -|z| floored at
    ``SOFTPLUS_FLOOR``: numpy's exp leaves its fast path far below it (huge
    margins, as the weak regularisation of ``alpha=1e-6`` gives), and a
    term it changes is below e^-100 = 4e-44."""
    total = 0.0
    tail = np.empty(min(block, len(margins)))
    for lo in range(0, len(margins), block):
        z = margins[lo:lo + block]
        softplus = tail[:len(z)]
        np.abs(z, out=softplus)
        np.negative(softplus, out=softplus)
        np.maximum(softplus, SOFTPLUS_FLOOR, out=softplus)
        np.exp(softplus, out=softplus)
        np.log1p(softplus, out=softplus)
        softplus += np.maximum(z, 0.0)
        total += float(softplus.sum())
    return total


def _first_decay(learning_rate, alpha, l1_ratio, eta0, power_t, optimal_init, t):
    """The L2 shrink of the first step, (1 - l1_ratio) eta alpha: the largest."""
    if learning_rate == K.OPTIMAL:
        eta = 1.0 / (alpha * (optimal_init + t - 1))
    elif learning_rate == K.INVSCALING:
        eta = eta0 / t ** power_t
    else:
        eta = eta0
    return (1.0 - l1_ratio) * eta * alpha


def _arrays(X):
    if sp.issparse(X):
        return X.indptr, X.indices, X.data, 0
    return np.zeros(1, dtype=np.int64), None, X.reshape(-1), X.shape[1]  # C-ordered: a view


def plain_sgd(weights, intercept, average_weights, average_intercept, loss_code, loss_param,
              penalty_type, alpha, l1_ratio, X, y, sample_weight, intercept_decay,
              validation_mask, early_stopping, validation_score_cb, n_iter_no_change, max_iter,
              tol, fit_intercept, verbose, shuffle, seed, weight_pos, weight_neg, learning_rate,
              eta0, power_t, t=1.0, average=0, n_jobs=1, info=None, carried=None):
    """``carried``: what goes on from one call to the next (``partial_fit``
    hands the same dict to each): the 'adagrad' sums and the
    ``LayoutChooser``, its epochs and probes."""
    carried = {} if carried is None else carried
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
    use_q = penalty_type in (K.L1, K.ELASTICNET)
    Q = np.zeros(n_features if use_q else 1, dtype=weights.dtype)
    aw = average_weights if average_weights is not None else np.zeros(1, dtype=weights.dtype)
    # the shared intercept, and 'adagrad''s sum of its squared slopes
    shared_b = np.array([intercept, 0.0], dtype=np.float64)
    gsq = np.zeros(1)
    if learning_rate == K.ADAGRAD:  # per-feature sums of squared slopes, kept across calls
        if carried.get("gsq") is None or len(carried["gsq"]) != n_features:
            carried["gsq"], carried["gb"] = np.zeros(n_features), 0.0
        gsq, shared_b[1] = carried["gsq"], carried["gb"]

    keep_loss = verbose or not early_stopping  # scikit-learn's: the stopping rule or the log
    loss_mode = (K.LOSS_LATER if loss_code == K.LOG else K.LOSS_NOW) if keep_loss else 0
    cfg = np.zeros(K.N_CFG)
    cfg[[K.C_LOSS, K.C_LOSS_PARAM, K.C_PENALTY, K.C_ALPHA, K.C_L1_RATIO, K.C_LR, K.C_ETA,
         K.C_ETA0, K.C_POWER_T, K.C_T0, K.C_FIT_INTERCEPT, K.C_INTERCEPT_DECAY, K.C_AVERAGE,
         K.C_WEIGHT_POS, K.C_WEIGHT_NEG, K.C_STRIDE, K.C_COMPUTE_LOSS]] = [
        loss_code, loss_param, penalty_type, alpha, l1_ratio, learning_rate, eta0, eta0,
        power_t, optimal_init, fit_intercept, intercept_decay, average, weight_pos, weight_neg,
        jobs, loss_mode]
    state = np.zeros(K.N_STATE)
    state[[K.S_T, K.S_WSCALE, K.S_INTERCEPT, K.S_AVG_B, K.S_AVG_INTERCEPT]] = \
        [t, 1.0, intercept, 1.0, average_intercept]
    # not ``weights @ weights``: OpenBLAS splits a long dot over its threads,
    # which then spin on the other cores for a while and slow the fit's own
    state[K.S_SQ_NORM] = float(np.einsum("i,i->", weights, weights))
    state[K.S_SUSPECT] = not math.isfinite(state[K.S_SQ_NORM])  # the first check scans
    if l1_ratio > 0 or state[K.S_SUSPECT]:  # else it counts l1_ratio * |w|_1 = 0 exactly
        state[K.S_L1_NORM] = float(np.abs(weights).sum())
    counter = np.zeros(K.N_COUNTER, dtype=np.int64)  # claims and the judge (kernel's slots)
    cfg[[K.C_JUDGE_SLACK_NS, K.C_JUDGE_LONG_NS, K.C_JUDGE_CLEARLY, K.C_JUDGE_SLOWER]] = [
        JUDGE_SLACK * 1e9, JUDGE_LONG * 1e9, CLEARLY_SLOWER, SLOWER]
    judged = intrinsics.CLOCK_MONOTONIC is not None  # the kernel's clock exists
    later = loss_mode == K.LOSS_LATER
    margins = np.empty(train_count if later else 1)  # the epoch's signed p, by position

    # the threads' average, kept as S and time stamps a (``kernel``'s module doc)
    alast = np.zeros(n_features if average_weights is not None and jobs > 1 else 1)

    def run(st, order, lo, hi):
        return K.sgd_run(indptr, indices, data, cols, y, sample_weight, order, lo, hi, weights,
                         aw, Q, shared_b, cfg, st, counter, margins, alast, gsq)

    def reset_wscale(st):
        if average_weights is not None:
            np.add(average_weights, st[K.S_AVG_A] * weights, out=average_weights)
            np.divide(average_weights, st[K.S_AVG_B], out=average_weights)
            st[K.S_AVG_A], st[K.S_AVG_B] = 0.0, 1.0
        np.multiply(weights, st[K.S_WSCALE], out=weights)
        st[K.S_WSCALE] = 1.0

    # scikit-learn's order: every row's index shuffled in place each epoch
    # (kernel.shuffle, the same seed every epoch), its training rows in that order
    index = np.arange(len(validation_mask), dtype=np.int64)
    held_out = np.asarray(validation_mask, dtype=bool)
    order = index if train_count == len(index) else train
    best_objective, best_score, no_improvement = math.inf, -math.inf, 0
    t_start = time.time()
    pool = None  # helper threads: started by the first probe or shared log-loss, if any
    chooser = carried.setdefault("chooser", LayoutChooser(threads=jobs > 1))
    chooser.threads = jobs > 1  # this call's (its rows, n_jobs and first step)

    def run_part(layout, lo, hi, judge=0.0):
        """Positions ``order[lo:hi]`` of the epoch, on one thread or on all
        (judged against one thread's ``judge`` seconds an example, if any);
        returns the position reached."""
        if layout == "one":
            cfg[K.C_STRIDE] = 1
            while lo < hi:
                lo += run(state, order, lo, hi)
                if lo < hi:
                    reset_wscale(state)
            return hi
        cfg[K.C_STRIDE] = jobs
        cfg[K.C_JUDGE_NS] = judge * 1e9 if judged else 0.0
        counter[[K.K_STOP, K.K_BEGAN, K.K_DONE, K.K_ARRIVED]] = 0
        shared_b[0] = state[K.S_INTERCEPT]
        try:
            return _hogwild_epoch(run, reset_wscale, cfg, state, order, lo, hi, jobs, pool,
                                  shared_b, counter, weights, average_weights, alast)
        finally:
            cfg[K.C_JUDGE_NS] = 0.0

    def check_finite(epoch):
        if not math.isfinite(state[K.S_INTERCEPT]) or (
                state[K.S_SUSPECT] and not np.isfinite(weights).all()):  # kernel's doc
            raise ValueError("Floating-point under-/overflow occurred at epoch #%d. Scaling "
                             "input data with StandardScaler or MinMaxScaler might help."
                             % (epoch + 1))
        state[K.S_SUSPECT] = 0.0  # scanned and finite, or nothing suspect

    def stops_after(epoch, sumloss, objective_sum):
        """scikit-learn's stopping rule after ``epoch``; True: stop."""
        nonlocal best_objective, best_score, no_improvement
        mean_loss = sumloss / max(train_count, 1)
        objective = objective_sum / max(train_count, 1)
        if early_stopping:
            score = validation_score_cb(weights, state[K.S_INTERCEPT])
            if verbose > 0:
                _report(weights, state, mean_loss, objective, t_start, score)
            no_improvement = no_improvement + 1 if (tol > -math.inf and
                                                    score < best_score + tol) else 0
            best_score = max(best_score, score)
        else:
            if verbose > 0:
                _report(weights, state, mean_loss, objective, t_start)
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
                return True
        return False

    # ``stops_after`` stops the fit only once ``no_improvement`` reaches
    # ``n_iter_no_change``; an epoch whose verdict cannot get there is
    # judged an epoch late, its log-loss summed by a helper while the next
    # epoch runs (module doc): the same verdicts, in the same order.
    share_loss = (jobs > 1 and later and not verbose and not early_stopping
                  and train_count >= SHARE_LOSS_ROWS)
    spare_margins = np.empty_like(margins) if share_loss else None
    pending = None  # (epoch, loss sum, objective sum) of the margins in spare_margins
    epoch = 0
    try:
        for epoch in range(max_iter):
            state[K.S_SUMLOSS] = state[K.S_OBJECTIVE] = 0.0
            if verbose > 0:
                print("-- Epoch %d" % (epoch + 1))
            if shuffle:
                K.shuffle(index, seed)
                order = index if order is index else index[~held_out[index]]
            layout = chooser.next()
            if pool is None and (layout != "one" or pending is not None):  # not awaited:
                pool = HelperThreads(jobs - 1)  # they wake while this thread runs
            summed = None  # the pending epoch's log-loss: a helper's, or this thread's
            if pending is not None:
                summed = Claimable(functools.partial(log_loss_sum, spare_margins))
                if layout == "one":  # the threads need every core: they sum it after
                    pool.offer(summed)
            began = time.perf_counter()
            per_example = run_epoch(layout, run_part, train_count)
            chooser.took(layout, per_example, time.perf_counter() - began)
            if pending is not None:
                loss = summed.result()
                stops_after(pending[0], pending[1] + loss, pending[2] + loss)
                pending = None
            if early_stopping:  # the score needs the true weights
                reset_wscale(state)
            check_finite(epoch)
            if share_loss and no_improvement + 1 < n_iter_no_change:
                pending = (epoch, state[K.S_SUMLOSS], state[K.S_OBJECTIVE])
                margins, spare_margins = spare_margins, margins
                continue
            if later:
                loss = log_loss_sum(margins)
                state[K.S_SUMLOSS] += loss
                state[K.S_OBJECTIVE] += loss
            if stops_after(epoch, state[K.S_SUMLOSS], state[K.S_OBJECTIVE]):
                break
    finally:
        if pool is not None:
            pool.close()  # they exit once idle (a sum taken back is a no-op there)
    reset_wscale(state)
    if learning_rate == K.ADAGRAD:
        carried["gb"] = float(shared_b[1])
    if info is not None:  # what the fit chose (``LayoutChooser``)
        info["layout"] = chooser.best
    return (weights, state[K.S_INTERCEPT], average_weights, state[K.S_AVG_INTERCEPT],
            epoch + 1)


def _hogwild_epoch(run, reset_wscale, cfg, state, order, lo, n, jobs, pool, shared_b, counter,
                   weights, average_weights, alast):
    """Positions ``order[lo:n]`` of an epoch on ``jobs`` threads claiming
    chunks from ``counter``; returns the position reached: ``n``, or less
    where the judge stopped the threads (``kernel.sgd_run``). A round ends
    early otherwise only when wscale needs folding.

    The average weights, kept by one thread as scikit-learn's ``aw`` (the
    average is (aw + a v) / b), are kept by the threads as S = aw + a_j v
    with time stamps a_j = a: a round starts with that conversion and ends
    with its inverse, aw = S - a_j v (``kernel``'s module doc)."""
    while lo < n:
        if average_weights is not None:
            alast[:] = state[K.S_AVG_A]
            average_weights += state[K.S_AVG_A] * weights
        counter[K.K_NEXT] = lo
        states = []
        for _ in range(jobs):
            st = state.copy()
            st[K.S_SUMLOSS] = st[K.S_OBJECTIVE] = st[K.S_COUNT] = st[K.S_SUSPECT] = 0.0
            states.append(st)
        pool.start([functools.partial(run, states[k], order, lo, n) for k in range(1, jobs)])
        try:
            run(states[0], order, lo, n)
        finally:
            pool.wait()
        if average_weights is not None:
            average_weights -= alast * weights
        reached = min(int(counter[K.K_NEXT]), n)
        ahead = max(states, key=lambda st: st[K.S_T])  # the scalars: the furthest clock's
        for slot in (K.S_WSCALE, K.S_AVG_A, K.S_AVG_B, K.S_U, K.S_AVG_INTERCEPT, K.S_SQ_NORM,
                     K.S_L1_NORM):
            state[slot] = ahead[slot]
        for slot in (K.S_SUMLOSS, K.S_OBJECTIVE, K.S_COUNT, K.S_SUSPECT):
            state[slot] += sum(st[slot] for st in states)
        target = state[K.S_T] + (reached - lo)
        state[K.S_T] = ahead[K.S_T]
        state[K.S_INTERCEPT] = shared_b[0]
        K.advance(cfg, state, int(target - state[K.S_T]))
        if counter[K.K_STOP]:
            return reached  # judged slower: one thread goes on (and folds wscale if due)
        if reached < n:
            reset_wscale(state)
        lo = reached
    return n


def _report(weights, state, mean_loss, objective, t_start, score=None):
    line = ("Norm: %.2f, NNZs: %d, Bias: %.6f, T: %d, Avg. loss: %f, Objective: %f"
            % (math.sqrt(state[K.S_SQ_NORM]), np.count_nonzero(weights), state[K.S_INTERCEPT],
               state[K.S_COUNT], mean_loss, objective))
    print(line + ("" if score is None else ", Validation score: %f" % score))
    print("Total training time: %.2f seconds." % (time.time() - t_start))

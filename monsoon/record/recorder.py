"""The record of a run: loss curve rows, progress bar, divergence watch.

The curve costs the run nothing it could notice: while the run goes,
``record`` (whenever ``due`` says so) only copies the parameters into a
snapshot and checks them finite. ``finish`` evaluates every snapshot after
the run, with the same full-data objective for every strategy
(``problem.loss``, or ``problem.evaluate`` where a problem reports more,
such as accuracy; with the buffers the engine took with it, if any), so
evaluation never competes with the workers for the cores and serial and
parallel runs are timed the same way.

A row is due every 1/``evals`` of the example budget (and at least every
``min_interval_s``, or 1/``evals`` of the elapsed time). Snapshots are
bounded: at most ``max_bytes`` in all; when the pool is full every other
snapshot is dropped and the interval doubles (their buffers take the next
copies). Where the clock is real (``cost_aware``), snapshots are also at
least ``COST_SPACING`` times their own measured cost apart (the recording
thread's CPU time, at least what their size says), so a large model's
copies take at most ~2% of the run however short it is.

Evaluating after the run costs the user wall time instead. Where the clock
is real, it gets at most ``eval_share`` of the run's time (and at least
``EVAL_MIN_S``). Snapshots are evaluated coarse to fine (the ends, the
middle, the quarters, ...: ``refinement_levels``; a level the time left
cannot finish is thinned evenly), the rest dropped, so the curve kept is
evenly spaced; the final row (``final_loss``) always is evaluated. A level
is one call where the problem has ``evaluate_many``. The monitor also hands
``live`` its workers' figures when ``live_due`` (``live.py``).

Non-finite parameters, or more dropped updates than applied ones (over
100), stop the run with advice; so do more dropped local steps than applied
ones (local SGD, EASGD: ``local``, in their own unit). A non-finite loss
after it marks it diverged; one above its start or a constant's is warned
of (``worse_than_start``). ``target_loss`` stops a run where an engine asks
(``check_target``, ``target_met``; ``reached_target`` tells it from a
divergence), returning the parameters found there (``target_params``).

``tol`` stops a run once its best evaluated loss beats the best of an epoch
earlier by less than ``tol`` of itself (MLlib's tol; ``converged``), from
snapshots only: a line search's rejected trial (``target_met``) is no stall.
"""
from __future__ import annotations

import math
import sys
import time
from functools import partial

import numpy as np

from .. import arrays

COLUMNS = ("time_s", "updates", "examples", "epoch", "loss")
COST_SPACING = 50
EVAL_MIN_S = 5.0  # the curve's evaluation may always take this long
COPY_BYTES_PER_S = 2e9  # a snapshot reads the parameters twice (copy, finite check)
DIVERGED = "diverged: the loss became {loss} after {updates} updates; lower the learning rate (--lr)"
DROPPED = ("diverged: {dropped} updates had non-finite gradients and were dropped (only "
           "{updates} applied); lower the learning rate (--lr)")
DROPPED_LOCAL = ("diverged: {dropped} local steps had non-finite gradients and were dropped "
                 "(only {updates} applied); lower the learning rate (--lr)")
DROPS_TOLERATED = 100  # a run stops once its drops outnumber both this and what it applied
TARGET_REACHED = "reached the target loss {target:g} (loss {loss:.6g} after {updates} updates)"
CONVERGED = ("converged: the loss fell by less than {tol:g} of itself over the last epoch "
             "({before:.6g} to {loss:.6g} after {updates} updates)")
TARGET_SPACING = 10


def _mostly_dropped(applied: int, dropped: int) -> bool:
    """Whether drops outnumber both ``DROPS_TOLERATED`` and what was applied
    (two counts in one unit): the run is diverging."""
    return dropped > DROPS_TOLERATED and dropped > applied


def reached_target(reason) -> bool:
    """Whether a run's stop reason is its target, not a divergence."""
    return isinstance(reason, str) and reason.startswith("reached the target loss")


def converged(reason) -> bool:
    """Whether a run's stop reason is ``tol`` (``CONVERGED``), not a divergence."""
    return isinstance(reason, str) and reason.startswith("converged:")


NOT_CONVERGED = ("did not converge: the loss ended at {final:.6g}, above {what} ({ref:.6g})"
                 "{why}; lower the learning rate (--lr){more}")
STEP_TOO_SMALL = ("did not converge: the loss ended at {final:.6g}, above {what} ({ref:.6g}), "
                  "and {how}: {advice}")
STILL_FALLING = "train longer (--epochs) or raise the learning rate (--lr)"
BARELY_MOVED = "raise the learning rate (--lr) or train longer (--epochs)"
NOISE = 1e-3  # a change within this share of the loss is taken for evaluation noise


NOT_FINITE_AT_START = ("diverged: the loss is {loss} at the starting weights, before any "
                       "update; check the model, the loss and the targets (a mean over no "
                       "target, every one equal to the loss's ignore_index, is nan)")


def not_finite_at_start(rows: list[dict]) -> str | None:
    """A divergence's message where the curve's first row (the loss at the
    starting parameters) is already not finite: no learning rate helps."""
    start = rows[0]["loss"] if rows and rows[0].get("updates") == 0 else None
    if start is None or math.isfinite(start):
        return None
    return NOT_FINITE_AT_START.format(loss=start)


def worse_than_start(rows: list[dict], final: float, constant: float | None) -> str | None:
    """The warning for a run whose final loss is above its first row's (the
    loss at its starting parameters) or above the best constant predictor's
    (``problem.constant_loss()``, where the problem has one), with the
    advice its curve supports (``read_step``): lower the learning rate where
    the loss rose or bounced, raise it or train longer where it only fell
    or barely moved; None when neither, or when the loss is not finite
    (that run is marked diverged instead). The API puts it in the summary
    and on stderr, on every engine."""
    if not math.isfinite(final):
        return None
    start = rows[0]["loss"] if rows and rows[0].get("updates") == 0 else None
    if start is not None and math.isfinite(start) and final > start:
        what, ref = "its starting loss", start
    elif constant is not None and math.isfinite(constant) and final > constant:
        what, ref = "a constant predictor's", constant + 0.0  # never "-0"
    else:
        return None
    step = read_step(rows, final)
    if step is not None and step[0] == "small":
        return STEP_TOO_SMALL.format(final=final, what=what, ref=ref, how=step[1],
                                     advice=step[2])
    # no curve to read: below a constant predictor's bar the budget may be too short
    more = ", or train longer" if step is None and what != "its starting loss" else ""
    return NOT_CONVERGED.format(final=final, what=what, ref=ref,
                                why=step[1] if step else "", more=more)


def read_step(rows: list[dict], final: float) -> tuple | None:
    """What the curve of a run that ended too high says of its step, from
    its finite losses (changes within ``NOISE`` of the loss are noise):
    ("large", why) where it rose above its first loss, or ended above its
    lowest: lower the learning rate; ("small", how, advice) where it never
    rose: it was still falling at its end (train longer, or raise the
    rate), or it barely moved (raise the rate); None with fewer than two
    losses, nothing to read."""
    losses = [float(r["loss"]) for r in rows if r.get("loss") is not None]
    losses = [v for v in losses if math.isfinite(v)]
    if len(losses) < 2:
        return None
    first, low, top = losses[0], min(losses), max(losses)
    noise = NOISE * max(abs(low), abs(final))
    if top > first + noise:
        return "large", f", having risen to {top:.6g} on the way" if top > final + noise else ""
    if final > low + noise:
        return "large", f", having been down to {low:.6g} before"
    if top - low <= noise:
        return "small", f"barely moved from {first:.6g}", BARELY_MOVED
    return "small", "was still falling", STILL_FALLING


# written where the problem reports them (``problem.evaluate``): torch
# problems with a classification loss or a validation set
OPTIONAL_COLUMNS = ("accuracy", "val_loss", "val_accuracy", "bytes_sent")


def evaluate(problem, w) -> dict:
    """Every reported figure at ``w``: ``problem.evaluate`` where the problem
    has one (loss, accuracy, val_loss, val_accuracy; torch problems compute
    them in eval mode under no_grad), else ``{"loss": problem.loss(w)}``
    (``Problem.evaluate``)."""
    return problem.evaluate(w)


def evaluate_all(problem, ws: list) -> list[dict]:
    """``evaluate`` at each of ``ws``: in one pass over the data where the
    problem offers ``evaluate_many`` (data in Spark: one job, not one per
    point), else one point at a time."""
    if problem.evaluate_many is not None:
        return list(problem.evaluate_many(ws))
    return [evaluate(problem, w) for w in ws]


def refinement_levels(n: int) -> list[list[int]]:
    """0..n-1, coarse to fine: the ends, then the middle, then the quarters,
    and so on, each level a list; together they hold every index once."""
    levels, seen = [], set()

    def level(candidates):
        new = [i for i in dict.fromkeys(candidates) if 0 <= i < n and i not in seen]
        seen.update(new)
        if new:
            levels.append(new)

    level([0, n - 1])
    parts = 2
    while len(seen) < n and parts <= 2 * n:
        level(round(k * (n - 1) / parts) for k in range(1, parts, 2))
        parts *= 2
    level(range(n))  # any left by rounding
    return levels


class Recorder:
    def __init__(self, problem, total_examples: int | None, target_loss: float | None = None,
                 evals: int = 100, min_interval_s: float = 0.5, progress: bool | None = None,
                 label: str = "", cost_aware: bool = True, max_bytes: int = 256 << 20,
                 eval_share: float = 0.5, tol: float | None = None):
        self.problem = problem
        self.n_examples = problem.n_examples
        self.total_examples = total_examples
        self.target_loss = target_loss
        self.tol = tol
        self._bests: list[tuple[int, float]] = []  # (examples, best loss so far), for tol
        self.evals = evals
        self.min_interval_s = min_interval_s
        self.max_bytes = max_bytes
        self.rows: list[dict] = []
        self.snapshots: list[tuple[float, int, int, np.ndarray]] = []
        self.time_to_target_s = None
        self.stop_reason = None
        self._stop_format = None  # the divergence's message, to restate with the final counts
        self._stop_local = False  # whether it counts local steps (``local``), not updates
        self._stride = 1.0  # grows (doubles) when the snapshot pool fills
        self._next = 0.0
        self._next_examples = 0
        self._bar = None
        self._progress = progress
        self._label = label
        self.cost_aware = cost_aware  # real time: snapshots keep clear of their own cost
        self.eval_share = eval_share  # of the run's time, for evaluating the curve
        self.rows_dropped = 0  # snapshots left unevaluated when that time ran out
        self.hurried = False  # a stop after the run: the curve's ends only (``hurry``)
        self._earliest = 0.0  # no snapshot before this (cost_aware)
        self._spares: list[np.ndarray] = []  # buffers of thinned snapshots, for reuse
        self.live_writer = None  # live series (``live.py``), where the run has any
        self.check_target = False  # evaluate while the run goes, to stop at target_loss or tol
        self.target_reason = None  # the reason to stop early: TARGET_REACHED or CONVERGED
        self.target_params = None  # the parameters a check found at the target
        self._target_next = 0.0
        self._evaluated: dict[tuple, dict] = {}  # (time, updates, examples) -> metrics
        # A full-batch step's loss at the parameters of a snapshot, found by the
        # snapshot's (updates, dropped): a dropped step may move the parameters
        # (lbfgs backs off) without an update.
        self._known: dict[tuple[int, int], float] = {}
        self._known_next: tuple[tuple[int, int], float] | None = None  # its snapshot is next
        self._snapshot_keys: dict[tuple, tuple[int, int]] = {}  # snapshot[:3] -> (updates, dropped)
        self._buffers: dict[tuple, dict] = {}  # snapshot[:3] -> the buffers it is evaluated with
        self._left_out: dict[tuple, int] = {}  # snapshot[:3] -> rows left out by then (spark)

    # -- during the run ----------------------------------------------------
    def start(self, params, buffers: dict | None = None) -> None:
        self._open_bar()
        self._next = 0.0
        if not self.rows:  # a resumed run's curve already starts
            self.record(0.0, 0, 0, params, buffers=buffers)

    def resume(self, rows: list[dict]) -> None:
        """Carry on a checkpointed run's curve: its rows come first, each
        with the rows left out by then that its epoch counts."""
        for row in rows:
            left_out = max(0, round(row.get("epoch", 0) * self.n_examples) - row["examples"])
            self.add_row(row["time_s"], row["updates"], row["examples"],
                         {k: v for k, v in row.items() if k not in ("time_s", "updates",
                                                                     "examples", "epoch")},
                         left_out)

    def due(self, now: float, examples: int) -> bool:
        return (self.evals > 0 and (now >= self._next or examples >= self._next_examples)
                and now >= self._earliest)

    def seconds_to_due(self, now: float, examples: int) -> float:
        """How long until the next row is due, at the run's pace so far and
        after the last snapshot's cost spacing: an engine's monitor may sleep
        that long without missing a row. Never longer than the run has
        lasted: a young run's pace, from its first batch or two (and the
        workers' start), is no pace, and a sleep on it missed most of a short
        run's curve (its first rows came at half a second, 60% of its budget
        done). The monitor's sleeps then at most double while it learns the
        pace, a few wake-ups more in all."""
        live = (max(self.live_writer.next - now, 0.0) if self.live_writer is not None
                else math.inf)
        if self.evals <= 0:
            return live
        wait = min(self._next - now, now)
        if self.total_examples and examples > 0 and now > 0:
            wait = min(wait, (self._next_examples - examples) * now / examples)
        # not before the last copy's cost allows either: a row held back by
        # ``_earliest`` would otherwise have the monitor poll every millisecond
        return min(max(wait, self._earliest - now, 0.0), live)

    # -- live series (``live.py``): the engine's monitor, off the workers' path
    @property
    def live_workers(self) -> int:
        """How many workers (the first) get per-worker series."""
        from .live import PER_WORKER_MAX

        return PER_WORKER_MAX

    def live_due(self, now: float, final: bool = False) -> bool:
        """Whether a row of live series is due (cheap: one comparison);
        ``final``: whether the run's last row is wanted (any live series)."""
        return self.live_writer is not None and (final or now >= self.live_writer.next)

    def live(self, now: float, examples: int, updates: int, workers: dict | None = None,
             staleness=None, dropped: int | None = None, bytes_sent: int | None = None):
        """Hand the live writer the engine's cumulative figures (see
        ``LiveWriter.write``); the progress bar shows the row."""
        if self.live_writer is None:
            return None
        row = self.live_writer.write(now, int(examples), int(updates), workers, staleness,
                                     dropped, bytes_sent)
        if self._bar is not None:
            last, post = self.live_writer.last, {}
            if last.get("loss") is not None:
                post["loss"] = f"{last['loss']:.4g}"
            if last.get("examples_per_s") is not None:
                post["ex/s"] = f"{last['examples_per_s']:.3g}"
            if last.get("staleness_max") is not None:
                post["stale"] = int(last["staleness_max"])
            self._bar.n = min(int(examples), self._bar.total or int(examples))
            self._bar.set_postfix(post, refresh=True)
        return row

    def record(self, now: float, updates: int, examples: int, params, dropped: int = 0,
               local: tuple[int, int] | None = None, buffers: dict | None = None,
               left_out: int = 0):
        """Snapshot ``params`` (copied: the caller may go on writing them).
        ``local``: the workers' local steps so far, (applied, dropped), where
        the run takes any (None: none). ``buffers``: the model's buffers to
        evaluate the snapshot with (``Problem.state()``'s form; None: those
        the problem holds then), where the workers train copies of them.
        ``left_out``: the rows the steps so far drew and left out (spark's
        ``examples_left_out``), which the row's epoch counts."""
        began = time.thread_time()
        if self.evals > 0 or not self.snapshots:
            self._snapshot_keys[(now, updates, examples)] = (updates, dropped)
            if buffers is not None:
                self._buffers[(now, updates, examples)] = buffers
            if left_out:
                self._left_out[(now, updates, examples)] = left_out
            self._keep(now, updates, examples, self._copy(params))
        evals = max(self.evals, 1)
        self._next = now + self._stride * max(self.min_interval_s, now / evals)
        if self.total_examples:
            step = self._stride * self.total_examples / evals
            self._next_examples = (int(examples / step) + 1) * step
        if arrays.is_tensor(params):
            finite = arrays.finite(params)
        else:  # a sum of Inf and -Inf is NaN, silently: the run reports it
            with np.errstate(over="ignore", invalid="ignore"):
                finite = math.isfinite(float(np.sum(params, dtype=np.float64)))
        if not finite:
            self._stop_format, self._stop_local = partial(DIVERGED.format, loss="nan"), False
        elif _mostly_dropped(updates, dropped):
            self._stop_format, self._stop_local = DROPPED.format, False
        elif local is not None and _mostly_dropped(*local):
            self._stop_format, self._stop_local = DROPPED_LOCAL.format, True
        if self._stop_format is not None and self.stop_reason is None:
            self.stop_reason = self._stop_message(updates, dropped, local)
        if (self.check_target and (self.target_loss is not None or self.tol is not None)
                and updates > 0 and self.stop_reason is None and self.target_reason is None
                and now >= self._target_next):
            self._check_target(now, updates, examples, params)
        if self.cost_aware:  # the copy's cost: this thread's CPU time (a wall clock
            # would count a monitor thread's waits for the GIL), and never less
            # than its size says (a coarse thread clock)
            spent = time.thread_time() - began
            self._earliest = now + COST_SPACING * max(spent, 2 * arrays.nbytes(params) / COPY_BYTES_PER_S)
        if self._bar is not None:
            self._bar.n = min(examples, self._bar.total or examples)
            self._bar.refresh()
        return self.stop_reason or self.target_reason

    def restate(self, reason, updates: int, dropped: int,
                local: tuple[int, int] | None = None):
        """``reason`` with the run's final counts where it is this recorder's
        divergence: the row that stopped the run is older than the workers'
        last counts, and the message should say what summary.json's
        ``updates`` and ``dropped_updates`` say (``local_updates`` and
        ``dropped_local_updates``: ``local``, for a divergence of the local
        steps). Any other reason is returned as it is."""
        if self._stop_format is None or reason != self.stop_reason:
            return reason
        return self._stop_message(updates, dropped, local) or reason

    def _stop_message(self, updates: int, dropped: int, local) -> str | None:
        """The divergence's message with these counts (None: a divergence
        of the local steps, and no ``local`` counts given)."""
        if self._stop_local:
            if local is None:
                return None
            updates, dropped = local
        return self._stop_format(dropped=dropped, updates=updates)

    def _check_target(self, now, updates, examples, params) -> None:
        """``check_target`` (set for a run given ``target_loss`` or ``tol``,
        and by spark between its jobs): the snapshot's loss, evaluated now, at most every
        ``TARGET_SPACING`` times this evaluation's own time after the last
        (so it takes at most ~10% of the run); it is a row of the curve,
        not evaluated again after the run."""
        began = time.perf_counter()
        metrics = self.evaluate(params)
        self._evaluated[(now, updates, examples)] = metrics
        self._target_next = now + TARGET_SPACING * (time.perf_counter() - began)
        if self.target_met(float(metrics["loss"]), updates):
            # the model the run returns: pushes may land between this check and the stop
            self.target_params = arrays.copy(params)
        else:
            self._check_converged(float(metrics["loss"]), updates, examples)

    def _check_converged(self, loss: float, updates: int, examples: int) -> None:
        """``tol``: the best loss so far against the best of one epoch (of
        examples) earlier; ``CONVERGED`` the reason to stop once it fell by
        less than ``tol`` of itself."""
        if self.tol is None or not math.isfinite(loss):
            return
        best = min(loss, self._bests[-1][1]) if self._bests else loss
        self._bests.append((examples, best))
        earlier = [b for e, b in self._bests if e <= examples - self.n_examples]
        if earlier and earlier[-1] - best < self.tol * abs(best):
            self.target_reason = CONVERGED.format(tol=self.tol, before=earlier[-1], loss=best,
                                                  updates=updates)

    def target_met(self, loss: float, updates: int, dropped: int = 0) -> bool:
        """Note the full-data loss at the current parameters (an engine that
        knows it for free: a full-batch step's); True, and ``TARGET_REACHED``
        the reason to stop that ``record`` returns, once it is at the target.
        The curve takes the loss as the row of a snapshot at ``updates``
        (``_fill_known``) instead of evaluating it again."""
        key = (updates, dropped)
        if math.isfinite(loss):  # a snapshot at these parameters: taken, or next
            if self.snapshots and self._snapshot_keys.get(self.snapshots[-1][:3]) == key:
                self._known[key] = float(loss)
            else:
                self._known_next = (key, float(loss))
        if (self.target_loss is not None and math.isfinite(loss)
                and loss <= self.target_loss and self.target_reason is None):
            self.target_reason = TARGET_REACHED.format(target=self.target_loss, loss=loss,
                                                       updates=updates)
        return self.target_reason is not None

    def _copy(self, params) -> np.ndarray:
        """``params`` copied into a buffer a thinned snapshot left (memory
        already touched, cheaper to write than fresh memory where the kernel
        faults every new page in), or into a new one."""
        if arrays.is_tensor(params):  # a device's parameters: one copy to the host
            return np.array(arrays.to_host(params), copy=True)
        params = np.asarray(params)
        for k, spare in enumerate(self._spares):
            if spare.shape == params.shape and spare.dtype == params.dtype:
                del self._spares[k]
                np.copyto(spare, params)
                return spare
        return np.array(params, copy=True)

    def _keep(self, now, updates, examples, params) -> None:
        self.snapshots.append((now, updates, examples, params))
        key = self._snapshot_keys.setdefault((now, updates, examples), (updates, 0))
        if self._known_next is not None and self._known_next[0] == key:
            self._known[key] = self._known_next[1]
        self._known_next = None
        if len(self.snapshots) > 2 and sum(s[3].nbytes for s in self.snapshots) > self.max_bytes:
            first, *rest = self.snapshots
            self.snapshots = [first] + rest[1::2]
            self._spares = [s[3] for s in rest[0::2]]  # the next snapshots' buffers
            for s in rest[0::2]:
                self._buffers.pop(s[:3], None)
                self._left_out.pop(s[:3], None)
            self._stride *= 2

    # -- after the run -----------------------------------------------------
    def settled_rows(self, final_updates: int | None = None) -> list[dict]:
        """The rows so far, with every snapshot evaluated: what a checkpoint
        keeps (checkpoints are rare, so this evaluation is too). A last
        snapshot taken at ``final_updates`` is dropped: the final row is that point."""
        if (final_updates is not None and len(self.snapshots) > 1
                and self.snapshots[-1][1] == final_updates):
            dropped = self.snapshots.pop()[:3]
            self._buffers.pop(dropped, None)
            self._left_out.pop(dropped, None)
        snaps, self.snapshots = self.snapshots, []
        if not snaps:
            return self.rows
        budget = (max(EVAL_MIN_S, self.eval_share * snaps[-1][0]) if self.cost_aware
                  else math.inf)  # virtual time says nothing about evaluation's cost
        began, done, calls, points = time.perf_counter(), {}, 0, 0
        for i, snap in enumerate(snaps):  # evaluated while the run went (check_target)
            if snap[:3] in self._evaluated:
                done[i] = self._evaluated[snap[:3]]
        batched = self.problem.evaluate_many is not None  # a level costs about one call
        for level in refinement_levels(len(snaps)):
            level = [i for i in level if i not in done]
            if not level:
                continue
            last = False
            if self.hurried and {0, len(snaps) - 1} <= done.keys():
                break
            if {0, len(snaps) - 1} <= done.keys() and budget < math.inf:  # the ends always are
                spent = time.perf_counter() - began
                if batched:
                    if calls and budget - spent < spent / calls:
                        break
                else:
                    can = int((budget - spent) / max(spent / max(points, 1), 1e-9))
                    if can <= 0:
                        break
                    if can < len(level):  # what time is left, spread evenly over the
                        # level (the middle of each of ``can`` equal parts); a finer
                        # level would add points beside this one's gaps: it waits
                        level = [level[(2 * j + 1) * len(level) // (2 * can)]
                                 for j in range(can)]
                        last = True
            for i, metrics in zip(level, self._evaluate_snapshots([snaps[i] for i in level])):
                done[i] = metrics
            calls += 1
            points += len(level)
            self._fill_known(snaps, done)
            if last:
                break
        self.rows_dropped += len(snaps) - len(done)
        for snap in snaps:
            self._buffers.pop(snap[:3], None)
        for i in sorted(done):
            t, up, ex, _ = snaps[i]
            self.add_row(t, up, ex, done[i], self._left_out.get(snaps[i][:3], 0))
        for snap in snaps:
            self._left_out.pop(snap[:3], None)
        return self.rows

    def hurry(self, signum=None) -> None:
        """A stop asked for after the run (Ctrl-C while its curve is
        evaluated): the snapshots not yet evaluated, but the curve's ends,
        are dropped (``rows_dropped``), so that the folder is written soon."""
        self.hurried = True

    def _evaluate_snapshots(self, snaps: list) -> list[dict]:
        """``evaluate_all`` at the snapshots' parameters, each with the
        buffers it was taken with (``record``), one at a time where any has
        them; the problem holds its own buffers again after."""
        states = [self._buffers.get(snap[:3]) for snap in snaps]
        if all(state is None for state in states):
            return self.evaluate_all([snap[3] for snap in snaps])
        held = self.problem.state()
        try:
            out = []
            for snap, state in zip(snaps, states):
                self.problem.load_state(held if state is None else state)
                out.append(self.evaluate(snap[3]))
            return out
        finally:
            self.problem.load_state(held)

    def _fill_known(self, snaps, done) -> None:
        """Rows for the snapshots whose loss a full-batch step already
        computed (``target_met``), so the curve after the run evaluates only
        the rest: where every snapshot evaluated so far that has a known loss
        holds that loss alone (no accuracy or validation columns) and equals
        it to 1e-9 (the same objective, summed in another order)."""
        known = {i: self._known.get(self._snapshot_keys.get(snap[:3]))
                 for i, snap in enumerate(snaps)}
        checked = [i for i in done if known[i] is not None]
        if not checked or not all(
                set(done[i]) == {"loss"} and math.isclose(
                    float(done[i]["loss"]), known[i], rel_tol=1e-9, abs_tol=1e-12)
                for i in checked):
            return
        for i, loss in known.items():
            if i not in done and loss is not None:
                done[i] = {"loss": loss}

    def finish(self, now: float, updates: int, examples: int, params,
               left_out: int = 0) -> dict:
        """Evaluate every snapshot and the final parameters; returns the final
        row, the one row at ``updates``: rows already settled there (by a
        checkpoint, a resumed run's, the monitor's last snapshots) give way
        to it, which holds the final parameters and buffers (``left_out``:
        the run's rows left out, as ``record``'s)."""
        self._spares = []  # no more copies: their memory goes back
        self.settled_rows(final_updates=updates)
        while self.rows and self.rows[-1]["updates"] == updates:
            self.rows.pop()
        final = self.evaluate(params)
        self.add_row(now, updates, examples, final, left_out)
        return self.rows[-1]

    def evaluate(self, params) -> dict:
        return evaluate(self.problem, params)

    def evaluate_all(self, ws: list) -> list[dict]:
        return evaluate_all(self.problem, ws)

    def add_row(self, now: float, updates: int, examples: int, metrics,
                left_out: int = 0) -> None:
        """A curve row; its epoch counts the rows the steps drew, those
        ``left_out`` too (as summary.json's ``epochs``), not only ``examples``."""
        if not isinstance(metrics, dict):
            metrics = {"loss": float(metrics)}
        loss = float(metrics["loss"])
        row = {"time_s": round(now, 6), "updates": updates, "examples": examples,
               "epoch": round((examples + left_out) / self.n_examples, 6), "loss": loss}
        row.update({k: float(v) for k, v in metrics.items() if k in OPTIONAL_COLUMNS})
        self.rows.append(row)
        if (self.time_to_target_s is None and self.target_loss is not None
                and math.isfinite(loss) and loss <= self.target_loss):
            self.time_to_target_s = now

    def bar_enabled(self) -> bool:
        return self._progress if self._progress is not None else sys.stderr.isatty()

    def close(self) -> None:
        """Close the bar; the live series are flushed to disk (``api``
        writes the post-run curve into them and closes them)."""
        if self.live_writer is not None:
            self.live_writer.flush()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _open_bar(self) -> None:
        if not self.bar_enabled():
            return
        from tqdm.auto import tqdm

        self._bar = tqdm(total=self.total_examples, unit="ex", unit_scale=True,
                         desc=self._label or None, leave=False, file=sys.stderr)

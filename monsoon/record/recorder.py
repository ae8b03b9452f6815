"""The live record of a run: loss curve rows, progress bar, divergence watch.

The engine calls ``record`` whenever ``due`` says so, with a snapshot of the
parameters; the recorder evaluates the full-data objective (``problem.loss``,
the same function for every strategy) and appends a row of ``metrics.csv``.
A row is due every 1/``evals`` of the example budget (and at least every
1/``evals`` of the elapsed time), but never sooner than 20 times the cost of
one evaluation after the last, so evaluating costs at most about 5% of the run.

A non-finite loss, or more dropped updates than applied ones, stops the run
with advice.
"""
from __future__ import annotations

import math
import sys
import time

COLUMNS = ("time_s", "updates", "examples", "epoch", "loss")
# written where the problem reports them (``problem.evaluate``): torch
# problems with a classification loss or a validation set
OPTIONAL_COLUMNS = ("accuracy", "val_loss", "val_accuracy")


def evaluate(problem, w) -> dict:
    """Every reported figure at ``w``: ``problem.evaluate`` where the problem
    has one (loss, accuracy, val_loss, val_accuracy; torch problems compute
    them in eval mode under no_grad), else ``{"loss": problem.loss(w)}``."""
    if hasattr(problem, "evaluate"):
        return problem.evaluate(w)
    return {"loss": float(problem.loss(w))}


class Recorder:
    def __init__(self, problem, total_examples: int | None, target_loss: float | None = None,
                 evals: int = 100, min_interval_s: float = 0.5, progress: bool | None = None,
                 label: str = "", cost_aware: bool = True):
        self.problem = problem
        self.n_examples = problem.n_examples
        self.total_examples = total_examples
        self.target_loss = target_loss
        self.evals = evals
        self.min_interval_s = min_interval_s
        self.rows: list[dict] = []
        self.time_to_target_s = None
        self.stop_reason = None
        self._next = 0.0
        self._next_examples = 0
        self._earliest = 0.0
        self._eval_cost = 0.0
        self._bar = None
        self._progress = progress
        self._label = label
        # False for virtual time (the sim engine): evaluating costs no time there
        self.cost_aware = cost_aware

    # -- life cycle -------------------------------------------------------
    def start(self, params) -> None:
        self._open_bar()
        self._next = 0.0
        self.record(0.0, 0, 0, params)

    def due(self, now: float, examples: int) -> bool:
        return (self.evals > 0 and now >= self._earliest
                and (now >= self._next or examples >= self._next_examples))

    def record(self, now: float, updates: int, examples: int, params, dropped: int = 0):
        # CPU time, not wall time: the monitor shares the cores with busy
        # workers, and a preempted evaluation is not an expensive one.
        t = time.thread_time()
        figures = evaluate(self.problem, params)
        loss = float(figures["loss"])
        self._eval_cost = time.thread_time() - t
        self.add_row(now, updates, examples, loss, figures)
        evals = max(self.evals, 1)
        if self.cost_aware:
            self._earliest = now + max(20 * self._eval_cost, 1e-3)
        self._next = now + max(self.min_interval_s, now / evals)
        if self.total_examples:
            step = self.total_examples / evals
            self._next_examples = (int(examples / step) + 1) * step
        if not math.isfinite(loss):
            self.stop_reason = (f"diverged: the loss became {loss} after {updates} updates; "
                                "lower the learning rate (--lr)")
        elif dropped > 100 and dropped > updates:
            self.stop_reason = (f"diverged: {dropped} updates had non-finite gradients and were "
                                f"dropped (only {updates} applied); lower the learning rate (--lr)")
        return self.stop_reason

    def add_row(self, now: float, updates: int, examples: int, loss: float,
                figures: dict | None = None) -> None:
        row = {"time_s": round(now, 6), "updates": updates, "examples": examples,
               "epoch": round(examples / self.n_examples, 6), "loss": loss}
        row.update({k: float(v) for k, v in (figures or {}).items() if k in OPTIONAL_COLUMNS})
        self.rows.append(row)
        if (self.time_to_target_s is None and self.target_loss is not None
                and math.isfinite(loss) and loss <= self.target_loss):
            self.time_to_target_s = now
        if self._bar is not None:
            self._bar.n = min(examples, self._bar.total or examples)
            self._bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _open_bar(self) -> None:
        enabled = self._progress if self._progress is not None else sys.stderr.isatty()
        if not enabled:
            return
        from tqdm.auto import tqdm

        self._bar = tqdm(total=self.total_examples, unit="ex", unit_scale=True,
                         desc=self._label or None, leave=False, file=sys.stderr)

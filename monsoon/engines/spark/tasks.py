"""What runs inside a Spark task, on an executor, on one partition's Block.

Nothing here talks to the driver: a segment (``run_segment``) starts from
the parameters it is given (a local-sgd round's broadcast or closure; an
async worker's message over its task's socket, ``stream.py``) and returns
its result, and only a whole result ever reaches the driver (``_Segment``:
the shared interpreter, ``server/worker.py``, whose exchange ends the
segment). A retried attempt recomputes the same result from the same
inputs, so an update is applied once, whatever Spark retried.

A worker's ``messages.Sender`` (its compressor and error-feedback residual)
goes out with the segment and comes back with its result, as its inner
rule's state does: a task keeps nothing between segments (a retried attempt
starts from what the driver holds). What it sends (a push, a
drift, EASGD's elastic difference) comes back packed (``Sender.pack``:
``Encoded.nbytes`` bytes when ``--compress`` is on, else the dense vector).

The driver's programs (``driver.py``, ``barrier.py``) cut each global batch
among the partitions that hold its rows. A torch model that cannot train
on a pass of fewer than ``fewest`` rows (a BatchNorm over one value per
channel: ``placement.check_fewest_rows``, which refuses a partition that
small, and a batch or worker's part that small in all) would fail where a
batch's draw gives a larger partition fewer rows of it: that share is left
out of the step (``usable``), which is then the mean over the rows taken,
and only those count as its examples (the ids left out come back, so the
driver takes them off their workers' counts).
With ``fewest`` 1 (every other model) nothing is left out.
"""
from __future__ import annotations

import time

import numpy as np

from ...strategies.ops import Average, Clock, Fetch, Push, weighted
from ...server.worker import WAIT, Worker


def step_union(waiting: dict, ranks: list, n: int):
    """The rows of a sync step: the union of its workers' indices, or None
    where that is every row of the data set (no ids shipped then, and the
    step's loss is the full-data loss)."""
    union = np.concatenate([waiting[k].indices for k in ranks])
    return None if len(union) == n and np.bincount(union, minlength=n).all() else union


def left_counts(waiting: dict, ranks: list, left: list) -> dict:
    """How many rows of each worker's indices are among the global ids a
    step's partitions left out (``usable``; ``left``: their arrays)."""
    ids = np.concatenate(left) if left else np.empty(0, dtype=np.int64)
    if not len(ids):
        return dict.fromkeys(ranks, 0)
    return {k: int(np.isin(waiting[k].indices, ids).sum()) for k in ranks}


def usable(block, batch, fewest: int = 1):
    """This partition's rows of the global ids ``batch`` (None: every row)
    that a training pass takes (``Block.local``), and the global ids it
    leaves out: a share of fewer than ``fewest`` rows, which the model
    cannot train on in a pass of its own (a BatchNorm over one value per
    channel: ``TorchModel.fewest_rows``), is left out whole; else none
    (an empty array)."""
    rows = block.local(batch)
    if 0 < len(rows) < fewest:
        held = block.ids if batch is None else batch[np.isin(batch, block.ids)]
        return rows[:0], held
    return rows, rows[:0]


def gradient_sum(block, w, batch, fewest: int = 1):
    """Gradients reduced where computed: this partition's share of the global batch ``batch`` (global
    ids; None: every row) at ``w``: ``(index, examples, mean loss, mean
    gradient, ids left out)``, the gradient None when the batch has none of
    its rows it can take (``usable``)."""
    rows, left = usable(block, batch, fewest)
    if len(rows) == 0:
        return block.index, 0, 0.0, None, left
    loss, grad = block.problem.gradient(w, rows)
    return block.index, len(rows), float(loss), np.array(grad, copy=True), left


def gradient_parts(block, params, requests, fewest: int = 1):
    """Driver-run programs: for each request ``(worker, p, global ids)``,
    this partition's part of that worker's gradient at ``params[p]``:
    ``(worker, index, rows, mean loss, mean gradient, rows left out)``,
    none where the partition holds none of its ids; a share it leaves out
    (``usable``) has 0 rows and no gradient."""
    out = []
    for k, p, ids in requests:
        rows, left = usable(block, ids, fewest)
        if len(rows):
            loss, grad = block.problem.gradient(params[p], rows)
            out.append((k, block.index, len(rows), float(loss), np.array(grad, copy=True), 0))
        elif len(left):
            out.append((k, block.index, 0, 0.0, None, len(left)))
    return out


def run_segment(block, strategy, job, w, ticket, local_rule=None, work=None, sender=None,
                deltas=False):
    """Run worker ``block.index``'s program from ``job.start_step`` to its
    next exchange with the server (Push, Average or Elastic) or its end.

    ``w``: the server's parameters at launch (what a Fetch reads, with
    ``ticket`` its version); ``work``: the worker's own parameters to start
    from (EASGD; default ``w``); ``local_rule``: its private inner rule
    (local SGD, EASGD), state included; ``sender``: its ``messages.Sender``,
    which packs what the segment sends and counts it (returned in
    ``"sender"``); ``deltas``: a pushing program's gradients each take a
    step of ``local_rule`` (the run's rule, this worker's own state, its
    sums the server's at launch: ``DriverServer``) on ``work`` at once, its LocalSteps are not taken, and its Push sends the
    delta ``w - work`` instead of the accrued gradient. Returns a dict: the op that ended
    the segment (``"push"``, ``"average"``, ``"elastic"`` or None), what it
    carries, the steps and examples done, the rule back, ``ended`` (the
    program has nothing left) and ``clock``: the staleness bound of an SSP
    tick that follows the push (the driver carries the tick out)."""
    started = time.perf_counter()
    seg = _Segment(block, strategy, w, ticket, local_rule, work, sender, deltas)
    out = seg.out
    if sender is not None:
        sender.received_bytes += seg.anchor.nbytes  # the server's parameters, read at launch
    seg.program = program = strategy.program(job)
    try:
        if seg.advance():
            out["ended"] = True
        else:
            _look_past_exchange(program, out)
    finally:
        program.close()
    if out["op"] not in ("push", "average"):
        out["work"] = seg.work  # the worker's own copy goes on (EASGD)
    out["task_s"] = time.perf_counter() - started  # the job's wall less this: scheduling
    return out


class _Segment(Worker):
    """The ops of one segment (``run_segment``): the shared interpreter,
    Gradient on the block's rows, a Fetch that reads what the segment
    started from, and an exchange that ends the segment (``WAIT``)."""
    engine_name = "spark"

    def __init__(self, block, strategy, w, ticket, local_rule, work, sender, deltas):
        super().__init__(block.index, block.problem, strategy,
                         np.array(w if work is None else work, copy=True), local_rule)
        self.block, self.ticket, self.sender, self.deltas = block, ticket, sender, deltas
        self.anchor = np.asarray(w)
        # local, local_dropped: its local steps (the inner rule on its copy)
        self.out = {"op": None, "steps": 0, "examples": 0, "local": 0, "local_dropped": 0,
                    "local_rule": self.local_rule, "ended": False, "loss": 0.0, "sender": sender}
        # an exchange ends the segment: what it sends goes in ``out`` (``WAIT``)
        self.handlers.update({Fetch: self.fetch, Push: self.push, Average: self.average})

    def gradient(self, op):
        loss, grad = self.problem.gradient(self.work, self.block.rows_of(op.indices))
        grad = weighted(grad, op.weight)
        if self.deltas:
            self.count_local(self.local_rule(self.work, grad))
        out = self.out
        out["steps"] += 1
        out["examples"] += len(op.indices)
        out["loss"] += float(loss)
        return loss, grad

    def fetch(self, op):
        return WAIT if self.out["steps"] else self.ticket  # a second read: on the driver

    def local_step(self, op) -> None:
        if not self.deltas:  # with deltas the rule's own step was taken
            super().local_step(op)

    def count_local(self, applied: bool) -> None:
        self.out["local" if applied else "local_dropped"] += 1

    def pack(self, v):
        """``v`` as the segment sends it: packed by the worker's sender
        (``Sender.pack``, which counts it), or as it is where none."""
        return v if self.sender is None else self.sender.pack(v)

    def push(self, op):
        """A Push ends the segment: it sends the accrued gradient, or with
        ``deltas`` the delta of the worker's own steps; None where not finite
        (``"skipped"``)."""
        sent = self.anchor - self.work if self.deltas else op.grad
        packed = self.pack(sent)  # counted as sent even where not finite (``compressing``)
        admitted = self.admits(sent)
        self.out.update(op="push", ticket=op.ticket, skipped=not admitted,
                        grad=np.array(packed, copy=True) if admitted else None)
        return WAIT

    def average(self, op):
        """An Average ends the segment: it sends the drift server - copy and
        the examples behind it."""
        self.out.update(op="average", drift=self.pack(self.anchor - self.work),
                        examples_behind=op.examples)
        return WAIT

    def send_elastic(self, op):
        """EASGD's exchange ends the segment. Compressed, the worker sends
        its difference and takes it off ``work`` here; else the driver forms
        the difference from ``work``, which goes back whole."""
        sender = self.sender
        self.out.update(op="elastic", alpha=op.alpha)
        if sender is not None and sender.compression.active:
            # read x~ at launch, send D = C(alpha (x_k - x~) + e), x_k -= D
            self.out["difference"], _ = self.elastic_difference(self.anchor, op.alpha,
                                                                packed=True)
        elif sender is not None:
            sender.dense(self.work.nbytes)  # x_k itself: the driver forms the difference
        return WAIT

    def skip_elastic(self, op):
        """A dropped exchange (its copy not finite: ``server/elastic.py``,
        whose reset of the inner rule goes back in ``"local_rule"``) ends
        the segment too, with nothing sent (``"skipped"``): the driver
        counts the drop and restarts the copy from the centre as it is when
        the result is applied (``DriverServer._apply``)."""
        self.out.update(op="elastic", alpha=op.alpha, skipped=True)
        return WAIT


def _look_past_exchange(program, out) -> None:
    """Whether the program has anything left after the exchange (``ended``),
    and the bound of an SSP tick that follows it (``clock``: the driver
    carries the tick out)."""
    try:
        after = program.send(0)
        if type(after) is Clock:
            out["clock"] = after.bound
    except StopIteration:
        out["ended"] = True

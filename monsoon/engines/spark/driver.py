"""Worker programs on the driver; their gradients, one Spark job at a time.

Programs that ``placement.in_tasks`` leaves on the driver (sync, serial, a
plug-in's clipped sync) run as generators there, one per worker, on the
parameters the driver holds, each through the shared interpreter
(``server/worker.py``; ``_Program``). A worker's ops run at once on the
driver (Apply, Fetch, Push, LocalStep, LocalApply, Elastic: the server and
any private copies live there) until it waits for a gradient or at a
collective (``WAIT``). Each round, then:

- every waiting worker's Gradient goes into ONE Spark job over all
  partitions (``tasks.gradient_parts``): partition p returns, per worker k,
  the mean loss and gradient over the rows of k's indices it holds and how
  many; the driver weighs them by rows, in partition order, into k's mean
  over exactly its indices, and sends it into k's program;
- once every live worker waits at the collective, the step runs: the
  example-weighted mean of the contributions in rank order, and the rule
  applied ONCE (AllReduce); or the same of the drifts server - copy
  (Average), the copies then reset to the server (``collective.apply_mean``).

A strategy whose gradients reach AllReduce unchanged (``raw_gradients``)
is reduced where it is computed: each partition returns one sum over the
union of the step's indices (``tasks.gradient_sum``; no ids shipped when
the union is the whole data set), and that mean is the step's. Either way
sync equals serial to floating-point reduction order (float64, 1e-9), and
a plug-in's program sees each worker's own gradient.

A share too small for the model's pass is left out (``tasks.py``), counted
apart (``short``, ``left_out``); a step or Apply taking none is void.

Exactly once: only a finished job's results are applied, and a task Spark
retries recomputes the same partition result. Where the driver waits: for each
job, at most the run's ``timeout`` (``jobs.py``); a failed job fails the run.
``target_loss``: a full-batch step's loss is the full-data objective at w, so
the run stops (``recorder.target_met``) before the step that would follow a
loss at the target. Checkpoints (programs on the server's parameters): after a
step, the parameters, rule state, steps done (which a resumed run's programs
skip: ``WorkerJob.start_step``) and rows left out. SIGTERM/SIGINT stop the
programs where every gradient counted is applied (each waits for its next
gradient): a last checkpoint there.
"""
from __future__ import annotations

import time

import numpy as np

from ...errors import ConfigError
from ...strategies import WorkerJob
from ...strategies.ops import AllReduce, Apply, Average, Fetch, Gradient, Push
from ...server.collective import apply_mean
from ...server.reduce import weighted_sum
from ...server.core import ServerCore, new_readers
from ...server.worker import WAIT, Worker
from ...record.live import add_figures
from ...record import progress
from ...monitor.due import Due
from ...monitor.lifecycle import stop_reason
from ...monitor.tally import local_totals
from .jobs import share
from .tasks import gradient_parts, gradient_sum, left_counts, step_union

class _Program(Worker):
    """Worker k's program on the driver: the server's ops carried out on the
    driver's state at once; a Gradient or a collective is left in
    ``driver.ops`` (``WAIT``) for the round's Spark job or step."""
    engine_name = "spark"

    def __init__(self, driver, k: int, program):
        super().__init__(k, None, driver.strategy, driver.work[k])
        self.driver, self.program = driver, program
        self.held = 0  # its gradients' examples, counted when the server takes them (``taken``)
        self.handlers.update({Gradient: self.wait, AllReduce: self.wait, Average: self.wait,
                              Apply: self.apply, Fetch: self.fetch, Push: self.push})

    def wait(self, op):
        self.driver.ops[self.rank] = op
        return WAIT

    def taken(self) -> None:
        """The server took (applied or dropped) the message carrying this
        worker's gradients since the last: their examples count now, so a
        row's examples are those of the parameters it holds."""
        self.count_examples(self.release())

    def count_examples(self, examples: int) -> None:
        self.driver.examples += examples  # a push's (``Worker.push``): applied at once

    def release(self) -> int:
        d = self.driver
        d.left_out += d.short[self.rank]  # counted with the examples its message carries
        d.short[self.rank] = 0  # its message carries them: the next starts afresh
        return super().release()

    def apply(self, op) -> None:
        d = self.driver
        took = self.held or not d.short[self.rank]  # not every row left out (``tasks.usable``)
        self.taken()
        if took:
            d.core.apply_sum(op.grad, d.core.version, worker=self.rank, loss=op.loss, counts=1)
        d.steps += 1

    def fetch(self, op):
        d = self.driver
        version = d.core.read(self.rank, None if d.shared else self.work)
        self.took_centre([version])
        return version

    def admits(self, grad) -> bool:
        return self.driver.core.admits(grad)  # the server's check: it counts the drop

    def send_push(self, grad, ticket) -> None:
        self.driver.core.push(self.rank, grad, int(ticket), checked=True)

    def send_elastic(self, op) -> None:
        d = self.driver
        self.taken()
        d.core.staleness[self.exchanged(0, d.core.version)] += 1  # ``server/elastic.py``
        self.work -= d.core.elastic(self.work, op.alpha)

    def count_local(self, applied: bool) -> None:
        self.driver.local[0 if applied else 1] += 1


class DriverPrograms:
    def __init__(self, ctx, rule, strategy, w0, ckpts):
        self.ctx, self.rule, self.strategy, self.ckpts = ctx, rule, strategy, ckpts
        self.w = np.array(w0, copy=True)
        # the server's update (``server/core.py``): its version (the updates applied),
        # dropped count and staleness
        self.core = ServerCore(self.w, rule, readers=new_readers(rule, ctx.workers, self.w.size,
                                                                 self.w.dtype))
        self.shared = strategy.shared_params
        self.raw = self.shared and strategy.raw_gradients
        ranks = range(ctx.workers)
        self.work = {k: self.w if self.shared else self.w.copy() for k in ranks}
        self.acc, self.tmp = np.empty_like(self.w), np.empty_like(self.w)
        self.grads = {k: np.empty_like(self.w) for k in ranks}  # each worker's mean gradient
        self.programs, self.ops = {}, {}  # rank -> its _Program; -> the op it waits at
        # rank -> the rows its last gradient left out; -> those since its last exchange
        self.left, self.short = {}, dict.fromkeys(ranks, 0)
        self.steps = self.examples = 0
        self.left_out = 0  # the rows left out of the examples counted (``tasks.usable``)
        self.jobs = 0  # Spark jobs run: one per round of gradients
        self.local = [0, 0]  # the programs' local steps (an inner rule): applied, dropped
        self.step_loss = None   # the last gradients' mean loss
        self.full_loss = None   # the full-data loss at w, when the last step was full-batch

    # -- the programs ---------------------------------------------------------------
    def _send(self, k, reply) -> None:
        """Send worker k the reply it waits for, and carry out its ops until
        it waits again (``ops[k]``) or its program ends."""
        del self.ops[k]
        if self.programs[k].advance(reply):
            self.programs.pop(k).taken()  # none left: every program ends with its message

    # -- gradients: one job --------------------------------------------------------
    def _gradients(self, waiting: dict) -> dict:
        ranks = sorted(waiting)
        self.jobs += 1
        self.left = dict.fromkeys(ranks, 0)  # the job's rows left out (``tasks.usable``)
        if self.raw:
            replies = self._reduced(waiting, ranks)
            self.step_loss = next(iter(replies.values()))[0] if replies else None
        else:
            replies = self._parts(waiting, ranks)
        for k in ranks:  # counted once the step or push that carries them is taken
            self.programs[k].held += len(waiting[k].indices) - self.left[k]
            self.short[k] += self.left[k]
        if self.raw:  # one step's gradient, shared by its workers: weighted once (``ops.Gradient``)
            ranks = ranks[:1]
        for k in ranks:
            if waiting[k].weight != 1.0:
                replies[k][1][...] *= waiting[k].weight  # the driver's own buffer
        return replies

    def _parts(self, waiting: dict, ranks: list) -> dict:
        """Each waiting worker's gradient at its own parameters (or the
        shared ones), its parts summed over the partitions."""
        ctx, fewest = self.ctx, self.ctx.fewest
        params = [self.w] if self.shared else [self.work[k] for k in ranks]
        requests = [(k, 0 if self.shared else i, waiting[k].indices) for i, k in enumerate(ranks)]
        nbytes = sum(p.nbytes for p in params) + sum(r[2].nbytes for r in requests)
        bc = share(ctx.sc, (params, requests), nbytes)

        def task(it, bc=bc):
            params_, requests_ = bc.value
            return [part for b in it for part in gradient_parts(b, params_, requests_, fewest)]

        try:
            parts = ctx.jobs.run(ctx.blocks, task, what=f"the gradients of step {self.steps}")
        finally:
            bc.destroy(blocking=False)
        replies = {}
        for k in ranks:
            self.left[k] = sum(p[5] for p in parts if p[0] == k)
            mine = sorted((p[1], p) for p in parts if p[0] == k and p[2])
            count = sum(p[2] for _, p in mine)
            out = self.grads[k]
            if not mine:
                out.fill(0)
                replies[k] = (0.0, out)
                continue
            weighted_sum({i: p[4] for i, p in mine}, [i for i, _ in mine],
                         [p[2] for _, p in mine], out, self.tmp)
            replies[k] = (sum(p[2] * p[3] for _, p in mine) / count, out)
        counts = {k: len(waiting[k].indices) - self.left[k] for k in ranks}
        self.step_loss = sum(replies[k][0] * counts[k] for k in ranks) / max(1, sum(
            counts.values()))  # the step's mean loss (a rule may use it: lbfgs)
        return replies

    def _reduced(self, waiting: dict, ranks: list) -> dict:
        """Every worker's gradient goes to AllReduce unchanged: one sum per
        partition over the union of the indices, one mean for all."""
        ctx, fewest = self.ctx, self.ctx.fewest
        union = step_union(waiting, ranks, ctx.n_examples)
        self.full_loss = None
        bc = share(ctx.sc, (self.w, union), self.w.nbytes + (0 if union is None else union.nbytes))

        def task(it, bc=bc):
            w_, batch_ = bc.value
            return [gradient_sum(b, w_, batch_, fewest) for b in it]

        try:
            found = ctx.jobs.run(ctx.blocks, task, what=f"sync step {self.steps}")
        finally:
            bc.destroy(blocking=False)
        parts = sorted((p[:4] for p in found if p[1] > 0), key=lambda p: p[0])
        self.left.update(left_counts(waiting, ranks, [p[4] for p in found]))
        out = self.grads[0]
        if parts:
            weighted_sum({p[0]: p[3] for p in parts}, [p[0] for p in parts],
                         [p[1] for p in parts], out, self.tmp)
        else:  # every row left out (``tasks.usable``): the step counts none
            out.fill(0)
        loss = sum(p[1] * p[2] for p in parts) / max(1, sum(p[1] for p in parts))
        if union is None:
            self.full_loss = loss
        return {k: (loss, out) for k in ranks}

    # -- collectives ---------------------------------------------------------------
    def _collective(self) -> dict:
        ops, ranks = self.ops, sorted(self.ops)
        kinds = {type(op) for op in ops.values()}
        if len(kinds) > 1:
            raise ConfigError(f"{self.strategy.name}'s workers wait at different collectives "
                              f"({', '.join(sorted(c.__name__ for c in kinds))}) at once")
        # a contribution's examples, less the rows its gradients left out (``tasks.usable``)
        examples = {k: ops[k].examples - self.short[k] for k in ranks}
        counted = [k for k in ranks if examples[k] > 0
                   and (type(ops[k]) is Average or ops[k].grad is not None)]
        if kinds == {Average}:
            parts = {k: self.w - self.work[k] for k in counted}
        else:
            parts = {k: ops[k].grad for k in counted}
        update = {"loss": self.step_loss, "counts": len(counted) if kinds == {Average} else 1}
        if counted and self.raw and all(parts[k] is self.grads[0] for k in counted):
            # already the step's mean (``_reduced``)
            self.core.apply_sum(self.grads[0], self.core.version, **update)
        elif counted:
            apply_mean([self.core], parts, counted, [examples[k] for k in counted],
                       [(0, self.w.size)], self.acc, self.tmp, self.core.version, **update)
        self.steps += 1
        for k in ranks:  # a private copy starts the next step from the server's parameters
            self.programs[k].taken()
            self.programs[k].restart(self.w)
        return dict.fromkeys(ranks, None if kinds == {Average} else 0)

    # -- the run ---------------------------------------------------------------------
    def run(self, recorder) -> dict:
        ctx, ckpts = self.ctx, self.ckpts
        before = 0.0
        start = (ckpts.start(self.w, self.rule, ctx.workers, needs=("step",))
                 if self.shared else None)
        if start is not None and start.saved is not None:
            start.restore(self.w, self.core.state)
            self.steps, self.core.version = start.step, start.updates
            self.core.dropped, self.examples, before = start.dropped, start.examples, start.time_s
            self.left_out = int(start.saved.meta.get("examples_left_out", 0))
            self.core.staleness[0] = self.core.version
        for k in range(ctx.workers):
            self.programs[k] = _Program(self, k, self.strategy.program(WorkerJob(
                k, ctx.workers, ctx.n_examples, ctx.batch_size, ctx.seed, ctx.budget,
                start_step=self.steps)))
            if self.programs[k].advance():
                del self.programs[k]
        stopped = interrupted = None
        recorder.start(self.w)
        due = Due(recorder)
        live = {}  # each worker's losses and examples, for the live series
        t0 = time.perf_counter() - before
        replies = {}  # the round's answers, sent after its checks (a stop sends none)
        try:
            while self.ops:
                for k in sorted(replies):
                    self._send(k, replies[k])
                waiting = {k: op for k, op in self.ops.items() if type(op) is Gradient}
                signum = self._interrupted(due)
                if signum and len(waiting) == len(self.ops):  # every gradient counted is applied
                    interrupted, stopped = signum, stop_reason(signum)
                    break
                if waiting:
                    replies = self._gradients(waiting)
                    for k, reply in replies.items():
                        took = len(waiting[k].indices) - self.left[k]
                        n = 0 if self.left[k] and not took else 1  # no loss where it took none
                        add_figures(live, k, float(reply[0]) if n else 0.0, n, took)
                    if self.full_loss is not None and recorder.target_met(
                            self.full_loss, self.core.version, self.core.dropped):
                        stopped = recorder.target_reason  # the loss at w: no step more
                        break
                elif self.ops:
                    replies = self._collective()
                else:
                    replies = {}
                now = time.perf_counter() - t0
                stopped = due.look(
                    now, self.examples,
                    lambda: (self.w, self.core.version, self.core.dropped,
                             local_totals(self.strategy, *self.local), self.examples,
                             self.left_out),
                    lambda: (self.examples, self.core.version, self.core.dropped),
                    lambda: (live, self.core.staleness))
                if stopped:
                    break
                if self.shared and ckpts.due(self.core.version + self.core.dropped):
                    self._checkpoint(now, "periodic")
        finally:
            for worker in self.programs.values():
                worker.program.close()
        due.live(time.perf_counter() - t0, lambda: (self.examples, self.core.version,
                                                    self.core.dropped),
                 lambda: (live, self.core.staleness), final=True)  # the run's last row
        if self.shared and interrupted:  # where the programs stopped: a step boundary
            self._checkpoint(time.perf_counter() - t0, "interrupted")
        if self.shared and stopped is None:
            self.rule.finish(self.w, self.core.state)
        return {"params": self.w, "wall": time.perf_counter() - t0, "examples": self.examples,
                "left_out": self.left_out,
                "updates": self.core.version, "dropped": self.core.dropped,
                "local": local_totals(self.strategy, *self.local),
                "staleness": self.core.staleness,
                "failed": {}, "stopped": stopped, "interrupted": interrupted,
                "worker_params": {} if self.shared else dict(self.work),
                "extra": {"spark_jobs": self.jobs}}

    def _interrupted(self, due) -> int | None:
        """The stop signal (SIGTERM, SIGINT) this run has seen, if one came:
        the driver's own (``lifecycle.StopSignals``); a barrier rank's, the
        one the all-reduce carried (``barrier.py``)."""
        due.signal()
        return due.interrupted

    def _checkpoint(self, now: float, reason: str) -> None:
        """The server's state after ``steps`` steps (programs on the server's
        parameters), written through ``ckpts`` (a rank's: by the driver)."""
        self.ckpts.save(self.core.version + self.core.dropped, now, self.w, self.core.state,
                        progress.counts(reason, self.examples, self.core.dropped,
                                        step=self.steps, applied=self.core.version,
                                        examples_left_out=self.left_out))

"""A worker of the Ray engine (run as a Ray actor): it loads its problem
(and so its data) once, runs its strategy program (``server/worker.py``'s
loop, Gradient, LocalStep and LocalApply), and turns each op that travels
into calls on the shard actors. Every remote wait has the run's timeout.

Workers always compute on a private copy of the parameters (there is no
shared memory across machines); ``AllReduce`` and ``Average`` return with the
new parameters, ``Fetch`` refreshes them, and a ``Push`` runs in the
background, one at a time (Downpour's "push may run in the background").
A push that is not finite is dropped here, never sent (``Worker.push``);
its shards' rules hear of it with its next read or push, or its end, which
carry its count of drops so far (``Shard.told``; a worker lost, or killed
where the run stopped: the driver tells its last reported count).

Compressed runs (``--compress``): what the worker sends (a push, a
contribution, a drift, EASGD's elastic difference) is its packed message
(``messages.Sender.pack``, ``Encoded.nbytes`` bytes), put once in Ray's
object store; every shard reads it and decodes its own slice. A
compressed elastic exchange reads the centre first, then sends
D = C(alpha (x_i - x~) + e) and applies x_i -= D. The worker counts what it
sends and receives (``Sender.stats``, in its result and its progress).

A synchronous step's calls on the shards are ``sync_step.py``'s: one
``contribute`` a shard, or, with backup workers on several shards, shard 0
deciding which workers count for every shard. Where the inner rule keeps
sums (AdaGrad's), an Average sends each shard what its steps added to them
beside the drift, and starts the next round from the synchronised sums the
shards send back (Local AdaAlter, ``server/summed.py``).

A stop (SIGTERM/SIGINT at the driver): a worker of a synchronous step
ends after the step a shard's reply names (``shard.py``), its parameters
those of the step; any other worker ends before its next op that lands
nothing (``stop``, then ``server/worker.py``'s ``halt``), its pushes in.
Either way ``run`` returns its report as at a normal end.

Elastic sync (not with --compress): a shard may answer a contribution with a regroup (the step's
workers changed, ``shard.py``). The worker keeps its parameters at the
step's start until every shard has applied the step, hands ``Regroup`` to
its program, and sends the recomputed part only to the shards that asked
for it. A worker that comes back starts with ``join``.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from ...strategies.ops import AllReduce, Average, Fetch, Push, Regroup
from ...problems.base import seed_worker
from ...compressors.messages import Compression, Sender, compressing
from ...record.live import LOSS_CELLS, add_loss
from ...server.reduce import finite
from ...server.clocks import WorkerClock
from ...server.summed import SharedSums
from ...server.worker import Halted, Worker
from .sync_step import step_replies


class RemoteWorker(Worker):
    engine_name = "ray"

    def __init__(self, rank, problem, strategy, job, shards, bounds, w0, timeout, clock=None,
                 compression=None, sums=None):
        import copy

        # Ray hands arrays over read-only (zero copy from its object store);
        # the worker's own copy has writable buffers. Its data is loaded once.
        super().__init__(rank, copy.deepcopy(problem), strategy, np.array(w0, copy=True))
        # the actor's process is this worker's own
        seed_worker(self.problem, job.seed, rank, strategy.gradients_before(job))
        self.job = job
        self.shards = shards
        self.bounds = bounds
        self.anchor = np.array(w0, copy=True)  # the server's parameters at the last sync
        self.timeout = timeout
        self.sender = Sender(compression or Compression(), rank)
        self.sender.keep_previous = strategy.backup_workers > 0  # a late message: taken back
        self.compressed = self.sender.compression.active
        self.sync_step = job.start_step
        self.gen = 0        # elastic: the membership generation this worker cuts its parts for
        # elastic: the replies of shards that applied the step while others regroup it
        self.applied = {}
        # losses (``add_loss``'s cells: a huge or non-finite loss spoils no
        # later row), updates: this worker's figures for the live series;
        # local, local_dropped: its local steps (local SGD, EASGD), for the recorder
        # dropped_examples: those of the pushes dropped here, never sent (a
        # curve row's examples: its shard's applied ones and these, ``engine.py``)
        self.counts = {"examples": 0, "dropped": 0, "late": 0, "losses": [0.0] * LOSS_CELLS,
                       "updates": 0, "local": 0, "local_dropped": 0, "dropped_examples": 0}
        self.carried = 0  # the examples of the push under way (``release``)
        self.staleness = Counter()
        self.pending = []
        self.told = 0  # the pushes dropped here that the shards' rules have heard of
        # Local AdaAlter: this worker's replica of the shared sums (``sums``: their start)
        self.shared_sums = None if sums is None else SharedSums(
            [np.array(a, copy=True) for a in sums])
        if self.shared_sums is not None:
            self.shared_sums.start(self.local_rule, self.work)
        self.halt = [0]  # set by ``stop``, from the actor's second thread
        self.handlers.update({Fetch: self.fetch, Push: self.push, AllReduce: self.all_reduce,
                              Average: self.average})
        if clock is not None:  # SSP: ticks and floors from the clock server
            self.ssp = RayClock(self, clock).install(self.handlers)

    def ready(self) -> bool:
        return True

    def progress(self) -> dict:
        """Its figures so far, as ``RunTally.add`` reads a report: a worker
        lost later counts them by rank (its traffic with no residual, SSP's
        clock report; ``engine.py``'s ``_drive``)."""
        return {**self.counts, "staleness": dict(self.staleness),
                "traffic": self.sender.stats(residual=False),
                "clocks": self.ssp.report() if self.ssp is not None else None}

    def report_now(self) -> dict:
        """The report ``run`` ends with, taken while the program still runs
        (the actor's second thread): a run the driver stops (diverged, at
        its target) kills its workers, and their counts (examples, dropped,
        late, traffic) would otherwise be lost from the result."""
        return self.report(staleness=dict(self.staleness), **self.counts)

    def stop(self) -> None:
        """The driver's stop, for a worker that steps on its own (not in a
        synchronous step): it ends before its next op that lands nothing."""
        self.halt[0] = 1

    def join(self, gen: int, members: tuple) -> dict:
        """Elastic sync: take part, as one of ``members``, from the earliest
        step any shard is on, with the parameters at that step (a shard one
        step ahead hands its slice from before that step), and run."""
        replies = self._get([sh.joining.remote() for sh in self.shards])
        step = min(r[1] for r in replies)
        for (a, b), (values, at, before) in zip(self.bounds, replies):
            self.work[a:b] = values if at == step else before
        self.anchor[:] = self.work
        self.sync_step, self.gen = step, gen
        self.job = dataclasses.replace(self.job, start_step=step, members=tuple(members))
        return self.run()

    def run(self) -> dict:
        self.program = compressing(self.strategy.program(self.job), self.sender,
                                   self.work.nbytes, packed=True)
        try:
            self.advance()
        except Halted:  # stopped where the driver asked: what it counted stands
            pass
        self._settle_pushes()
        if self.counts["dropped"] > self.told:  # its last pushes were dropped: none told
            told = self._told()
            self._get([sh.told.remote(self.rank, told) for sh in self.shards])
        if self.ssp is not None:
            self.ssp.retire()
        return self.report(staleness=dict(self.staleness), **self.counts)

    def _get(self, refs):
        import ray

        return ray.get(refs, timeout=self.timeout)

    def _call(self, batch) -> list:
        """The replies of ``[(shard, method, args)]``, called at once."""
        return self._get([getattr(shard, method).remote(*args) for shard, method, args in batch])

    def _per_shard(self, message) -> list:
        """What each shard is sent: its slice of a dense vector, or (compressed)
        one object-store copy of the packed message, which every shard reads."""
        if not self.compressed:
            return [message[a:b] for a, b in self.bounds]
        import ray

        return [ray.put(message)] * len(self.shards)

    # -- ops (Gradient, LocalStep, LocalApply: ``server/worker.py``) ------------
    def count_gradient(self, examples, loss):
        self.count_examples(examples)
        add_loss(self.counts["losses"], loss)

    def count_local(self, applied: bool):
        self.counts["local" if applied else "local_dropped"] += 1

    def fetch(self, op):
        ticket = self._read(self.work)
        self.took_centre(ticket)
        return ticket

    def _read(self, into):
        """Every shard's slice of the server's parameters, copied into
        ``into`` (a Fetch's working copy, a compressed elastic exchange's
        centre); returns the versions read (a Fetch's ticket)."""
        told = self._told()
        replies = self._get([sh.read.remote(self.rank, told) for sh in self.shards])
        ticket = np.empty(len(self.shards), dtype=np.int64)
        for s, ((a, b), (values, version)) in enumerate(zip(self.bounds, replies)):
            into[a:b] = values
            ticket[s] = version
        return ticket

    def count_examples(self, examples):
        self.counts["examples"] += examples

    def release(self) -> int:
        self.carried = super().release()  # the push's examples, sent with it (``send_push``)
        return self.carried

    def count_dropped(self):
        self.counts["dropped"] += 1
        self.counts["dropped_examples"] += self.carried  # a push's; 0 for an exchange
        self.carried = 0

    def _told(self) -> int:
        """The drops the shards' rules hear of with the call now made: all
        this worker's so far (``count_dropped``)."""
        self.told = self.counts["dropped"]
        return self.told

    def send_push(self, grad, ticket):
        self._settle_pushes()
        # .remote() serializes its arguments at once: no copy needed here
        self.counts["updates"] += 1
        told, examples, self.carried = self._told(), self.carried, 0
        self.pending = [sh.push.remote(self.rank, part, int(ticket[s]), told, examples)
                        for s, (sh, part) in enumerate(zip(self.shards, self._per_shard(grad)))]

    def _settle_pushes(self):
        if self.pending:  # one count a push: its stalest slice's (``ServerCore.push``)
            self.staleness[max(self._get(self.pending))] += 1
            self.pending = []

    def all_reduce(self, op):
        if op.grad is None:
            return self._synchronous(None, op.examples, True)
        # compressed, op.grad is the packed message: the sender checked the vector
        whole = self.sender.last_finite if self.compressed else finite(op.grad)
        return self._synchronous(op.grad, op.examples, whole)

    def average(self, op):
        moved = self.anchor - self.work
        packed, sums = self.sender.pack(moved), self.shared_sums
        if sums is None:
            return self._synchronous(packed, op.examples, finite(moved))
        added = sums.added(self.local_rule, self.work)
        sums.count(self.sender)
        behind = self._synchronous(packed, op.examples, finite(moved), added)
        sums.start(self.local_rule, self.work)
        return behind

    def _synchronous(self, contribution, examples, whole_finite: bool, added=None):
        """This worker's part of a synchronous step on every shard; each
        shard is told whether the whole contribution was finite, so that a
        non-finite one drops the step on all of them. ``added``: what the
        inner rule's steps added to the shared sums (Average), each shard
        sent its slice beside its part."""
        targets = [s for s in range(len(self.shards)) if s not in self.applied]
        parts = [None] * len(self.shards) if contribution is None \
            else self._per_shard(contribution)
        if added is not None:
            parts = [(p, [a[lo:hi] for a in added]) for p, (lo, hi) in zip(parts, self.bounds)]
        regroup = None
        for s, reply in step_replies(self._call, self.shards, targets, self.sync_step, self.rank,
                                     parts, examples, self.gen, whole_finite,
                                     self.strategy.backup_workers > 0).items():
            if isinstance(reply[0], str):  # ("regroup", gen, members)
                if regroup is None or reply[1] > regroup[1]:
                    regroup = reply
            else:
                self.applied[s] = reply
        if regroup is not None:  # the step is not applied everywhere yet: recompute the part
            self.gen = regroup[1]
            return Regroup(tuple(regroup[2]))
        replies, self.applied = [self.applied[s] for s in range(len(self.shards))], {}
        for (a, b), (values, _, _) in zip(self.bounds, replies):
            if added is not None:  # the shard's slice and its slice of the sums
                values, sums = values
                for shared, part in zip(self.shared_sums.sums, sums):
                    shared[a:b] = part
            self.work[a:b] = values
        self.anchor[:] = self.work
        _, behind, counted = replies[0]
        if not counted:  # late (backup workers): its message is dropped, as never sent
            self.counts["late"] += 1
            if contribution is not None and self.sender.keep_previous:
                self.sender.take_back()
        if replies[0].applied:  # once a step (``StepReply``): one count an update
            self.counts["updates"] += 1
            self.staleness[0] += 1
        self.sync_step += 1 + behind
        if any(reply.stop for reply in replies):  # the run's last step (``shard.py``)
            raise Halted()
        return behind

    def send_elastic(self, op):
        if self.compressed:
            centre = np.empty_like(self.work)
            self._read(centre)
            wire, _ = self.elastic_difference(centre, op.alpha, packed=True)
            versions = self._get([sh.difference.remote(part)
                                  for sh, part in zip(self.shards, self._per_shard(wire))])
        else:
            moves = self._get([sh.elastic.remote(self.rank, op.alpha, self.work[a:b])
                               for sh, (a, b) in zip(self.shards, self.bounds)])
            for (a, b), (d, _) in zip(self.bounds, moves):
                self.work[a:b] -= d
            versions = [version for _, version in moves]
        self.counts["updates"] += 1  # one exchange, one update (the local engine's send_elastic)
        # its staleness: its stalest shard's (``server/elastic.py``)
        self.staleness[max(self.exchanged(s, v) for s, v in enumerate(versions))] += 1


class RayClock(WorkerClock):
    """SSP's ops on a Ray worker: the table is the clock server's; a tick
    settles the clock's pushes first."""

    def __init__(self, worker: RemoteWorker, server):
        super().__init__(worker.fetch, worker.gradient)
        self.worker, self.server = worker, server

    def floor(self) -> int:
        return self.worker._get(self.server.floor.remote())

    def publish(self, bound):
        import ray

        self.worker._settle_pushes()  # this clock's updates are in before its tick
        # the server raises after the run's timeout; this wait only backs it up
        return self.timed(lambda: ray.get(self.server.tick.remote(self.worker.rank, bound),
                                          timeout=2 * self.worker.timeout + 5))

    def retire(self):
        self.worker._get(self.server.retire.remote(self.worker.rank))

"""A worker's interpreter of its strategy's ops, written once for every engine.

A strategy's worker loop is a generator of ops (``strategies/ops.py``).
``Worker.advance`` sends each op to its handler (``handlers``: one dict
lookup and one call an op, as the local engine's hot path needs,
``bench/seed_overhead.py``) and the handler's result back into the
program, until the program ends (True) or a handler returns ``WAIT``: the
op's result comes later (the sim's event on its virtual clock, Spark's next
segment), and ``advance(result)`` goes on from there (False).

The handlers that need no transport are here, the same on every engine:
``Gradient`` (the problem's mean loss and gradient at the working
parameters ``work``, times the op's weight; counted in ``count_gradient``),
``LocalStep`` (work -= lr grad) and ``LocalApply`` (the inner rule's step
with this worker's private state, ``core.LocalUpdate``; a non-finite
gradient is not applied; each local step is counted in ``count_local``:
``local_updates`` and ``dropped_local_updates``, a unit of their own). An
engine subclasses ``Worker`` and adds the ops that travel (Apply, Fetch,
Push, AllReduce, Average, Elastic, Clock): how a message reaches the server
or the other workers is all it brings (``push``, ``drift``, ``elastic``
(``elastic.py``) and ``restart`` are their worker's side).
``report`` is what a worker sends its driver at the end (``RunTally.add``).

A pushing program's gradients (Downpour, SSP) count their examples when the
push that carries them is made (``hold``, then ``release`` in ``push``): a
worker that stops with an accrued, unpushed sum (``n_push`` > 1) has not
counted those batches, so the resumed run computes them again, and its push
periods and totals are those of an uninterrupted run (pushing the partial
sum would add a short update no uninterrupted run makes).

``halt``: where another party (the local engine's monitor; Ray's driver)
can end the run: ``halt[0]`` set, ``halted()`` raises (``Halted``) before
the worker's next op, unless that op lands a gradient already computed
(``LANDING``: Apply, Push, LocalStep, LocalApply, EASGD's Elastic, and
SSP's Clock, which ends the push period): a halted worker stops between
batches with every batch it counted applied, so a checkpoint's positions
skip no batch whose update is missing (a Clock's wait leaves on the halt).
A program that fails or is halted is closed. An op the engine does not
carry out raises ConfigError (``Engine.check`` refuses such a strategy
before the run; this is the backstop).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from .. import arrays
from ..errors import ConfigError
from ..strategies.ops import (AllReduce, Apply, Average, Clock, Elastic, Fetch, Gradient,
                              LocalApply, LocalStep, Push, SGDPass, weighted)
from .core import LocalUpdate
from .elastic import exchange
from .reduce import finite

WAIT = object()  # a handler's result: the op's own result comes later (``advance``)


class Halted(Exception):
    """The worker stops where its driver asked it to (``halt``, or a
    synchronous step the server says is the last): its program is closed,
    and what it counted stands."""


OPS = (Gradient, Apply, Fetch, Push, Clock, LocalStep, AllReduce, Average, LocalApply, Elastic,
       SGDPass)
LANDING = frozenset({Apply, Push, LocalStep, LocalApply, Elastic, Clock})  # a halt waits for them


class Worker:
    # slots: the sim runs tens of thousands of workers (its subclass has slots too)
    __slots__ = ("rank", "problem", "strategy", "work", "program", "local_rule", "handlers",
                 "held", "met")
    engine_name = "this"  # in ``cannot``'s error
    halt = (0,)           # never set: see the module docstring
    sender = None         # the engine's ``messages.Sender``, where it reports traffic
    ssp = None            # SSP's clock (``clocks.py``), where the program has one

    def __init__(self, rank: int, problem, strategy, work, local_rule=None):
        self.rank, self.problem, self.strategy, self.work = rank, problem, strategy, work
        self.program = None
        # the inner rule with this worker's own state (local SGD, EASGD)
        self.local_rule = LocalUpdate(strategy.local_rule, rank) if local_rule is None \
            else local_rule
        self.handlers = dict.fromkeys(OPS, self.cannot)
        self.handlers.update({Gradient: self.gradient, LocalStep: self.local_step,
                              LocalApply: self.local_apply, Elastic: self.elastic})
        # the examples of the gradients computed since the last push (None: the
        # program pushes nothing, and a gradient counts when it is computed)
        self.held = 0 if Push in strategy.uses else None
        # the server's versions (a shard's each) this worker last took (``took_centre``)
        self.met = None

    def advance(self, result=None, between_ops=None) -> bool:
        """Carry out ``program``'s ops from where it waits (``result``: what
        its last op returned) until it ends (True) or a handler returns
        ``WAIT`` (False). ``between_ops()``, where given, runs after each op."""
        handlers, halt, program, wait = self.handlers, self.halt, self.program, WAIT
        try:
            while True:
                op = program.send(result)
                if halt[0] and type(op) not in LANDING:
                    self.halted()
                result = handlers[type(op)](op)
                if result is wait:
                    return False
                if between_ops is not None:
                    between_ops()
        except StopIteration:
            return True
        except BaseException:
            program.close()
            raise

    def halted(self) -> None:
        raise Halted()

    def cannot(self, op):
        raise ConfigError(f"the {self.engine_name} engine cannot carry out {type(op).__name__} "
                          f"({self.strategy.name})")

    # -- the handlers every engine shares -------------------------------------------
    def gradient(self, op):
        problem = self.problem
        if op.next is not None and problem.prefetch is not None:
            problem.prefetch(op.next)  # a Dataset problem loads it while this one computes
        loss, grad = problem.gradient(self.work, op.indices)
        self.count_gradient(self.hold(len(op.indices)), loss)
        return loss, weighted(grad, op.weight)

    def local_step(self, op) -> None:
        self.work -= op.lr * op.grad

    def local_apply(self, op) -> None:
        self.count_local(self.local_rule(self.work, op.grad))

    def push(self, op):
        """A Push's worker side, the same on every engine that talks to a
        server: the examples of the gradients it carries are counted before
        it travels (``release``, ``count_examples``: a racing read never holds
        an update whose batches are not counted, the snapshot's order,
        ``monitor.snapshot``); a gradient that is not finite is dropped here,
        whole (``admits``; ``count_dropped``), never sent; else
        ``send_push``, the engine's transport, carries it to the server's
        shards, and its result is the op's."""
        grad = op.grad
        self.count_examples(self.release())
        if not self.admits(grad):
            self.count_dropped()
            return None
        return self.send_push(grad, op.ticket)

    def send_push(self, grad, ticket):
        """The engine's transport of a finite push (``push``), read at ``ticket``."""
        return self.cannot(Push(grad, ticket))

    def admits(self, grad) -> bool:
        """Whether a push's gradient is sent: it is finite (an engine whose
        server core is at hand asks it, ``ServerCore.admits``, which also
        counts the drop and tells the rule)."""
        return finite(grad)

    def drift(self, centre, slot, sums=None, sum_slots=None) -> None:
        """An ``Average``'s contribution: the drift ``centre - work`` written
        into ``slot`` as it reaches the others (through ``sender``, where
        there is one: a compressed drift decoded), and where the inner
        rule's sums are shared (``sums``: ``summed.SharedSums``) what this
        worker's steps added to them into its rows of ``sum_slots``, their
        traffic counted."""
        arrays.namespace(slot).subtract(centre, self.work, out=slot)
        if self.sender is not None:
            sent = self.sender.send(slot)
            if sent is not slot:
                arrays.copyto(slot, sent)
        if sums is not None:
            sums.added(self.local_rule, self.work, [s[self.rank] for s in sum_slots])
            sums.count(self.sender)

    def elastic(self, op):
        """An ``Elastic``'s worker side, the same on every engine: its
        engine's exchange where the private copy is finite, else the
        exchange dropped and the copy restarted from the centre
        (``elastic.exchange``: the centre is always finite)."""
        return exchange(self, op)

    def send_elastic(self, op):
        """The engine's transport of an exchange whose copy is finite
        (``elastic``)."""
        return self.cannot(op)

    def skip_elastic(self, op):
        """A dropped exchange (``elastic``): the worker restarts from the
        centre, read as its program's first Fetch read it. An engine whose
        exchange the other workers wait on replaces it."""
        return self.handlers[Fetch](Fetch())

    def took_centre(self, ticket) -> None:
        """The worker read the server's parameters at ``ticket`` (a Fetch's:
        a version a shard, an array the fetch made for it): EASGD's copy
        takes the centre there, at its start and at a restart, and its
        exchanges' staleness counts from it (``exchanged``)."""
        self.met = ticket

    def exchanged(self, s: int, version: int) -> int:
        """This worker's exchange lands on shard ``s`` at the shard's
        ``version`` (before it): its staleness there, the other workers'
        exchanges since this copy last met the centre (``elastic.py``);
        the copy meets it again at ``version + 1``."""
        if self.met is None:  # no Fetch before it: counted from version 0
            self.met = defaultdict(int)
        staleness = version - int(self.met[s])
        self.met[s] = version + 1
        return staleness

    def elastic_difference(self, centre, alpha: float, packed: bool = False) -> tuple:
        """EASGD's exchange with the difference compressed (Zhang et al.'s
        asynchronous exchange): D = C(alpha (x_i - centre) + e) leaves
        through ``sender`` and x_i -= D; the centre then takes x~ += D.
        Returns (D's wire form where ``packed``, else None; D decoded)."""
        v = alpha * (self.work - centre)
        wire, sent = self.sender.exchange(v) if packed else (None, self.sender.send(v))
        self.work -= sent
        return wire, sent

    def restart(self, params, sums=None) -> None:
        """After a synchronous step: a private copy restarts from the step's
        parameters ``params``, and the inner rule's sums from the shared ones
        (``sums``: ``summed.SharedSums``, where there are)."""
        if not self.strategy.shared_params:
            arrays.copyto(self.work, params)
        if sums is not None:
            sums.start(self.local_rule, self.work)

    # -- what an engine counts ------------------------------------------------------
    def hold(self, examples: int) -> int:
        """Of a gradient's ``examples``, those to count now: all of them,
        unless the program pushes, whose gradients count when pushed (the
        module docstring); those are held until ``release``."""
        if self.held is None:
            return examples
        self.held += examples
        return 0

    def release(self) -> int:
        """The examples of the gradients a push carries (those held since the
        last push), to count now, before the push lands, so that a racing
        read of the parameters never holds an update whose batches are not
        counted."""
        held, self.held = self.held, 0
        return held

    def count_examples(self, examples: int) -> None:
        """The examples of the gradients a push carries (``release``)."""

    def count_dropped(self) -> None:
        """A gradient dropped at the worker, not finite (``push``)."""

    def count_gradient(self, examples: int, loss) -> None:
        """A gradient over ``examples`` examples with mean loss ``loss``."""

    def count_local(self, applied: bool) -> None:
        """A local step on this worker's own copy (``LocalApply``): applied,
        or dropped (its gradient was not finite)."""

    # -- the end of the run ---------------------------------------------------------
    def report(self, own_params: bool = True, **figures) -> dict:
        """The worker's end-of-run report, as ``RunTally.add`` reads it: the
        ``figures`` its engine counts on the worker (any of staleness,
        examples, dropped, late), a copy of its private parameters (None where
        it shares the server's, or not ``own_params``), its problem's state,
        its traffic (``Sender.stats``) and SSP's clock report (None: no clock)."""
        own = own_params and not self.strategy.shared_params
        return {**figures,
                "params": np.array(arrays.to_host(self.work), copy=True) if own else None,
                "state": self.problem.state(), "traffic": self.sender.stats(),
                "clocks": self.ssp.report() if self.ssp is not None else None}

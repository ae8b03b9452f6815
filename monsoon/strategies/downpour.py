"""Asynchronous SGD with a parameter server: Downpour (Dean et al., NIPS 2012).

Worker loop, each worker on its own data shard (step counts from 0):

    if step % n_fetch == 0:  w_local = fetch()     # a read ticket: shard versions
    g = gradient(w_local, next mini-batch)
    accrued += g;  w_local -= lr * g                # local step between fetches
    after every n_push gradients:  push(accrued); accrued = 0

The local step is plain SGD at the run's initial --lr (``local_lr``),
whatever the rule and its schedule, which run on the server alone; none is
taken with n_fetch = 1. The paper's appendix pushes where step % n_push ==
0, so its first push carries one gradient and each later one comes a step
after this loop's; here every push carries n_push gradients.

The server is split into shards, each with its own lock, version and rule
state; a push is applied shard by shard the moment it arrives, so shards do
not see updates in the same order. The staleness of a push to a shard is
(shard version at push) - (shard version at the fetch the gradient was
computed on), and every one is recorded.

Where workers wait: only on a shard's lock for the length of one update.
A worker that fails does not stop the others. The paper ran n_fetch =
n_push = 1 (the defaults) and AdaGrad on the server (``--rule adagrad``).
Invariant: with one worker and n_fetch = n_push = 1, this is serial SGD.
A subclass adds ops after each push, and reads before a step, through
three hooks (``_exchange_state``, ``_fetched``, ``_pushed``): SSP's clock.
"""
import numpy as np

from ..errors import ConfigError
from ..options import Option, at_least
from .base import SHARD, Strategy, WorkerJob
from .batches import lookahead, part_bounds, shard_batches, skip, tail_weight
from .ops import Fetch, Gradient, LocalStep, Push


class Downpour(Strategy):
    name = "async"
    draws = SHARD
    shared_params = False
    uses = (Fetch, Gradient, Push, LocalStep)
    period, period_options = "n_push", ("n_push", "n_fetch")
    options = (
        Option("n_fetch", int, 1, "steps between fetches of the parameters (between them, "
               "plain sgd steps at --lr on the worker's copy)", check=at_least(1)),
        Option("n_push", int, 1, "steps between pushes of the accrued gradient",
               check=at_least(1)),
    )

    @classmethod
    def from_options(cls, run, rule, n_fetch=1, n_push=1):
        # between fetches a worker steps its own copy at the run's rate
        return cls(n_fetch, n_push, local_lr=run.lr if n_fetch > 1 else 0.0), rule

    def __init__(self, n_fetch: int = 1, n_push: int = 1, local_lr: float = 0.0):
        if n_fetch < 1 or n_push < 1:
            raise ConfigError(f"n_fetch and n_push must be at least 1 (got {n_fetch}, {n_push})")
        self.n_fetch = n_fetch
        self.n_push = n_push
        self.local_lr = local_lr

    def set_period(self, steps: int, lr: float) -> None:
        """Push and fetch every ``steps`` steps, stepping the copy at ``lr``
        between fetches (as ``--n-fetch N --n-push N`` does)."""
        self.n_push = self.n_fetch = steps
        self.local_lr = lr if steps > 1 else 0.0

    def program(self, job: WorkerJob):
        accrued = None
        pending = 0
        ticket = None
        refetch = False  # the copy held must be read again before the next step (SSP)
        ex = self._exchange_state()
        batches = skip(shard_batches(job.n_examples, job.batch_size, job.seed, job.budget,
                                     job.rank, job.workers), job.start_step)
        start, stop = part_bounds(job.n_examples, job.workers, job.rank)  # the shard's rows
        for step, (batch, following) in enumerate(lookahead(batches), start=job.start_step):
            if ticket is None or refetch or step % self.n_fetch == 0:  # (resumed: at once)
                ticket = yield Fetch()
                refetch = False
                self._fetched(ex)
            _, grad = yield Gradient(batch, following,
                                     tail_weight(len(batch), job.batch_size, stop - start))
            pushed = False
            if self.n_push == 1:
                yield Push(grad, ticket)
                pushed = True
            else:
                if accrued is None:
                    accrued = np.zeros_like(grad)
                accrued += grad
                pending += 1
                if pending == self.n_push:
                    yield Push(accrued, ticket)
                    accrued.fill(0)
                    pending = 0
                    pushed = True
            if pushed:
                refetch = yield from self._pushed(ex)
            if self.local_lr > 0 and (step + 1) % self.n_fetch != 0 and not refetch:
                yield LocalStep(grad, self.local_lr)
        if pending:
            yield Push(accrued, ticket)

    # -- hooks for a subclass that exchanges more than pushes (SSP's clock) -----------
    def _exchange_state(self):
        """Per-program state the hooks share (None: Downpour keeps none)."""
        return None

    def _fetched(self, ex) -> None:
        """Called after each read of the server."""

    def _pushed(self, ex):
        """Ops after each push (a generator); returns whether the copy held
        must be read again before the next step. Downpour: none, no."""
        return False
        yield  # never reached: it makes this a generator

    def describe(self):
        return {"strategy": self.name, "n_fetch": self.n_fetch, "n_push": self.n_push,
                "local_lr": self.local_lr}

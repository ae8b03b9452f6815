"""Elastic averaging SGD (Zhang, Choromanska, LeCun, NIPS 2015), the
asynchronous form of the authors' code.

Each worker i keeps its own parameters x_i and runs local steps of the inner
rule on its own data shard. Every tau steps it exchanges with the centre x~
(the server's parameters), shard by shard under the shard's lock:

    d = alpha (x_i - x~);   x~ += d;   x_i -= d

an elastic force that pulls the workers and the centre towards each other
(alpha = eta rho in the paper's notation). A worker whose steps run out
between two exchanges makes one more (a shorter last period, as local SGD's
last round), so no local step is lost; one resumed with no steps left made
it before it stopped (an Elastic lands before a halt). The centre is the
result. With alpha = 0 the workers never interact (a test), and the centre
stays put.
Workers wait only on a shard's lock; a failed worker does not stop the rest.
"""
from ..errors import ConfigError
from ..options import Option, at_least, in_range
from .base import SHARD, Strategy, WorkerJob
from .batches import lookahead, part_bounds, shard_batches, skip, tail_weight
from .ops import Elastic, Fetch, Gradient, LocalApply


class EASGD(Strategy):
    name = "easgd"
    draws = SHARD
    shared_params = False
    uses = (Fetch, Gradient, LocalApply, Elastic)
    period, period_options = "tau", ("easgd_tau",)
    options = (
        Option("easgd_alpha", float, None, "elastic force (default 0.9 / workers)",
               check=in_range(0, 1)),
        Option("easgd_tau", int, 4, "steps between exchanges with the centre",
               check=at_least(1)),
    )

    @classmethod
    def from_options(cls, run, rule, easgd_alpha=None, easgd_tau=4):
        """Workers apply ``rule``; the server moves the centre by the
        elastic differences (sgd at lr 1). alpha defaults to the paper's
        beta = 0.9 shared by the workers."""
        from ..rules import make_rule

        alpha = 0.9 / run.workers if easgd_alpha is None else easgd_alpha
        return cls(local_rule=rule, alpha=alpha, tau=easgd_tau), make_rule("sgd", 1.0)

    def __init__(self, local_rule=None, alpha: float = 0.1, tau: int = 4):
        if not 0 <= alpha <= 1:
            raise ConfigError(f"easgd alpha must be in [0, 1], got {alpha}")
        if tau < 1:
            raise ConfigError(f"easgd tau must be at least 1, got {tau}")
        self.local_rule = local_rule
        self.alpha = alpha
        self.tau = tau

    def program(self, job: WorkerJob):
        yield Fetch()  # x_i starts at the centre (resumed: at its checkpoint's copy)
        batches = skip(shard_batches(job.n_examples, job.batch_size, job.seed, job.budget,
                                     job.rank, job.workers), job.start_step)
        start, stop = part_bounds(job.n_examples, job.workers, job.rank)  # the shard's rows
        since = 0  # local steps since this run's last exchange
        for step, (batch, following) in enumerate(lookahead(batches), start=job.start_step + 1):
            _, grad = yield Gradient(batch, following,
                                     tail_weight(len(batch), job.batch_size, stop - start))
            yield LocalApply(grad)
            since += 1
            if step % self.tau == 0:
                yield Elastic(self.alpha)
                since = 0
        if since:  # a shorter last period: its steps reach the centre too
            yield Elastic(self.alpha)

    def describe(self):
        return {"strategy": self.name, "alpha": self.alpha, "tau": self.tau,
                "local_rule": self.local_rule.describe() if self.local_rule else None}

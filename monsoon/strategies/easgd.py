"""Elastic averaging SGD (Zhang, Choromanska, LeCun, NIPS 2015), the
asynchronous form of the authors' code.

Each worker i keeps its own parameters x_i and runs local steps of the inner
rule on its own data shard. Every tau steps it exchanges with the centre x~
(the server's parameters), shard by shard under the shard's lock:

    d = alpha (x_i - x~);   x~ += d;   x_i -= d

an elastic force that pulls the workers and the centre towards each other
(alpha = eta rho in the paper's notation). The centre is the result. With
alpha = 0 the workers never interact (a test), and the centre stays put.
Workers wait only on a shard's lock; a failed worker does not stop the rest.
"""
from ..errors import ConfigError
from .base import Strategy, WorkerJob
from .batches import shard_batches
from .ops import Elastic, Fetch, Gradient, LocalApply


class EASGD(Strategy):
    name = "easgd"
    shared_params = False

    def __init__(self, local_rule=None, alpha: float = 0.1, tau: int = 4):
        if not 0 <= alpha <= 1:
            raise ConfigError(f"easgd alpha must be in [0, 1], got {alpha}")
        if tau < 1:
            raise ConfigError(f"easgd tau must be at least 1, got {tau}")
        self.local_rule = local_rule
        self.alpha = alpha
        self.tau = tau

    def program(self, job: WorkerJob):
        yield Fetch()  # x_i starts at the centre
        batches = shard_batches(job.n_examples, job.batch_size, job.seed, job.budget,
                                job.rank, job.workers)
        for step, batch in enumerate(batches, start=1):
            _, grad = yield Gradient(batch)
            yield LocalApply(grad)
            if step % self.tau == 0:
                yield Elastic(self.alpha)

    def describe(self):
        return {"strategy": self.name, "alpha": self.alpha, "tau": self.tau,
                "local_rule": self.local_rule.describe() if self.local_rule else None}

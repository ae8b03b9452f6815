"""Hogwild! (Niu, Recht, Ré, Wright, NIPS 2011): lock-free SGD on shared memory.

Every worker repeatedly takes a mini-batch, computes its gradient at the
shared parameters as they are at that moment, and applies the rule to the
shared parameters in place, with no lock at all. Each epoch, one random
permutation of the examples is cut into contiguous slices, one per worker,
as in the paper's experiments.

What races, on purpose: a worker's read of the parameters may interleave
with other workers' writes, and two writes to one coordinate may lose one of
them. On sparse problems collisions are rare; on dense ones the method still
converges at small step sizes but gains less (the theory's rho and Delta).

On problems with a compiled per-example loop (sparse linear models), each
worker runs its whole slice of an epoch in one call (``SGDPass``), and the
step size is multiplied by ``beta`` (0.9) after every epoch, as in the
paper's experiments; a ``--beta`` given where that loop does not run is
refused (``config``). The epoch's order there is a random order of blocks of
512 consecutive rows (``block_permutation``) of data the problem shuffled
once, so memory is read sequentially.

Invariant: with one worker, Hogwild! IS serial SGD, update for update.
"""
from ..options import Option, in_range
from .base import SLICE, SHARED_MEMORY, Strategy, WorkerJob
from .batches import (block_permutation, lookahead, part_bounds, skip, slice_batches, split,
                      tail_weight)
from .ops import Apply, Gradient, SGDPass


BETA = Option("hogwild_beta", float, 0.9, "the compiled per-example loop's step size factor "
              "per epoch (sparse problems; refused where that loop does not run)",
              flag="--beta", label="beta", check=in_range(0, 1, low_open=True))


class Hogwild(Strategy):
    name = "hogwild"
    draws = SLICE
    shared_params = True
    options = (BETA,)
    uses = (Gradient, Apply)
    per_example_loop = True  # with job.kernel, one SGDPass per epoch instead

    def needs(self, workers):
        return {SHARED_MEMORY} if workers > 1 else set()

    @classmethod
    def from_options(cls, run, rule, hogwild_beta=0.9):
        return cls(beta=hogwild_beta), rule

    def __init__(self, beta: float = 0.9):
        self.beta = beta

    def program(self, job: WorkerJob):
        if job.kernel:  # start_step: epochs already done (a resumed run)
            for epoch in range(job.start_step, job.budget.epochs):
                mine = split(block_permutation(job.n_examples, job.seed, epoch), job.workers,
                             job.rank)
                yield SGDPass(mine, self.beta ** epoch)
            return
        start, stop = part_bounds(job.n_examples, job.workers, job.rank)
        for batch, following in lookahead(skip(slice_batches(job.n_examples, job.batch_size,
                                                             job.seed, job.budget, job.rank,
                                                             job.workers), job.start_step)):
            weight = tail_weight(len(batch), job.batch_size, stop - start)
            loss, grad = yield Gradient(batch, following, weight)
            yield Apply(grad, loss)

    def describe(self):
        return {"strategy": self.name, "beta": self.beta}

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

Invariant: with one worker, Hogwild! IS serial SGD, update for update.
"""
from .base import Strategy, WorkerJob
from .batches import slice_batches
from .ops import Apply, Gradient


class Hogwild(Strategy):
    name = "hogwild"
    shared_params = True

    def program(self, job: WorkerJob):
        for batch in slice_batches(job.n_examples, job.batch_size, job.seed, job.budget,
                                   job.rank, job.workers):
            _, grad = yield Gradient(batch)
            yield Apply(grad)

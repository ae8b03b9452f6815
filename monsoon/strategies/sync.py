"""Synchronous data-parallel SGD (seeds 000 and 001; TensorFlow's towers).

Each step, the global batch B is split into N contiguous shards whose sizes
differ by at most one; worker k computes the mean gradient g_k of its n_k
examples, and the step applies the rule ONCE to

    g = sum_k (n_k / |B|) g_k

which is the full-batch mean gradient, exact up to floating-point reduction
order. Every worker reads the same parameters at every step.

Where workers wait: once per step, in ``AllReduce``, for all N
contributions. A worker that fails stalls the others, so the engine fails the
run fast with that worker's error.

Invariants (each has a test): with N workers the parameters equal
``serial``'s (1e-9 relative, float64); with 1 worker they are bit-identical;
a seed makes runs bit-reproducible (the reduction is done in rank order).
"""
from ..errors import ConfigError
from .base import Strategy, WorkerJob
from .batches import global_batches, split
from .ops import AllReduce, Gradient


class Sync(Strategy):
    name = "sync"
    shared_params = True
    needs_all_workers = True

    def program(self, job: WorkerJob):
        for batch in global_batches(job.n_examples, job.batch_size, job.seed, job.budget):
            mine = split(batch, job.workers, job.rank)
            if len(mine) == 0:
                yield AllReduce(None, 0.0)
                continue
            _, grad = yield Gradient(mine)
            yield AllReduce(grad, len(mine) / len(batch))

    def validate(self, workers, batch_size, n_examples):
        super().validate(workers, batch_size, n_examples)
        if batch_size < workers:
            raise ConfigError(f"sync splits each batch among the workers: batch size {batch_size} "
                              f"is smaller than {workers} workers; use --batch-size {workers} or more")

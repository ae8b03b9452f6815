"""Synchronous data-parallel SGD (seeds 000 and 001; TensorFlow's towers).

Each step, the global batch B is split into N contiguous shards whose sizes
differ by at most one; worker k computes the mean gradient g_k of its n_k
examples, and the step applies the rule ONCE to

    g = sum_k (n_k / |B|) g_k

which is the full-batch mean gradient, exact up to floating-point reduction
order. Every worker reads the same parameters at every step.

Where workers wait: once per step, in ``AllReduce``, for the contributions.
A worker that fails stalls the others, so the engine fails the run fast with
that worker's error.

Backup workers (Chen, Pan, Monga, Bengio, Jozefowicz 2016; TensorFlow's
``SyncReplicasOptimizer(replicas_to_aggregate=N, total_num_replicas=N+b)``):
N + b workers each compute their slice of the batch at w_t; the first N to
arrive are averaged (weighted by their examples) and the b late ones are
dropped and counted in ``late_gradients``. A late worker joins the next
step; one that arrived after its step was applied (slower than a whole
step) skips to the current step. A step no longer waits for the slowest worker, and up to b
failed workers are covered.

Elastic sync (``--elastic``; Horovod Elastic's model, Sergeev & Del Balso
2018): when a worker is lost, the step carries on with the workers left,
which split the SAME global batch among themselves, so each step is still
the full-batch mean gradient; a worker that comes back takes part from a
step boundary on, with the parameters of that step. The engine tells a
worker of a change by returning ``Regroup(members)`` from ``AllReduce``;
the worker then computes its part of the batch among ``members`` and
contributes again (the step is applied once, on the regrouped parts).

Invariants (each has a test): with N workers the parameters equal
``serial``'s (1e-9 relative, float64); with 1 worker they are bit-identical;
a seed makes runs bit-reproducible (the reduction is done in rank order).
"""
from ..errors import ConfigError
from ..options import Option
from .base import BACKUP_WORKERS, ELASTIC, Strategy, WorkerJob
from .batches import global_batches, lookahead, part_bounds, skip, tail_weight
from .ops import AllReduce, Gradient, Regroup


class Sync(Strategy):
    name = "sync"
    shared_params = True
    needs_all_workers = True
    synchronous = True
    buffers = "rank0"   # DDP's broadcast_buffers: every replica holds rank 0's
    uses = (Gradient, AllReduce)
    full_batch_steps = True
    options = (Option("backup_workers", int, 0, "extra workers; each step takes the first "
                      "--workers gradients", check=lambda v: None if v >= 0 else "0 or more"),
               Option("elastic", bool, False, "carry on with the workers left when one is "
                      "lost (the same batch split among them), and take one back when its "
                      "node returns (ray engine)"))

    def __init__(self, backup_workers: int = 0, elastic: bool = False):
        if backup_workers < 0:
            raise ConfigError(f"backup workers must be 0 or more, got {backup_workers}")
        if elastic and backup_workers:
            raise ConfigError("--elastic and --backup-workers both cover a lost worker; "
                              "choose one")
        self.backup_workers = backup_workers
        self.elastic = elastic
        self.needs_all_workers = not elastic

    def program(self, job: WorkerJob):
        batches = skip(global_batches(job.n_examples, job.batch_size, job.seed, job.budget),
                       job.start_step)  # resumed from a checkpoint
        # This worker's (start, stop) in a batch of each length (only an
        # epoch's last batch can be shorter): seed 001's steps are so short
        # (bench/seed_overhead.py) that even split()'s arithmetic, done every
        # step, showed.
        parts = {}
        count, index = job.workers, job.rank
        if job.members is not None:  # elastic: a worker that joined a running step
            count, index = len(job.members), job.members.index(job.rank)
        batches = lookahead(batches)
        for batch, following in batches:
            size = len(batch)
            while True:
                start, stop = parts.get(size) or parts.setdefault(
                    size, part_bounds(size, count, index))
                if start == stop:
                    behind = yield AllReduce(None, 0)
                else:
                    hint = following
                    if hint is not None:
                        a, b = parts.get(len(hint)) or parts.setdefault(
                            len(hint), part_bounds(len(hint), count, index))
                        hint = hint[a:b]
                    _, grad = yield Gradient(batch[start:stop], hint,
                                             tail_weight(size, job.batch_size, job.n_examples))
                    behind = yield AllReduce(grad, stop - start)
                if type(behind) is not Regroup:
                    break
                if job.rank not in behind.members:
                    return  # no longer one of the step's workers
                count, index, parts = len(behind.members), behind.members.index(job.rank), {}
            if behind:
                for _ in range(behind):  # steps the others completed without us
                    next(batches, None)

    def needs(self, workers):
        return ({BACKUP_WORKERS} if self.backup_workers else set()) | (
            {ELASTIC} if self.elastic else set())

    @property
    def raw_gradients(self) -> bool:
        """Each Gradient's result goes to AllReduce unchanged, so an engine
        may reduce it while it is computed (DDP-style buckets). A subclass
        with its own program (one that clips, say) does not promise it."""
        return type(self).program is Sync.program

    def describe(self):
        return {"strategy": self.name, "backup_workers": self.backup_workers,
                "elastic": self.elastic}

    def validate(self, workers, batch_size, n_examples):
        if self.backup_workers >= workers:
            raise ConfigError(f"{self.backup_workers} backup workers leave none of the {workers} "
                              "workers to count; use fewer --backup-workers")
        super().validate(workers, batch_size, n_examples)
        if batch_size < workers:
            raise ConfigError(f"sync splits each batch among the workers: batch size {batch_size} "
                              f"is smaller than {workers} workers; use --batch-size {workers} or more")

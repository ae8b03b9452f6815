"""The Strategy protocol: the communication pattern, written once.

A strategy says who computes which gradient on which copy of the
parameters, and when the rule runs. Its ``program(job)`` is a generator
yielding the ops of ``ops.py``; an engine runs one program per worker.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .batches import Budget, chunk_sizes, part_bounds

# What a strategy may need of an engine beyond its ops (``Strategy.needs``);
# engines declare the ones they meet (``engines/base.py``).
SHARED_MEMORY = "shared memory"    # several workers update one parameter array in place
BACKUP_WORKERS = "backup workers"  # a step takes the first N of N + b contributions
STAGES = "pipeline stages"         # stage workers passing activations to each other
ELASTIC = "elastic membership"     # a synchronous step regroups when a worker is lost or joins

# How a program draws its data (``Strategy.draws``; ``batches.py``).
GLOBAL, SHARD, SLICE = "global batch", "own shard", "epoch slice"


@dataclass(frozen=True)
class WorkerJob:
    """What one worker is told: who it is and what data budget it has."""
    rank: int
    workers: int
    n_examples: int
    batch_size: int
    seed: int
    budget: Budget
    start_step: int = 0   # steps already done (a resumed run skips their batches)
    members: tuple | None = None  # elastic sync: the ranks sharing each batch (None: all)
    kernel: bool = False  # the problem has a compiled per-example SGD loop the engine can run
    # a resumed run: the synchronous steps (local SGD's averages) its checkpoint applied,
    # updates and dropped ones (None: not told)
    synced: int | None = None


@dataclass(frozen=True)
class RunInfo:
    """What a component may need to know about the run it is built for."""
    workers: int
    lr: float
    out: str | None = None
    problem: object = None
    device: str = "cpu"   # the --device asked for (cpu, cuda, cuda:N, auto)
    cli: bool = True      # options from the command line (refusals name flags), else Python


class Strategy:
    name = "strategy"
    cli = True  # its options came from the command line, else from Python (resolve sets it)
    # The op classes (``ops.py``) this strategy's program yields: an engine
    # takes the strategy only if it carries out every one (engines/base.py).
    uses: tuple = ()
    # True: given ``job.kernel`` (an engine that runs the problem's compiled
    # loop), the program yields one ``SGDPass`` per epoch instead of batches.
    per_example_loop = False
    # The options this strategy takes (``monsoon.options.Option``); their
    # values reach ``from_options`` by name.
    options: tuple = ()
    # True: the strategy always runs exactly one worker (the command line and
    # ``compare`` then ignore --workers for it).
    single_worker = False
    # True: workers compute on the server's parameters themselves (no Fetch);
    # False: each worker computes on a private copy that Fetch refreshes.
    shared_params = True
    # True: the worker loop contains a barrier (AllReduce): one lost worker
    # stalls the rest, so the engine fails fast instead of carrying on.
    needs_all_workers = False
    # True: the program uses AllReduce or Average (the engine keeps gradient slots).
    synchronous = False
    # Synchronous strategies: how many of the workers are spares (the step
    # takes the first workers - backup_workers contributions).
    backup_workers = 0
    # Synchronous strategies: True where the workers sharing a step may
    # change mid-run (a lost worker is regrouped around, ``sync --elastic``).
    elastic = False
    # True: each update is the gradient of a step's whole batch at one point,
    # applied once to the whole vector (serial, sync): a full-batch rule
    # (lbfgs) may run it where the engine hands the rule the step's loss
    # (``Engine.gives_loss``).
    full_batch_steps = False
    # True: each Gradient's result goes to AllReduce unchanged, so an engine
    # may reduce it while it is computed (DDP-style buckets).
    raw_gradients = False
    # Strategies with local steps (local SGD, EASGD): the rule each worker
    # applies to its private copy; the engine's rule then runs on the server.
    local_rule = None
    # How each worker's program draws its examples (``batches.py``): GLOBAL,
    # its part of every global batch (sync, local SGD: every worker
    # takes every step); SHARD, batches of its own fixed shard
    # (``shard_batches``, with its share of a step budget); SLICE, its slice
    # of each epoch's permutation. An engine whose data lives in partitions
    # (spark) runs a SHARD program where its shard is; a GLOBAL one reads
    # every worker's part of each batch from every partition.
    draws = GLOBAL
    # How the workers' buffers (BatchNorm statistics) become the model's:
    # "rank0" or "average" (``problems/buffers.py``).
    buffers = "average"
    # The attribute holding how many steps a worker takes between its
    # exchanges with the server (Downpour's n_push, local SGD's local_steps,
    # EASGD's tau), and the options that set it; None: the strategy has no
    # such period. An engine whose exchange is costly (spark: a socket round
    # trip each, or a Spark job a local-sgd round)
    # sizes it where none of ``period_options`` was given (``set_period``).
    period: str | None = None
    period_options: tuple = ()

    @classmethod
    def from_options(cls, run: RunInfo, rule, **values):
        """The strategy and the rule the server applies. Most strategies
        take their options as keyword arguments and apply ``rule`` on the
        server; local SGD and EASGD apply it on each worker instead."""
        return cls(**values), rule

    def needs(self, workers: int) -> set:
        """What an engine must provide for this configuration beyond the
        ops (``engines/base.py``: shared memory, backup workers, stages)."""
        return set()

    def program(self, job: WorkerJob):
        raise NotImplementedError

    def period_steps(self) -> int | None:
        """The steps between exchanges now (``period``), or None."""
        return None if self.period is None else getattr(self, self.period)

    def set_period(self, steps: int, lr: float) -> None:
        """Exchange with the server every ``steps`` steps (``period``); ``lr``:
        the run's rate, for a strategy that steps its own copy between."""
        setattr(self, self.period, steps)

    def largest_batch(self, workers: int, n_examples: int) -> int:
        """The most examples one of its batches can hold: all of them for a
        global batch; the smallest worker's part where each worker draws
        from its own (``SHARD``, ``SLICE``: ``n_examples // workers``)."""
        if self.draws == GLOBAL or not 1 < workers <= n_examples:
            return n_examples
        return n_examples // workers

    def pass_sizes(self, workers: int, batch_size: int, n_examples: int,
                   steps: int | None = None) -> set:
        """The sizes of the example sets one gradient's forward pass takes
        in this strategy's plan (``draws``) over ``n_examples`` with
        ``workers`` programs, for an epoch budget (``steps`` None) or a step
        budget: a GLOBAL plan's batches, each cut among the workers; a SHARD
        or SLICE plan's batches of each worker's part of the data."""
        if self.draws == GLOBAL:
            return {len(range(*part_bounds(size, workers, k)))
                    for size in chunk_sizes(n_examples, batch_size, steps)
                    for k in range(min(workers, size))}
        budget = Budget(steps=steps)
        return set().union(*(chunk_sizes(len(range(*part_bounds(n_examples, workers, k))),
                                         batch_size, budget.steps_for(k, workers))
                             for k in range(workers)))

    def gradients_before(self, job: WorkerJob) -> int:
        """The gradients worker ``job.rank``'s program computed in the
        ``job.start_step`` batches before it (a resumed worker's; a problem
        seeds its random draws by them, ``seed_rng``): one a batch, but for
        those of a global plan where its part was empty, in an epoch's last
        batch with fewer examples than workers."""
        steps, rows, size = job.start_step, job.n_examples, job.batch_size
        tail = rows - (-(-rows // size) - 1) * size  # an epoch's last batch
        if self.draws != GLOBAL or job.rank < tail:
            return steps
        return steps - steps // -(-rows // size)  # one empty part an epoch done

    def validate(self, workers: int, batch_size: int, n_examples: int) -> None:
        if workers > n_examples:
            s = "" if n_examples == 1 else "s"
            raise ConfigError(f"{workers} worker{'' if workers == 1 else 's'} but only "
                              f"{n_examples} training example{s}; use at most {n_examples} "
                              f"worker{s}")

    def preflight(self, problem, workers: int, batch_size: int) -> None:
        """Refuse, in one line (ConfigError), a run this strategy cannot
        carry out on ``problem``, from what can be checked before any
        worker starts or the run folder is touched (``config.resolve``
        calls it). Cheap checks only: nothing is trained here."""

    def describe(self) -> dict:
        return {"strategy": self.name}


def refuse_short_passes(need: int, why: str, fewest, batch_size: int, largest: int,
                        where: str, otherwise: str) -> None:
    """Refuse a plan whose smallest forward pass, ``fewest(batch_size)``,
    holds fewer than ``need`` examples (a model that cannot train on it:
    ``Problem.fewest_rows``'s ``why``), in one line: ``where`` says what
    hands a worker that pass, and the advice names the batch size nearest
    ``batch_size`` (up to ``largest``) whose passes all hold ``need`` or
    more, else says ``otherwise``. The plan is never changed for it."""
    if need < 2 or fewest(batch_size) >= need:
        return
    candidates = sorted(range(1, largest + 1), key=lambda b: (abs(b - batch_size), -b))
    fits = next((b for b in candidates if fewest(b) >= need), None)
    advice = f"use --batch-size {fits}, where every pass takes {need} or more" if fits else otherwise
    raise ConfigError(f"the model cannot train on a forward pass of {fewest(batch_size)} example "
                      f"({why}; torch needs {need} or more in training), and {where}; {advice}")

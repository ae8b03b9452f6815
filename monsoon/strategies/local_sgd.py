"""Local SGD (Stich 2019; Lin et al. 2020) and DiLoCo (Douillard et al. 2023).

Each worker keeps a private copy of the parameters and takes H local steps
with the inner rule (``--rule``, ``--lr``; its state, momentum included,
stays local), each on its slice of the global batch as in ``sync``. Then the
workers synchronise: each contributes its drift Delta_k = theta - theta_k
(theta is the server's parameters since the last round), weighted by the
examples behind it, and the server applies its outer rule to the mean drift:

- local SGD: outer sgd with lr 1, so theta becomes the workers' average;
- DiLoCo: outer Nesterov momentum (lr 0.7, momentum 0.9), which treats the
  mean drift as a gradient. The paper's claim: 8 workers match fully
  synchronous training while communicating 500x less.

Rounds are counted on the global plan: a round ends after every
``local_steps``-th batch. A worker resumed at a round's end whose average
its checkpoint lacks (stopped between the two) makes that average first;
one resumed within a round weighs its drift by its part of the whole
round's batches, as the uninterrupted run does. Workers stopped between
two averages may be batches apart: each resumes at its own batch, with its
private copy, so the resumed run makes the uninterrupted run's averages.

Workers wait once per round, not once per step. Invariant (a test): with
H = 1, the inner rule sgd and the outer sgd at lr 1, local SGD equals
``sync`` (float64, up to rounding: theta - (theta - lr g) is lr g to the
last bit or two); a stateful inner rule (momentum, Adam) keeps each
worker's own state, so it does not.
"""
from ..errors import ConfigError
from ..options import Option, at_least, positive
from .base import Strategy, WorkerJob
from .batches import global_batches, skip, split, tail_weight
from .ops import Average, Gradient, LocalApply


class LocalSGD(Strategy):
    name = "local-sgd"
    shared_params = False
    needs_all_workers = True
    synchronous = True
    uses = (Gradient, LocalApply, Average)
    period, period_options = "local_steps", ("local_steps",)
    options = (
        Option("local_steps", int, 8, "steps between averages", check=at_least(1)),
        Option("diloco", bool, False, "outer Nesterov step on the mean drift (DiLoCo)"),
        Option("outer_lr", float, None, "outer learning rate (default 1, or 0.7 with --diloco)",
               check=positive),
        Option("outer_momentum", float, None, "DiLoCo's outer momentum (default 0.9; with "
               "--diloco only)", check=lambda v: None if 0 <= v < 1 else "in [0, 1)"),
    )

    @classmethod
    def from_options(cls, run, rule, local_steps=8, diloco=False, outer_lr=None,
                     outer_momentum=None):
        """Workers apply ``rule`` to their copies; the server's rule is the
        outer step: plain averaging, or DiLoCo's Nesterov step. An outer
        momentum without DiLoCo would change nothing: refused."""
        from ..rules import make_rule

        if outer_momentum is not None and not diloco:
            named = {o.name: o.named(run.cli) for o in cls.options}
            diloco_on = "--diloco" if run.cli else "diloco=True"
            raise ConfigError(f"{named['outer_momentum']} is DiLoCo's outer momentum: add "
                              f"{diloco_on}, or drop {named['outer_momentum']} (plain "
                              "averaging has none)")
        if diloco:
            outer = make_rule("nesterov", outer_lr or 0.7,
                              momentum=0.9 if outer_momentum is None else outer_momentum)
        else:
            outer = make_rule("sgd", outer_lr or 1.0)
        return cls(local_rule=rule, local_steps=local_steps, diloco=diloco), outer

    def __init__(self, local_rule=None, local_steps: int = 8, diloco: bool = False):
        if local_steps < 1:
            raise ConfigError(f"local steps must be at least 1, got {local_steps}")
        self.local_rule = local_rule
        self.local_steps = local_steps
        self.diloco = diloco

    def program(self, job: WorkerJob):
        batches = skip(global_batches(job.n_examples, job.batch_size, job.seed, job.budget),
                       job.start_step)
        batch = next(batches, None)
        steps, examples = job.start_step, 0
        last = 0 if batch is not None else steps % self.local_steps  # a shorter last round
        if job.synced is not None and job.synced < steps // self.local_steps + bool(last):
            # the round's average, still to make
            yield Average(self.round_examples(job, last or self.local_steps))
        elif batch is not None and steps % self.local_steps:
            # resumed within a round: its part of the round's batches so far
            examples = self.round_examples(job, steps % self.local_steps)
        while batch is not None:
            mine = split(batch, job.workers, job.rank)
            if len(mine):
                _, grad = yield Gradient(mine, None,
                                         tail_weight(len(batch), job.batch_size, job.n_examples))
                yield LocalApply(grad)
                examples += len(mine)
            steps += 1
            batch = next(batches, None)
            if steps % self.local_steps == 0 or batch is None:
                yield Average(examples)  # no backups here: never late
                examples = 0

    def round_examples(self, job: WorkerJob, length: int) -> int:
        """The examples of worker ``job.rank``'s part of the round of
        ``length`` steps that ends at ``job.start_step``: its Average's
        weight."""
        plan = skip(global_batches(job.n_examples, job.batch_size, job.seed, job.budget),
                    job.start_step - length)
        return sum(len(split(next(plan), job.workers, job.rank)) for _ in range(length))

    def validate(self, workers, batch_size, n_examples):
        super().validate(workers, batch_size, n_examples)
        if batch_size < workers:
            raise ConfigError(f"local-sgd splits each batch among the workers: batch size "
                              f"{batch_size} is smaller than {workers} workers")

    def describe(self):
        return {"strategy": self.name, "local_steps": self.local_steps, "diloco": self.diloco,
                "local_rule": self.local_rule.describe() if self.local_rule else None}

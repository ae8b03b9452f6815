"""The ``pipeline`` strategy: model parallelism (GPipe, 1F1B) and 2D.

The model is cut into S stages (``stages.py``), one per worker; each batch
is cut into M micro-batches that flow through the stages in the chosen
schedule (``schedules.py``); each stage accumulates its gradient over the
micro-batches and updates its own parameters once per batch, with its own
rule state (``worker.py``). With ``--workers N`` and ``--pipeline-stages
S`` (S divides N), N / S replicas of the pipeline each take a contiguous
part of every batch, and the gradients of each stage are summed over the
replicas (weighted by examples, as sync does) before the update.

Invariants (tested): the parameters equal serial full-batch SGD's to 1e-9
in float64, for any S, M, schedule and replica count; each worker holds
only its stage's parameters, gradient and rule state.

The worker loop is not a program of the shared ops (it exchanges
activations, not parameters): the strategy needs ``STAGES``, and an engine
that meets it runs the stages with its own runner (``engines/*/pipeline.py``),
from ``layout`` and ``runner.stage_payloads``.
"""
from __future__ import annotations

from ...errors import ConfigError
from ...options import Option, at_least
from ..base import STAGES, Strategy
from ..batches import part_bounds
from .schedules import SCHEDULES

OPTIONS = (
    Option("pipeline_stages", int, None, "stages the model is cut into (default: --workers); "
           "--workers / stages pipeline replicas run side by side", check=at_least(1)),
    Option("micro_batches", int, None, "micro-batches each batch is cut into (default: 4, or "
           "a replica's examples of a batch, where fewer)", check=at_least(1),
           label="micro-batches"),
    Option("schedule", str, "gpipe", "gpipe: all forwards, then all backwards; 1f1b: "
           "PipeDream-Flush, one forward one backward (less activation memory)",
           choices=SCHEDULES),
    Option("cuts", str, None, "layer indices where stages 1, 2, ... start, like 2,4 "
           "(default: balanced by --balance)"),
    Option("balance", str, "params", "how stages are balanced without --cuts: by parameter "
           "count, or by each layer's measured time", choices=("params", "time")),
)


DEFAULT_MICRO_BATCHES = 4


class Pipeline(Strategy):
    name = "pipeline"
    options = OPTIONS
    shared_params = False
    needs_all_workers = True
    uses = ()   # its stages exchange activations, not the shared ops
    buffers = "rank0"   # replica 0's stages' (``runner.finish``), as sync keeps rank 0's

    def needs(self, workers):
        return {STAGES}

    def __init__(self, pipeline_stages=None, micro_batches=None, schedule="gpipe", cuts=None,
                 balance="params"):
        if schedule not in SCHEDULES:
            raise ConfigError(f"unknown schedule {schedule!r}; choose one of: "
                              f"{', '.join(SCHEDULES)} (--schedule)")
        if micro_batches is not None and micro_batches < 1:
            raise ConfigError(f"micro-batches must be at least 1, got {micro_batches}")
        self.pipeline_stages = pipeline_stages
        # a given count is refused where a batch cannot be cut into it
        # (``validate``); the default, DEFAULT_MICRO_BATCHES, is cut to fit
        self.micro_given = micro_batches is not None
        self.micro_batches = micro_batches or DEFAULT_MICRO_BATCHES
        self.schedule = schedule
        self.cuts = cuts
        self.balance = balance
        self.stages_used = self.replicas_used = None

    def stages_for(self, workers: int) -> int:
        return self.pipeline_stages or workers

    def validate(self, workers, batch_size, n_examples):
        stages = self.stages_for(workers)
        if workers % stages:
            raise ConfigError(f"--workers {workers} is not a multiple of --pipeline-stages "
                              f"{stages}; use --workers {stages * max(1, workers // stages)}")
        replicas = workers // stages
        super().validate(replicas, batch_size, n_examples)
        if batch_size < replicas:
            raise ConfigError(f"batch size {batch_size} is smaller than the {replicas} pipeline "
                              f"replicas; use --batch-size {replicas} or more")
        rows = batch_size // replicas  # the smallest replica's part of a batch
        if self.micro_batches > rows:
            if self.micro_given:
                micro = next(o for o in OPTIONS if o.name == "micro_batches")
                batch = "--batch-size" if self.cli else "batch_size="
                given = f"--batch-size {batch_size}" if self.cli else f"batch_size={batch_size}"
                raise ConfigError(f"{micro.given(self.micro_batches, self.cli)} cannot cut a "
                                  f"batch of {rows} examples (a replica's part of {given}); "
                                  f"use {micro.given(rows, self.cli)} or fewer, or a larger "
                                  f"{batch}")
            self.micro_batches = rows  # the default, cut to what a batch holds

    def pass_sizes(self, workers, batch_size, n_examples, steps=None) -> set:
        """A micro-batch's sizes: each batch cut among the replicas, each
        replica's part into at most ``micro_batches`` (``worker.py``)."""
        sizes = set()
        for part in super().pass_sizes(workers // self.stages_for(workers), batch_size,
                                       n_examples, steps):
            micro = min(self.micro_batches, part)
            sizes |= {len(range(*part_bounds(part, micro, m))) for m in range(micro)}
        return sizes

    def preflight(self, problem, workers: int, batch_size: int) -> None:
        """The model's cut checked (``stages.check_plan``) before the run starts."""
        from .stages import check_plan

        check_plan(problem, self.stages_for(workers), self.cuts, self.cli)

    def layout(self, problem, workers: int, batch_size: int):
        """The stages (cut now, from the problem's model), S and R."""
        from .stages import plan

        stages = self.stages_for(workers)
        specs = plan(problem, stages, self.balance, self.cuts, batch_size)
        self.stages_used, self.replicas_used = stages, workers // stages
        return specs, stages, workers // stages

    def program(self, job):
        raise ConfigError("the pipeline strategy runs through its engine's stage runner, not "
                          "as a worker program")

    def describe(self):
        return {"strategy": self.name, "pipeline_stages": self.stages_used or self.pipeline_stages,
                "micro_batches": self.micro_batches, "schedule": self.schedule,
                "cuts": self.cuts, "balance": self.balance}

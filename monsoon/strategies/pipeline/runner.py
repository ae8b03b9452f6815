"""What every engine's pipeline runner shares: the per-worker payloads, the
replicas' gradient sum (in rank order, so that every engine gives the same
bits) and the summary of a finished run (bubble fraction, per-stage time
and memory) and its model's buffers: replica 0's stages' (BatchNorm's
running statistics, as sync keeps rank 0's), one set of the whole model's
names made of theirs.

Worker ``rank`` is stage ``rank % S`` of replica ``rank // S``. A payload
holds only that stage's layers and parameters, the data that stage reads
(the inputs for the first stage, the targets for the last) and the rule,
whose state the worker creates for its own slice.
"""
from __future__ import annotations

import functools
from collections import Counter

from .schedules import gpipe_bubble
from .stages import stage_module
from .worker import StageWorker


def stage_payloads(strategy, problem, rule, specs, replicas, w0, batch_size, seed, budget):
    payloads = []
    for r in range(replicas):
        for spec in specs:
            make = functools.partial(
                StageWorker, spec, stage_module(problem, spec, w0), rule, problem.dtype, r,
                replicas, strategy.micro_batches, strategy.schedule,
                X=problem.X if spec.first else None, y=problem.y if spec.last else None,
                loss_fn=problem.loss_fn if spec.last else None,
                full_batch=min(batch_size, problem.n_examples))
            payloads.append({"make": make,
                             "batches": (problem.n_examples, batch_size, seed, budget)})
    return payloads


def add_replicas(total, others) -> None:
    """The replicas' gradient sum in rank order, in place: ``total`` holds
    replica 0's gradient, ``others`` (an iterable, read one at a time) are
    replicas 1, 2... in order; ``total += g`` for each, in ``total``'s
    dtype. Every engine sums this way, so every replica and every engine
    applies the same bits."""
    for g in others:
        total += g


def bubble(stats: list[dict], stages: int) -> float:
    """Measured idle fraction: per replica 1 - sum(busy) / (S * wall), averaged.
    Real transports on one machine leave the first step out (it pays torch's
    lazy start-up, which would count as work) when there is more than one:
    the wall is then from the last stage's end of step 1 (stage 0, whose
    backward comes last) to the last end of the run, and busy is every
    stage's compute in steps 2 on."""
    by_replica: dict[int, list] = {}
    for s in stats:
        by_replica.setdefault(s["replica"], []).append(s)
    fractions = []
    for group in by_replica.values():
        if all("first_step_end" in s for s in group):
            wall = (max(s["last_step_end"] for s in group)
                    - max(s["first_step_end"] for s in group))
            busy = sum(s["busy_s_steady"] for s in group)
        else:
            wall = max(s["wall_s"] for s in group)
            busy = sum(s["busy_s"] for s in group)
        if wall > 0:
            fractions.append(max(0.0, 1.0 - busy / (stages * wall)))
    return sum(fractions) / len(fractions) if fractions else 0.0


def stage_summary(stats: list[dict], stages: int) -> list[dict]:
    """Per stage: replica 0's compute time, wall time and memory (bytes of
    its parameters, rule state and gradient), the most micro-batches whose
    activations it held at once, and the median step's wall and compute time."""
    out = []
    for s in range(stages):
        mine = [x for x in stats if x["stage"] == s and x["replica"] == 0]
        if mine:
            x = mine[0]
            out.append({k: x[k] for k in ("stage", "busy_s", "wall_s", "param_bytes",
                                          "rule_state_bytes", "grad_bytes",
                                          "peak_micro_batches_in_flight", "step_s_median",
                                          "busy_s_median") if k in x})
    return out


def dropped_steps(stats: list[dict], steps: int) -> int:
    """Of the run's first ``steps`` steps, those some stage did not apply
    (its part of the gradient was not finite), each counted once however
    many stages dropped it. A later stage may have finished a step that the
    first stage, stopped mid-step, does not count: that one is not the run's."""
    dropped = set()
    for s in stats:
        dropped.update(t for t in s.get("dropped_steps", ()) if t < steps)
    if any("dropped_steps" in s for s in stats):
        return len(dropped)
    return max((s["dropped"] for s in stats), default=0)


def finish(result_cls, strategy, params, startup, wall, examples, steps, stats, stopped, w0,
           extra=None, interrupted=None, states=()):
    """The run's result from its ``steps`` (each one batch, run by every
    stage) and the stages' ``stats``. As on every engine, ``updates`` are the
    steps applied and ``dropped_updates`` those that were not: a step that
    any stage dropped counts as dropped. Every update counts at staleness 0:
    both schedules flush (a micro-batch's backward uses the weights its
    forward used, and a stage's one update a step follows its last
    backward), so no gradient is of weights older than those it updates,
    and the histogram sums to ``updates``. ``interrupted``: the stop signal
    that ended the run, if one did. ``states``: replica 0's stages' buffers
    (``StageWorker.buffers``; None or {} for a stage without any), the
    model's as one worker's state (``api`` loads it into the model)."""
    stages = strategy.stages_used
    dropped = dropped_steps(stats, steps)
    updates = steps - dropped
    summary = {"pipeline_stages": stages, "pipeline_replicas": strategy.replicas_used,
               "bubble_fraction": bubble(stats, stages),
               "gpipe_bubble": gpipe_bubble(stages, strategy.micro_batches),
               "stages": stage_summary(stats, stages),
               "model_param_bytes": int(w0.nbytes), **(extra or {})}
    buffers = {name: array for state in states for name, array in (state or {}).items()}
    return result_cls(params, startup, wall, examples, updates, dropped,
                      Counter({0: updates} if updates else {}), [],
                      stopped=stopped, interrupted=interrupted, extra=summary,
                      worker_states={0: buffers} if buffers else {})

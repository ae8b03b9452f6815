"""Pipeline schedules: the order in which each stage runs its micro-batches.

A batch of B examples is cut into M micro-batches (sizes differ by at most
one). Stage s runs ``F m`` (forward of micro-batch m: receive its input
activation, send its output) and ``B m`` (backward: receive the gradient of
its output, send the gradient of its input), in the order its schedule
gives; gradients accumulate over the micro-batches, and ONE update per batch
follows the last ``B``.

- ``gpipe`` (Huang et al. 2019, "GPipe"): all M forwards, then all M
  backwards (last micro-batch first). Every stage keeps M activations.
- ``1f1b`` (Narayanan et al. 2021, PipeDream-Flush; also DAPPLE): stage s
  runs ``min(S - s - 1, M)`` warm-up forwards, then alternates one forward
  and one backward, then drains the remaining backwards. A stage keeps at
  most S - s activations in flight, not M; the bubble is the same.

With equal stages and no transfer time both leave each stage idle for a
fraction (S - 1) / (M + S - 1) of the step (the "bubble").
``dependency_order`` lists a replica's ops in one order where every op
follows the neighbour's op it receives from (the order the sim engine runs
them in and the ray engine submits them in); ``timeline`` walks that order
to compute the step's makespan and bubble for any per-stage costs, which is
the sim engine's model of a pipeline.

Invariant (tested): on every stage, both schedules run each F m and B m
exactly once, F m before B m, and the F's (and the B's) in the same order on
every stage, so one FIFO channel per direction carries the messages.
"""
from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b")


def gpipe(stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    return [("F", m) for m in range(micro)] + [("B", m) for m in reversed(range(micro))]


def one_f_one_b(stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    warm = min(stages - stage - 1, micro)
    ops = [("F", m) for m in range(warm)]
    f, b = warm, 0
    while f < micro:
        ops.append(("F", f))
        f += 1
        ops.append(("B", b))
        b += 1
    ops += [("B", m) for m in range(b, micro)]
    return ops


def schedule(name: str, stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    return {"gpipe": gpipe, "1f1b": one_f_one_b}[name](stage, stages, micro)


def gpipe_bubble(stages: int, micro: int) -> float:
    """GPipe's idle fraction with equal stages and free transfers."""
    return (stages - 1) / (micro + stages - 1)


def peak_activations(ops) -> int:
    """The most micro-batches whose activations a stage holds at once."""
    held = peak = 0
    for kind, _ in ops:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def dependency_order(plans):
    """Every op of one replica's step, ``plans[s]`` being stage s's schedule,
    as ``(s, kind, m, dep)`` in an order where each stage's ops keep their
    schedule's order and every op comes after ``dep``, the neighbour's op
    whose output it receives (``(s - 1, "F", m)`` for a forward,
    ``(s + 1, "B", m)`` for a backward; None on the first stage's forwards
    and the last stage's backwards). It sweeps the stages, each running as
    far as its inputs allow. Used by ``timeline``, the sim engine (which
    runs the ops in this order) and the ray engine (which submits them)."""
    stages = len(plans)
    done, pos = set(), [0] * stages
    left = sum(len(p) for p in plans)
    while left:
        progressed = False
        for s in range(stages):
            while pos[s] < len(plans[s]):
                kind, m = plans[s][pos[s]]
                dep = ((s - 1, "F", m) if kind == "F" and s > 0 else
                       (s + 1, "B", m) if kind == "B" and s < stages - 1 else None)
                if dep is not None and dep not in done:
                    break
                yield s, kind, m, dep
                done.add((s, kind, m))
                pos[s] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")  # not reachable for these schedules


def timeline(name: str, forward, backward, transfer=0.0, update=None):
    """Virtual time of one step. ``forward[s][m]``/``backward[s][m]``: the
    seconds stage s spends on micro-batch m; ``transfer``: seconds a message
    between neighbouring stages takes (``transfer[s][m]`` or one number);
    ``update[s]``: seconds of stage s's update after its last backward.
    Returns ``(makespan, busy)``, ``busy[s]`` being stage s's compute time."""
    stages, micro = len(forward), len(forward[0])
    link = (lambda s, m: transfer) if not callable(transfer) and not isinstance(transfer, list) \
        else (lambda s, m: transfer[s][m])
    plans = [schedule(name, s, stages, micro) for s in range(stages)]
    done = {}
    free = [0.0] * stages
    busy = [0.0] * stages
    for s, kind, m, dep in dependency_order(plans):
        cost = (forward if kind == "F" else backward)[s][m]
        ready = done[dep] + link(min(s, dep[0]), m) if dep is not None else 0.0
        free[s] = done[(s, kind, m)] = max(free[s], ready) + cost
        busy[s] += cost
    if update is not None:
        for s in range(stages):
            free[s] += update[s]
            busy[s] += update[s]
    return max(free), busy


def bubble_fraction(makespan: float, busy) -> float:
    """The fraction of stage-time spent idle: 1 - sum(busy) / (S * makespan)."""
    if makespan <= 0:
        return 0.0
    return max(0.0, 1.0 - sum(busy) / (len(busy) * makespan))

"""Cutting a model into pipeline stages (GPipe's partitioning).

A model is a list of layers run one after another: an ``nn.Sequential``, or
a list of stage modules given by the user (``staged([...])``, whose cut
points are the list's own boundaries). Stage ``s`` runs layers
``[cuts[s], cuts[s+1])``. The cut points are

- given by the user (``--cuts 2,4``: the layers where stages 1, 2... start);
- or balanced by parameter count (the default): the cuts minimising the
  largest stage's parameter count (a linear partition, solved exactly by
  dynamic programming over the layer prefix sums);
- or balanced by measured time: the same partition over each layer's
  measured forward + backward time on one batch.

Invariants: every stage holds at least one layer; a stage's parameters are
one contiguous range ``[lo, hi)`` of the problem's flat parameter vector
(``TorchProblem`` flattens ``module.parameters()`` in layer order), so the
flat vector is the concatenation of the stages' vectors; a parameter shared
by two stages (tied weights) is refused. A stage's layers keep their names in
the model (``stage_module``), so its buffers (BatchNorm's running
statistics) are named as there (``stage_buffers``), and the stages' sets
never share a name.
"""
from __future__ import annotations

import copy
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ...errors import ConfigError


class StageList(nn.Sequential):
    """A model given as a list of stage modules: run in sequence, and cut
    at the list's boundaries unless the user gives other cuts."""

    def __init__(self, stages):
        super().__init__(*stages)
        self.stage_cuts = tuple(range(len(stages)))


def staged(stages) -> StageList:
    """The model made of ``stages`` (modules), each a pipeline stage."""
    return StageList(list(stages))


@dataclass
class StageSpec:
    """Stage ``index`` of ``count``: its layers and its slice of the flat vector."""
    index: int
    count: int
    layers: tuple      # (start, stop) layer indices
    lo: int
    hi: int

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


def layers_of(problem) -> list:
    module = problem.module
    if not isinstance(module, nn.Sequential):
        kind = type(module).__name__ if module is not None else type(problem).__name__
        raise ConfigError(f"--strategy pipeline cuts an nn.Sequential (or monsoon.pipeline.staged"
                          f"([...]) stages) into stages; this problem's model is a {kind}")
    return list(module)


def layer_sizes(layers) -> list[int]:
    seen: dict[int, int] = {}
    sizes = []
    for i, layer in enumerate(layers):
        n = 0
        for p in layer.parameters():
            if not p.requires_grad:
                continue
            if id(p) in seen and seen[id(p)] != i:
                raise ConfigError(f"layers {seen[id(p)]} and {i} share a parameter (tied "
                                  "weights); the pipeline cannot cut between them")
            seen[id(p)] = i
            n += p.numel()
        sizes.append(n)
    return sizes


def balanced_cuts(costs, stages: int) -> list[int]:
    """Cut points (stage starts, the first is 0) splitting ``costs`` into
    ``stages`` contiguous non-empty groups, minimising the largest group's
    sum; ties go to the earliest cuts."""
    n = len(costs)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])
    inf = float("inf")
    # best[k][i]: the smallest max-group over the first i layers in k groups
    best = np.full((stages + 1, n + 1), inf)
    choice = np.zeros((stages + 1, n + 1), dtype=int)
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i] - 1e-12 * max(1.0, value):
                    best[k][i], choice[k][i] = value, j
    cuts, i = [], n
    for k in range(stages, 0, -1):
        i = choice[k][i]
        cuts.append(int(i))
    return cuts[::-1]


@contextmanager
def untouched(layers):
    """``layers`` as they were once the block ends (a dry forward, a timing):
    their buffers (a training-mode forward moves BatchNorm's running
    statistics, which the stages copy as their start) and their modes."""
    saved = [(b, b.detach().clone()) for layer in layers for b in layer.buffers()]
    modes = [(m, m.training) for layer in layers for m in layer.modules()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
        for module, training in modes:
            module.train(training)


def measured_costs(layers, problem, batch_size: int) -> list[float]:
    """Each layer's forward + backward seconds on one batch (best of 3), in
    its own mode, the model left untouched."""
    x = problem.X[:max(1, min(batch_size, problem.n_examples))]
    costs = []
    with untouched(layers):
        for layer in layers:
            best = inf = float("inf")
            inp = x.detach().requires_grad_(x.is_floating_point())
            for _ in range(3):
                t0 = time.perf_counter()
                out = layer(inp)
                if out.requires_grad:
                    out.backward(torch.ones_like(out))
                best = min(best, time.perf_counter() - t0)
            layer.zero_grad(set_to_none=True)
            costs.append(best if best < inf else 0.0)
            with torch.no_grad():
                x = layer(x)
    return costs


def parse_cuts(text: str, n_layers: int, stages: int, cli: bool = True) -> list[int]:
    """``--cuts``' stage starts; a refusal names it as given (``cli``: the
    flag, else the keyword)."""
    flag, given = ("--cuts", f"--cuts {text}") if cli else ("cuts=", f'cuts="{text}"')
    try:
        starts = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise ConfigError(f"{flag} takes layer indices separated by commas, like 2,4; got "
                          f"{text!r}")
    if starts and starts[0] == 0:
        starts = starts[1:]
    if len(starts) != stages - 1:
        raise ConfigError(f"{given} gives {len(starts) + 1} stages, but there are {stages} "
                          f"stages; give {stages - 1} cut point(s)")
    cuts = [0] + starts
    if any(b <= a for a, b in zip(cuts, cuts[1:])) or cuts[-1] >= n_layers:
        raise ConfigError(f"{given}: cut points must increase and lie in 1..{n_layers - 1} "
                          f"(the model has {n_layers} layers)")
    return cuts


def plan(problem, stages: int, balance: str = "params", cuts: str | None = None,
         batch_size: int = 32) -> list[StageSpec]:
    """The stages of ``problem``'s model."""
    layers, sizes, starts = check_plan(problem, stages, cuts)
    given = getattr(problem.module, "stage_cuts", None)
    if starts is not None:  # --cuts
        starts = list(starts)
    elif given is not None and len(given) == stages:
        starts = list(given)
    elif balance == "time":
        starts = balanced_cuts(measured_costs(layers, problem, batch_size), stages)
    else:
        starts = balanced_cuts(sizes, stages)
    bounds = starts + [len(layers)]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [StageSpec(s, stages, (bounds[s], bounds[s + 1]), int(offsets[bounds[s]]),
                      int(offsets[bounds[s + 1]])) for s in range(stages)]


def check_plan(problem, stages: int, cuts: str | None = None, cli: bool = True):
    """What ``plan`` refuses, checked without cutting or timing anything:
    a model that is no nn.Sequential, tied weights across layers, more
    stages than layers, bad ``--cuts``, layers that do not own the
    parameters in order. Returns the layers, their sizes and the given
    cuts' stage starts (None without ``--cuts``)."""
    layers = layers_of(problem)
    sizes = layer_sizes(layers)
    if stages > len(layers):
        raise ConfigError(f"{stages} pipeline stages but the model has only {len(layers)} layers; "
                          f"use --pipeline-stages {len(layers)} or fewer")
    if sum(sizes) != problem.n_params:
        raise ConfigError("the model's layers do not hold all its parameters in order; the "
                          "pipeline needs an nn.Sequential whose layers own their parameters")
    return layers, sizes, (parse_cuts(cuts, len(layers), stages, cli) if cuts else None)


def stage_module(problem, spec: StageSpec, w: np.ndarray) -> nn.Sequential:
    """A standalone copy of stage ``spec``'s layers holding ``w[lo:hi]``
    (only this stage's parameters are copied), each under its name in the
    whole model (``"2"``, or ``"bn"`` in a Sequential of named layers), so
    its buffers are named as there."""
    a, b = spec.layers
    layers = layers_of(problem)[a:b]
    names = [name for name, _ in problem.module.named_children()][a:b]
    params = [p for layer in layers for p in layer.parameters() if p.requires_grad]
    saved = [p.data for p in params]
    try:
        for p in params:  # deep-copy no parameter data: it is set from w below
            p.data = torch.empty(0, dtype=p.dtype)
        module = copy.deepcopy(nn.Sequential(OrderedDict(zip(names, layers))))
    finally:
        for p, data in zip(params, saved):
            p.data = data
    offset = spec.lo
    for p, shape in zip([p for p in module.parameters() if p.requires_grad],
                        [p.shape for p in params]):
        size = int(np.prod(shape, dtype=np.int64))
        p.data = torch.from_numpy(np.array(w[offset:offset + size], copy=True)).view(shape)
        offset += size
    return module


def stage_buffers(spec: StageSpec, module: nn.Sequential) -> dict:
    """A copy of stage ``spec``'s ``module``'s buffers, named as in the
    whole model (``stage_module`` keeps its layers' names)."""
    return {name: buffer.detach().cpu().numpy().copy() for name, buffer in module.named_buffers()}

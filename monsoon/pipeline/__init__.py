"""Model parallelism: the ``pipeline`` strategy (GPipe, 1F1B, 2D).

- ``stages.py``: cutting an ``nn.Sequential`` (or ``staged([...])``) into stages.
- ``schedules.py``: GPipe and 1F1B orders, and the timeline model of a step.
- ``worker.py``: one stage's loop, the same on every engine.
- ``runner.py``: payloads and the summary, shared by the engines' runners.
- ``local.py``, ``sim.py``, ``ray.py``: each engine's transport and runner.
"""
from __future__ import annotations

from ..errors import ConfigError
from .stages import StageList, staged
from .strategy import Pipeline

__all__ = ["Pipeline", "StageList", "staged", "runner_for"]


def runner_for(engine):
    """The pipeline runner for ``engine`` (by the engine's name)."""
    name = getattr(engine, "name", type(engine).__name__)
    if name == "local":
        from .local import run_local
        return run_local
    if name == "sim":
        from .sim import run_sim
        return run_sim
    if name == "ray":
        from .ray import run_ray
        return run_ray
    raise ConfigError(f"the pipeline strategy has no runner for the {name} engine; use "
                      "--engine local, sim or ray")

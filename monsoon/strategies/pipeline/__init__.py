"""Model parallelism: the ``pipeline`` strategy (GPipe, 1F1B, 2D).

- ``strategy.py``: the strategy, its options and its need (``STAGES``).
- ``stages.py``: cutting an ``nn.Sequential`` (or ``staged([...])``) into stages.
- ``schedules.py``: GPipe and 1F1B orders, and the timeline model of a step.
- ``worker.py``: one stage's loop, the same on every engine.
- ``runner.py``: payloads and the summary, shared by the engines' runners.

An engine that meets ``STAGES`` runs it with its own stage runner and
channels (the ``pipeline.py`` of the local, sim and ray engines' packages);
nothing here knows an engine.
"""
from __future__ import annotations

from .strategy import Pipeline

__all__ = ["Pipeline", "StageList", "staged"]


def __getattr__(name):
    # torch is imported on first use: a run on a NumPy problem never loads it
    if name in ("StageList", "staged"):
        from . import stages

        return getattr(stages, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

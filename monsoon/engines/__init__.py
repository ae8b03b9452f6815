"""Engines: where workers run and how parameters move.

``ENGINES`` is the registry: monsoon's own by name, and other packages'
through the ``monsoon.engines`` entry-point group (see ``registry.py``).
Every engine subclasses ``Engine`` (``base.py``, the contract): it declares
its options, the ops it carries out and the needs it meets, builds itself
with ``from_options(run, **values)`` and trains with ``run(...)``; see
docs/extending.md.
"""
from __future__ import annotations

from ..registry import Registry
from ..monitor.tally import EngineResult
from .base import Engine
from .local import BACKENDS, LocalEngine
from .ray import RayEngine
from .sim import DelayModel, SimEngine
from .spark import SparkEngine
from .torchrun import TorchEngine

__all__ = ["ENGINES", "Engine", "EngineResult", "BACKENDS", "DelayModel", "LocalEngine", "RayEngine", "SimEngine",
           "SparkEngine", "TorchEngine", "engine_names", "make_engine"]

ENGINES = Registry("engine", "monsoon.engines",
                   {"local": LocalEngine, "sim": SimEngine, "ray": RayEngine,
                    "spark": SparkEngine, "torch": TorchEngine}, base=Engine)


def engine_names() -> list[str]:
    return ENGINES.names()


def make_engine(name: str, **options):
    return ENGINES.get(name)(**options)

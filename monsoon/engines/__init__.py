"""Engines: where workers run and how parameters move."""
from __future__ import annotations

from ..errors import ConfigError
from .local import BACKENDS, LocalEngine
from .ray import RayEngine
from .sim import DelayModel, SimEngine

__all__ = ["ENGINES", "BACKENDS", "DelayModel", "LocalEngine", "RayEngine", "SimEngine",
           "engine_names", "make_engine"]

ENGINES = {"local": LocalEngine, "sim": SimEngine, "ray": RayEngine}
PLANNED = {}


def engine_names() -> list[str]:
    return list(ENGINES)


def make_engine(name: str, **options):
    if name not in ENGINES:
        extra = f" ({name} is {PLANNED[name]}, not built yet)" if name in PLANNED else ""
        raise ConfigError(f"unknown engine {name!r}{extra}; choose one of: {', '.join(engine_names())}")
    return ENGINES[name](**options)

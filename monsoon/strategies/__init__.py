"""Strategies: communication patterns written once as worker programs.

``STRATEGIES`` is the registry: monsoon's own by name, and other packages'
through the ``monsoon.strategies`` entry-point group (see ``registry.py``).
"""
from __future__ import annotations

from ..registry import Registry
from .base import RunInfo, Strategy, WorkerJob
from .batches import Budget
from .downpour import Downpour
from .easgd import EASGD
from .hogwild import Hogwild
from .local_sgd import LocalSGD
from .pipeline import Pipeline
from .serial import Serial
from .ssp import SSP
from .sync import Sync

STRATEGIES = Registry("strategy", "monsoon.strategies", {
    "serial": Serial, "sync": Sync, "async": Downpour, "hogwild": Hogwild,
    "local-sgd": LocalSGD, "easgd": EASGD, "ssp": SSP,
    "pipeline": Pipeline}, base=Strategy)

__all__ = ["Strategy", "WorkerJob", "RunInfo", "Budget", "make_strategy", "strategy_names",
           "STRATEGIES"]


def strategy_names() -> list[str]:
    return STRATEGIES.names()


def make_strategy(name: str, **options) -> Strategy:
    return STRATEGIES.get(name)(**options)

"""Strategies: communication patterns written once as worker programs."""
from __future__ import annotations

from ..errors import ConfigError
from .base import Strategy, WorkerJob
from .batches import Budget
from .downpour import Downpour
from .easgd import EASGD
from .hogwild import Hogwild
from .local_sgd import LocalSGD
from .serial import Serial
from .sync import Sync

STRATEGIES = {"serial": Serial, "sync": Sync, "async": Downpour, "hogwild": Hogwild,
              "local-sgd": LocalSGD, "easgd": EASGD}

__all__ = ["Strategy", "WorkerJob", "Budget", "make_strategy", "strategy_names", "STRATEGIES"]


def strategy_names() -> list[str]:
    return list(STRATEGIES)


def make_strategy(name: str, **options) -> Strategy:
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r}; choose one of: {', '.join(strategy_names())}")
    return STRATEGIES[name](**options)

"""Rules: the update math on flat arrays (see ``base`` for the protocol).

``RULES`` is the registry: monsoon's own by name, and other packages'
through the ``monsoon.rules`` entry-point group (see ``registry.py``).
"""
from __future__ import annotations

from ..errors import ConfigError
from ..registry import Registry
from .adagrad import Adagrad
from .adam import Adam
from .adarevision import AdaRevision
from .base import SCHEDULES, Rule, Schedule, UpdateInfo, slice_state
from .dcasgd import DCASGD, DCASGDAdaptive
from .lbfgs import Lbfgs
from .momentum import Momentum
from .nesterov import Nesterov
from .sgd import SGD

RULES = Registry("rule", "monsoon.rules", dict(sorted({
    "sgd": SGD, "momentum": Momentum, "nesterov": Nesterov, "adagrad": Adagrad,
    "adam": Adam, "lbfgs": Lbfgs, "adarevision": AdaRevision, "dcasgd": DCASGD,
    "dcasgd-a": DCASGDAdaptive}.items())), base=Rule)
DELAY_TOLERANT = ("adarevision", "dcasgd", "dcasgd-a")

__all__ = ["Rule", "Schedule", "UpdateInfo", "slice_state", "make_rule", "rule_names", "RULES"]


def rule_names() -> list[str]:
    return sorted(RULES.names())


def make_rule(name: str, lr: float, schedule: str = "constant", gamma: float = 0.1,
              step_size: int = 1000, staleness_lr: bool = False, **options) -> Rule:
    cls = RULES.get(name)
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown lr schedule {schedule!r}; choose one of: {', '.join(SCHEDULES)}")
    if not lr > 0:
        raise ConfigError(f"learning rate must be positive, got {lr}; pass e.g. --lr 0.01")
    if not lr == lr or lr == float("inf"):
        raise ConfigError(f"learning rate must be a finite number, got {lr}")
    return cls(Schedule(float(lr), schedule, float(gamma), int(step_size)),
               staleness_lr=staleness_lr, **options)

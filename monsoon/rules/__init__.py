"""Rules: the update math on flat arrays (see ``base`` for the protocol)."""
from __future__ import annotations

from ..errors import ConfigError
from .adagrad import Adagrad
from .base import Rule, Schedule, UpdateInfo, slice_state
from .momentum import Momentum
from .sgd import SGD

RULES = {"sgd": SGD, "momentum": Momentum, "adagrad": Adagrad}
SCHEDULES = ("constant", "step")

__all__ = ["Rule", "Schedule", "UpdateInfo", "slice_state", "make_rule", "rule_names", "RULES"]


def rule_names() -> list[str]:
    return sorted(RULES)


def make_rule(name: str, lr: float, schedule: str = "constant", gamma: float = 0.1,
              step_size: int = 1000, **options) -> Rule:
    if name not in RULES:
        raise ConfigError(f"unknown rule {name!r}; choose one of: {', '.join(rule_names())}")
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown lr schedule {schedule!r}; choose one of: {', '.join(SCHEDULES)}")
    if not lr > 0:
        raise ConfigError(f"learning rate must be positive, got {lr}; pass e.g. --lr 0.01")
    return RULES[name](Schedule(float(lr), schedule, float(gamma), int(step_size)), **options)

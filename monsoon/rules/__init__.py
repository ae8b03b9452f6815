"""Rules: the update math on flat arrays (see ``base`` for the protocol)."""
from __future__ import annotations

from ..errors import ConfigError
from .adagrad import Adagrad
from .adam import Adam
from .adarevision import AdaRevision
from .base import Rule, Schedule, UpdateInfo, slice_state
from .dcasgd import DCASGD, DCASGDAdaptive
from .momentum import Momentum
from .nesterov import Nesterov
from .sgd import SGD

RULES = {"sgd": SGD, "momentum": Momentum, "nesterov": Nesterov, "adagrad": Adagrad,
         "adam": Adam, "adarevision": AdaRevision, "dcasgd": DCASGD, "dcasgd-a": DCASGDAdaptive}
DELAY_TOLERANT = ("adarevision", "dcasgd", "dcasgd-a")
SCHEDULES = ("constant", "step")

__all__ = ["Rule", "Schedule", "UpdateInfo", "slice_state", "make_rule", "rule_names", "RULES"]


def rule_names() -> list[str]:
    return sorted(RULES)


def make_rule(name: str, lr: float, schedule: str = "constant", gamma: float = 0.1,
              step_size: int = 1000, staleness_lr: bool = False, **options) -> Rule:
    if name not in RULES:
        raise ConfigError(f"unknown rule {name!r}; choose one of: {', '.join(rule_names())}")
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown lr schedule {schedule!r}; choose one of: {', '.join(SCHEDULES)}")
    if not lr > 0:
        raise ConfigError(f"learning rate must be positive, got {lr}; pass e.g. --lr 0.01")
    if not lr == lr or lr == float("inf"):
        raise ConfigError(f"learning rate must be a finite number, got {lr}")
    return RULES[name](Schedule(float(lr), schedule, float(gamma), int(step_size)),
                       staleness_lr=staleness_lr, **options)

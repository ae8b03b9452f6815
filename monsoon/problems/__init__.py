"""Problems: what is trained. See ``base.Problem`` for the protocol."""
from __future__ import annotations

from ..errors import ConfigError
from .base import Problem
from .catalog import CATALOG
from .torch_problem import TorchProblem

__all__ = ["Problem", "TorchProblem", "CATALOG", "make_problem", "problem_defaults",
           "problem_names"]


def problem_names() -> list[str]:
    return sorted(CATALOG)


def _entry(name: str):
    if name not in CATALOG:
        raise ConfigError(f"unknown problem {name!r}; choose one of: {', '.join(problem_names())}")
    return CATALOG[name]


def problem_defaults(name: str) -> dict:
    """The training defaults (lr, batch size, budget) a catalog problem suggests."""
    return dict(_entry(name).defaults)


def make_problem(name: str, dtype: str = "float32") -> Problem:
    return _entry(name).build(dtype=dtype)

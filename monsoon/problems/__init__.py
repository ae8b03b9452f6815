"""Problems: what is trained. See ``base.Problem`` for the protocol."""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .base import Problem
from .catalog import CATALOG
from .torch_problem import TorchProblem

__all__ = ["Problem", "TorchProblem", "CATALOG", "make_problem", "problem_defaults",
           "problem_names"]


# Problems named with arguments: "libsvm:PATH", "rcv1-like:rows=20000,nnz=30".
PARAMETRIC = {"libsvm": "libsvm:PATH (an svmlight / libsvm file)",
              "rcv1-like": "rcv1-like[:rows=N,features=N,nnz=N,exponent=X,seed=N]",
              "mf-synthetic": "mf-synthetic[:users=N,items=N,ratings=N,rank=N]",
              "ratings": "ratings:PATH (user,item,rating rows)"}
SPARSE_DEFAULTS = {"lr": 0.25, "epochs": 5, "batch_size": 64}
MF_DEFAULTS = {"lr": 0.05, "epochs": 10, "batch_size": 64}


def problem_names() -> list[str]:
    return sorted(CATALOG)


def _split(name: str) -> tuple[str, str]:
    base, _, arg = name.partition(":")
    return base, arg


def _entry(name: str):
    if name not in CATALOG:
        valid = ", ".join(problem_names() + sorted(PARAMETRIC.values()))
        raise ConfigError(f"unknown problem {name!r}; choose one of: {valid}")
    return CATALOG[name]


def problem_defaults(name: str) -> dict:
    """The training defaults (lr, batch size, budget) a catalog problem suggests."""
    base, _ = _split(name)
    if base in ("mf-synthetic", "ratings"):
        return dict(MF_DEFAULTS)
    if base in PARAMETRIC:
        return dict(SPARSE_DEFAULTS)
    return dict(_entry(name).defaults)


def _options(arg: str, kind: str, allowed: set[str]) -> dict:
    """Parse "key=value,..." after a problem's name, refusing unknown keys."""
    options = {}
    for part in filter(None, arg.split(",")):
        key, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"problem option {part!r} must look like key=value")
        try:
            options[key.strip()] = float(value) if "." in value or "e" in value else int(value)
        except ValueError:
            raise ConfigError(f"problem option {part!r}: {value!r} is not a number") from None
    unknown = set(options) - allowed
    if unknown:
        raise ConfigError(f"unknown {kind} option(s) {', '.join(sorted(unknown))}; "
                          f"valid: {', '.join(sorted(allowed))}")
    return options


def make_problem(name: str, dtype: str = "float32") -> Problem:
    problem = _build(name, dtype)
    problem.defaults = problem_defaults(name)
    return problem


def _build(name: str, dtype: str) -> Problem:
    base, arg = _split(name)
    if base == "libsvm":
        from .files import load_svmlight
        from .sparse_linear import SparseLinear

        if not arg:
            raise ConfigError("libsvm needs a file: --problem libsvm:PATH")
        X, y, _ = load_svmlight(arg, dtype=dtype)
        if set(np.unique(y)) <= {-1.0, 1.0} or set(np.unique(y)) <= {0.0, 1.0}:
            y = (y > 0).astype(dtype)
            return SparseLinear(X, y, "logistic", dtype=dtype, name=name)
        return SparseLinear(X, y, "squared", dtype=dtype, name=name)
    if base == "rcv1-like":
        from .sparse_linear import rcv1_like

        return rcv1_like(dtype=dtype, **_options(
            arg, base, {"rows", "features", "nnz", "exponent", "noise", "seed", "lam"}))
    if base == "mf-synthetic":
        from .matrix_factorization import mf_synthetic

        return mf_synthetic(dtype=dtype, **_options(
            arg, base, {"users", "items", "ratings", "rank", "noise", "seed", "lam",
                        "model_rank"}))
    if base == "ratings":
        from .files import load_ratings
        from .matrix_factorization import MatrixFactorization

        if not arg:
            raise ConfigError("ratings needs a file: --problem ratings:PATH")
        data = load_ratings(arg)
        return MatrixFactorization(data["users"], data["items"], data["ratings"], dtype=dtype,
                                   name=name)
    return _entry(name).build(dtype=dtype)

"""Problems: what is trained. See ``base.Problem`` for the protocol.

``PROBLEMS`` is the registry of named problems (``ProblemSpec``): the
catalog, the ones named with an argument (``libsvm:PATH``,
``rcv1-like:rows=20000``), and other packages' through the
``monsoon.problems`` entry-point group (see ``registry.py``).
"""
from __future__ import annotations

import inspect

import numpy as np

from ..errors import ConfigError, MonsoonError
from ..options import SEED_MAX, Option, at_least, in_range, non_negative, option_values
from ..registry import Registry
from .base import Problem
from .catalog import CATALOG, ProblemSpec
from .matrix_factorization import MF_DEFAULTS
from .spark_data import SPARK_DEFAULTS, SparkData, SparkHeld

__all__ = ["Problem", "TorchProblem", "ProblemSpec", "CATALOG", "PROBLEMS", "SPARK_DEFAULTS",
           "make_problem", "problem_defaults", "problem_names", "problem_spec"]



def __getattr__(name):
    # torch is imported on first use: a run on a NumPy problem never loads it
    if name == "TorchProblem":
        from .torch_problem import TorchProblem

        return TorchProblem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SPARSE_DEFAULTS = {"lr": 0.25, "epochs": 5, "batch_size": 64}


def _options(arg: str, kind: str, declared: tuple[Option, ...]) -> dict:
    """Parse "key=value,..." after a problem's name, refusing unknown keys
    and values out of range (each key's ``Option`` and its check)."""
    options = {}
    for part in filter(None, arg.split(",")):
        key, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"problem option {part!r} must look like key=value")
        try:
            options[key.strip()] = float(value) if "." in value or "e" in value else int(value)
        except ValueError:
            raise ConfigError(f"problem option {part!r}: {value!r} is not a number") from None
    allowed = {o.name: o for o in declared}
    unknown = set(options) - set(allowed)
    if unknown:
        raise ConfigError(f"unknown {kind} option(s) {', '.join(sorted(unknown))}; "
                          f"valid: {', '.join(sorted(allowed))}")
    return {key: allowed[key].value(value) for key, value in options.items()}


def _generator_option(kind: str, name: str, type_, check, help_: str) -> Option:
    """A generator's ``key=value`` after ``--problem KIND:``, its messages
    naming where it is given: "rcv1-like's rows must be ...; fix --problem
    rcv1-like:rows=N"."""
    return Option(name, type_, None, help_, check=check, label=f"{kind}'s {name}",
                  flag=f"--problem {kind}:{name}={'N' if type_ is int else 'X'}")


RCV1_OPTIONS = tuple(_generator_option("rcv1-like", *o) for o in (
    ("rows", int, at_least(1), "examples"),
    ("features", int, at_least(1), "feature columns"),
    ("nnz", int, at_least(1), "mean non-zeros a row"),
    ("exponent", float, non_negative, "the features' power-law popularity exponent"),
    ("noise", float, in_range(0, 1), "the share of labels flipped"),
    ("seed", int, in_range(0, SEED_MAX), "the data's seed"),
    ("lam", float, non_negative, "L2 regularization"),
))
MF_OPTIONS = tuple(_generator_option("mf-synthetic", *o) for o in (
    ("users", int, at_least(1), "users"),
    ("items", int, at_least(1), "items"),
    ("ratings", int, at_least(1), "ratings drawn"),
    ("rank", int, at_least(1), "the planted model's rank"),
    ("noise", float, non_negative, "the ratings' Gaussian noise"),
    ("seed", int, in_range(0, SEED_MAX), "the data's seed"),
    ("lam", float, non_negative, "L2 regularization"),
    ("model_rank", int, at_least(1), "the trained model's rank (default: rank)"),
))


# A user's own data named on the command line (libsvm:PATH, spark:PATH,
# spark-table:NAME) trains the plain objective, no L2 term: what MLlib's
# LogisticRegression (regParam 0) and Vowpal Wabbit fit by default.
FILE_LAM = 0.0


def _libsvm(path: str, dtype: str = "float32"):
    from .files import load_svmlight
    from .sparse_linear import SparseLinear

    X, y, _ = load_svmlight(path, dtype=dtype)
    name = f"libsvm:{path}"
    if set(np.unique(y)) <= {-1.0, 1.0} or set(np.unique(y)) <= {0.0, 1.0}:
        return SparseLinear(X, (y > 0).astype(dtype), "logistic", lam=FILE_LAM, dtype=dtype,
                            name=name)
    return SparseLinear(X, y, "squared", lam=FILE_LAM, dtype=dtype, name=name)


def _rcv1_like(arg: str = "", dtype: str = "float32"):
    from .sparse_linear import rcv1_like

    return rcv1_like(dtype=dtype, **_options(arg, "rcv1-like", RCV1_OPTIONS))


def _mf_synthetic(arg: str = "", dtype: str = "float32"):
    from .matrix_factorization import mf_synthetic

    return mf_synthetic(dtype=dtype, **_options(arg, "mf-synthetic", MF_OPTIONS))


def _ratings(path: str, dtype: str = "float32"):
    from .files import load_ratings
    from .matrix_factorization import MatrixFactorization

    data = load_ratings(path, dtype)
    return MatrixFactorization(data["users"], data["items"], data["ratings"], dtype=dtype,
                               name=f"ratings:{path}", user_ids=data["user_ids"],
                               item_ids=data["item_ids"])


LIBSVM_SUFFIXES = (".libsvm", ".svm", ".txt")


def _spark_data(source, name: str, dtype: str):
    return SparkData(source, features="features", label="label", loss="logistic",
                     lam=FILE_LAM, dtype="float64" if dtype == "float64" else "float32",
                     name=name, repartition=True)


def _spark_path(path: str, dtype: str = "float32"):
    """Parquet, or libsvm by extension, read by Spark on its executors."""
    return _spark_data(SparkHeld.transport.read(path, LIBSVM_SUFFIXES), f"spark:{path}", dtype)


def _spark_table(table: str, dtype: str = "float32"):
    return _spark_data(SparkHeld.transport.table(table), f"spark-table:{table}", dtype)


PROBLEMS = Registry("problem", "monsoon.problems", {
    **dict(sorted(CATALOG.items())),
    "libsvm": ProblemSpec("libsvm", _libsvm, "your svmlight / libsvm file: logistic regression "
                          "for 0/1 or ±1 labels, else least squares", SPARSE_DEFAULTS,
                          argument="PATH", argument_required=True),
    "spark": ProblemSpec("spark", _spark_path, "logistic regression on data Spark reads "
                         "where it lives: Parquet (columns features, label), or libsvm "
                         f"({', '.join(LIBSVM_SUFFIXES)}); train with --engine spark",
                         SPARK_DEFAULTS, argument="PATH", argument_required=True,
                         engine="spark"),
    "spark-table": ProblemSpec("spark-table", _spark_table, "logistic regression on a Spark "
                               "table (columns features, label); train with --engine spark",
                               SPARK_DEFAULTS, argument="NAME", argument_required=True,
                               engine="spark"),
    "rcv1-like": ProblemSpec("rcv1-like", _rcv1_like, "synthetic sparse text classification "
                             "shaped like RCV1", SPARSE_DEFAULTS,
                             argument="rows=N,features=N,nnz=N,exponent=X,seed=N"),
    "mf-synthetic": ProblemSpec("mf-synthetic", _mf_synthetic, "matrix factorization on planted "
                                "rank-5 ratings", MF_DEFAULTS,
                                argument="users=N,items=N,ratings=N,rank=N"),
    "ratings": ProblemSpec("ratings", _ratings, "your rating file (user, item, rating rows), "
                           "factored at rank 10", MF_DEFAULTS, argument="PATH",
                           argument_required=True),
}, base=ProblemSpec, instances=True)


def problem_names() -> list[str]:
    """The problems named without an argument."""
    return sorted(n for n, s in PROBLEMS.all().items() if s.argument is None)


def problem_spec(name: str) -> tuple[ProblemSpec, str]:
    """The spec of ``name`` ("NAME" or "NAME:ARGUMENT") and its argument."""
    base, _, arg = name.partition(":")
    specs = PROBLEMS.all()
    if base not in specs:
        if PROBLEMS.broken(base):
            PROBLEMS.get(base)  # raises, naming the plug-in that failed to load
        valid = problem_names() + sorted(s.usage() for s in specs.values() if s.argument)
        raise ConfigError(f"unknown problem {name!r}; choose one of: {', '.join(valid)}")
    spec = specs[base]
    if arg and spec.argument is None:
        raise ConfigError(f"problem {base!r} takes no argument after ':'; use --problem {base}")
    if spec.argument_required and not arg:
        raise ConfigError(f"{base} needs a file: --problem {spec.usage()}")
    return spec, arg


def problem_defaults(name: str) -> dict:
    """The training defaults (lr, batch size, budget) a named problem suggests."""
    return dict(problem_spec(name)[0].defaults)


def make_problem(name: str, dtype: str = "float32", **options) -> Problem:
    """Build the named problem; ``options`` are the values of its spec's options."""
    spec, arg = problem_spec(name)
    values = option_values(spec, options)
    args = (arg,) if spec.argument else ()
    if spec.name in PROBLEMS.builtins:
        problem = spec.build(*args, dtype=dtype, **values)
    else:
        problem = _plugin_build(spec, args, dtype, values)
    problem.defaults = dict(spec.defaults)
    return problem


def _plugin_build(spec: ProblemSpec, args: tuple, dtype: str, values: dict) -> Problem:
    """A plug-in's problem, built; a build that does not take what it is
    given, fails, or returns no ``Problem`` is refused in one line that
    names the plug-in (its own error's first line, where it raised one)."""
    plugin = f"the problem plug-in {spec.name!r}"
    try:
        inspect.signature(spec.build).bind(*args, dtype=dtype, **values)
    except TypeError as exc:
        given = ", ".join([*(["ARGUMENT"] if args else []), "dtype", *values])
        raise ConfigError(f"{plugin} cannot be built: its build function must take {given} "
                          f"({exc}); see docs/extending.md") from None
    except ValueError:  # no signature to read (a built-in function): it is called
        pass
    try:
        problem = spec.build(*args, dtype=dtype, **values)
    except MonsoonError:
        raise
    except Exception as exc:  # noqa: BLE001 - the plug-in's own error, in one line
        first = next(iter(str(exc).splitlines()), "")
        raise ConfigError(f"{plugin} failed to build: {type(exc).__name__}: {first}") from exc
    if not isinstance(problem, Problem):
        raise ConfigError(f"{plugin} cannot be built: its build function returned a "
                          f"{type(problem).__name__}, not a "
                          "monsoon.problems.Problem (a torch module goes in a TorchProblem; "
                          "see docs/extending.md)")
    return problem

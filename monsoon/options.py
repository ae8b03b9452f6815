"""Options that components declare next to their code.

Every strategy, rule, engine and problem lists its settings as ``Option``
objects in a class attribute ``options``. Everything else derives from that
one declaration: the command line's flags (grouped by component in
``--help``), the keyword arguments of ``monsoon.train``, the checks and
their messages (which name the flag), ``config.json`` and the option
tables of docs/options.md (``monsoon/docs.py``).

Invariants:

- An option's ``name`` is its keyword in ``monsoon.train`` and its key in
  ``config.json``; its ``flag`` (``--name-with-dashes`` unless given) is its
  command-line spelling. Several components may declare the same option
  only with the same ``Option`` object (one meaning, one default).
- ``Option.value`` returns the checked value or raises ``ConfigError`` with
  one line that names the flag (``n push must be a whole number of at least
  1, got 0; fix --n-push``), or, for a value given in Python (``cli=False``),
  the keyword (``fix n_push=``): a caller of ``monsoon.train`` typed no flag.
- A float option's value is finite: nan and inf are refused before its
  check, so a check need not test for them.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable

from .errors import ConfigError


@dataclass(frozen=True, eq=False)
class Option:
    name: str
    type: type = float        # int, float, str or bool (a bool is an on/off switch)
    default: object = None
    help: str = ""
    flag: str | None = None   # default: --name-with-dashes
    check: Callable | None = None   # value -> None if fine, else what it must be
    choices: tuple | None = None
    label: str | None = None  # how messages call it (default: the name, in words)
    const: object = None      # the value of the bare flag, where its argument is optional
    shown_default: str | None = None  # the default in words, where the run decides it

    @property
    def cli(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def metavar(self) -> str:
        """The argument's name in help and docs: --batch-size -> BATCH_SIZE."""
        return self.cli.lstrip("-").upper().replace("-", "_")

    @property
    def words(self) -> str:
        return self.label or self.name.replace("_", " ")

    def named(self, cli: bool = True) -> str:
        """How a message names it: its flag on the command line, its keyword
        in Python (``--beta``: ``hogwild_beta=``)."""
        return self.cli if cli else f"{self.name}="

    def given(self, value, cli: bool = True) -> str:
        """The option as the caller gave it: ``--shards 1000`` on the command
        line, ``shards=1000`` (a string quoted: ``resume="/x"``) in Python."""
        if cli:
            return f"{self.cli} {value}"
        return f'{self.name}="{value}"' if isinstance(value, str) else f"{self.name}={value!r}"

    def value(self, raw, cli: bool = True):
        """``raw`` converted to this option's type and checked; ``cli``: it
        came from the command line (a refusal names the flag), else from
        Python (it names the keyword)."""
        if raw is None:
            return None
        name = self.named(cli)
        value = self._convert(raw, name)
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"unknown {self.words} {value!r}; choose one of: "
                              f"{', '.join(map(str, self.choices))} ({name})")
        if self.check is not None:
            need = self.check(value)
            if need:
                raise ConfigError(f"{self.words} must be {need}, got {raw!r}; fix {name}")
        return value

    def _convert(self, raw, name: str):
        """``raw`` as this option's type; ``name``: how a refusal names it."""
        kind = self.type
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            raise ConfigError(f"{self.words} is a switch: pass True or False, not {raw!r} ({name})")
        # NumPy's scalars count as the numbers they are (a sweep over
        # np.arange or np.float32 values), as Python's own
        if kind is int:
            if isinstance(raw, bool) or not isinstance(raw, numbers.Integral):
                if isinstance(raw, numbers.Real) and not isinstance(raw, bool) \
                        and float(raw).is_integer():
                    return int(raw)
                raise ConfigError(f"{self.words} must be a whole number, got {raw!r}; fix {name}")
            return int(raw)
        if kind is float:
            if isinstance(raw, bool) or not isinstance(raw, numbers.Real):
                raise ConfigError(f"{self.words} must be a number, got {raw!r}; fix {name}")
            try:
                value = float(raw)
            except OverflowError:  # an int past float's range
                value = math.inf
            if not math.isfinite(value):  # no option means anything by nan or inf
                raise ConfigError(f"{self.words} must be a finite number, got {value}; "
                                  f"fix {name}")
            return value
        if not isinstance(raw, kind):
            raise ConfigError(f"{self.words} must be a {kind.__name__}, got {raw!r}; fix {name}")
        return raw

    def describe_default(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.type is bool:
            return "off" if not self.default else "on"
        return "—" if self.default is None else str(self.default)


# -- checks: each returns None when the value is fine, else what it must be --

# The largest seed: every generator a run seeds takes [0, 2**32 - 1] (NumPy's
# default_rng takes any non-negative integer, torch.manual_seed up to 2**64 - 1,
# scikit-learn's random_state and NumPy's legacy seed 2**32 - 1), so a seed is
# refused before the run rather than by whichever generator first sees it.
SEED_MAX = 2**32 - 1


def at_least(low) -> Callable:
    whole = isinstance(low, int)

    def check(v):
        if not v >= low:
            return f"a whole number of at least {low}" if whole else f"at least {low}"
        return None
    return check


def positive(v) -> str | None:
    return None if v > 0 and math.isfinite(v) else "positive"


def non_negative(v) -> str | None:
    return None if v >= 0 and math.isfinite(v) else "0 or more"


def in_range(low, high, *, low_open: bool = False) -> Callable:
    def check(v):
        ok = (low < v if low_open else low <= v) and v <= high
        return None if ok else f"in {'(' if low_open else '['}{low}, {high}]"
    return check


def declared(component) -> tuple[Option, ...]:
    """The options a component (a class or a spec) declares."""
    return tuple(getattr(component, "options", ()) or ())


def option_values(component, given: dict, cli: bool = True) -> dict:
    """Every option of ``component``: the given value (checked, ``cli`` as
    ``Option.value``'s) or its default."""
    return {o.name: o.value(given[o.name], cli) if given.get(o.name) is not None else o.default
            for o in declared(component)}

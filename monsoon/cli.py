"""The ``monsoon`` command line: ``train``, ``compare``, ``simulate`` and
``options`` (DESIGN.md's contract).

The flags are derived from the options the run and its components declare
(``config.RUN_OPTIONS``, each component's ``options``), grouped by the
components that take them. Only the flags given on the command line are
passed on, so an option the chosen components do not take is refused.

Errors in the input print one line, ``monsoon: error: ...``, and exit with
status 2, before any worker starts. A run that fails (a worker error,
divergence, a timeout) prints one line and exits with status 1.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys

from . import __version__
from .config import (COMPARE_DEFAULTS, REPEATS_HELP, RUN, RUN_OPTIONS, SIMULATE_DEFAULTS,
                     registries)
from .errors import ConfigError, Interrupted, MonsoonError, TrainingDiverged
from .options import Option, declared

__all__ = ["main", "build_parser", "option_groups"]

# Run options the commands spell themselves.
_OWN = ("problem", "strategy", "workers", "out", "progress", "epochs", "steps")


def option_groups() -> list[tuple[str, list[Option]]]:
    """(title, options) for each set of components that take the same options,
    by kind: "strategy async", "rule momentum, nesterov", "engine local, ray"."""
    groups: dict[tuple, list[Option]] = {}
    seen: set[str] = set(o.name for o in RUN_OPTIONS)
    for kind, registry in registries().items():
        components = registry.all()
        for option in registry.options().values():
            if option.name in seen:
                continue
            seen.add(option.name)
            takers = [n for n, c in components.items() if option in declared(c)]
            everyone = len(takers) == len(components) and len(takers) > 1
            title = f"{kind}: {f'every {kind}' if everyone else ', '.join(takers)}"
            groups.setdefault((kind, title), []).append(option)
    return [(title, options) for (_, title), options in groups.items()]


def _help(option: Option) -> str:
    choices = f"; one of: {', '.join(map(str, option.choices))}" if option.choices else ""
    default = "" if option.type is bool or option.default is None else \
        f" (default {option.describe_default()})"
    return option.help + choices + default


def _add(group, option: Option, hidden: bool = False) -> None:
    if option.type is bool:
        group.add_argument(option.cli, dest=option.name, action="store_true",
                           default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS if hidden else option.help)
    else:
        # choices are checked by the option itself, in one line that names the flag
        optional = {} if option.const is None else {"nargs": "?", "const": option.const}
        group.add_argument(option.cli, dest=option.name, type=option.type,
                           default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS if hidden else _help(option),
                           metavar=option.metavar, **optional)


def _common(p: argparse.ArgumentParser, problem: str, workers: int,
            engine: str | None = None) -> None:
    """The flags every command takes; with ``engine``, the command runs on that
    engine only: its help offers neither --engine nor other engines' flags,
    which are still parsed, so that the run refuses them in its own words
    (``--backend applies to --engine local only``)."""
    names = registries()
    others = set() if engine is None else {
        o.name for o in names["engine"].options().values()
        if o not in declared(names["engine"].get(engine))}
    problems = ", ".join(spec.usage() for spec in names["problem"].all().values())
    p.add_argument("--problem", default=problem, help=f"one of: {problems} (default {problem})")
    # None where not given: a single-worker strategy refuses only a count asked for
    p.add_argument("--workers", type=int, default=None,
                   help=f"number of workers (default {workers}; serial runs 1, and refuses more)")
    p.set_defaults(default_workers=workers)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--epochs", type=int, default=argparse.SUPPRESS,
                        help="passes over the training set (default: the problem's)")
    budget.add_argument("--steps", type=int, default=argparse.SUPPRESS,
                        help="gradient steps in total, over all workers")
    for option in RUN_OPTIONS:
        if option.name not in _OWN:
            extra = ""
            if option.name in ("engine", "rule"):
                extra = f": {', '.join(names[option.name].names())}"
            _add(p, Option(option.name, option.type, option.default, option.help + extra,
                           option.flag, const=option.const),
                 hidden=option.name == "engine" and engine is not None)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    for title, options in option_groups():
        group = p.add_argument_group(title)
        for option in options:
            _add(group, option, hidden=option.name in others)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose own refusals (an unknown flag, ``--epochs
    0.5``, ``--steps`` with ``--epochs``) are one line, as every other
    refusal is, with where to look instead of the whole usage text."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    strategies = registries()["strategy"].names()
    parser = _Parser(prog="monsoon", description=(
        f"Parallel and distributed SGD behind one switch: {', '.join(strategies)}."))
    parser.add_argument("--version", action="version", version=f"monsoon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train one problem with one strategy")
    train.add_argument("--strategy", default="serial", help=f"one of: {', '.join(strategies)}")
    train.add_argument("--out", default=None, help="run folder (default runs/PROBLEM-STRATEGY)")
    _common(train, "exp", 2)
    simulate = sub.add_parser("simulate", help="train on the sim engine: a virtual cluster "
                              "(time is simulated, the math is real)")
    sim = SIMULATE_DEFAULTS
    simulate.add_argument("--strategy", default=sim["strategy"],
                          help=f"one of: {', '.join(strategies)} (default {sim['strategy']})")
    simulate.add_argument("--out", default=None, help="run folder (default runs/sim-PROBLEM-STRATEGY)")
    _common(simulate, sim["problem"], sim["workers"], engine=sim["engine"])
    compare = sub.add_parser("compare", help="the same problem under several strategies")
    strategies = ",".join(COMPARE_DEFAULTS["strategies"])
    compare.add_argument("--strategies", default=strategies,
                         help=f"comma-separated (default {strategies})")
    compare.add_argument("--out", default=None, help="output folder (default runs/compare-PROBLEM)")
    compare.add_argument("--repeats", type=int, default=COMPARE_DEFAULTS["repeats"],
                         help=f"{REPEATS_HELP} (default {COMPARE_DEFAULTS['repeats']})")
    _common(compare, "exp", 2)
    sub.add_parser("options", help="print every option as Markdown tables, by component")
    parser.commands = sub.choices  # name -> its parser, for refusals in its name
    return parser


def _given(args) -> dict:
    skip = {"command", "problem", "strategy", "strategies", "workers", "default_workers", "out",
            "quiet"}
    options = {k: v for k, v in vars(args).items() if k not in skip}
    if args.quiet:
        options["progress"] = False
    return options


def _workers(args) -> int:
    """The --workers given, else the command's default, checked (--workers 0)."""
    return RUN["workers"].value(args.default_workers if args.workers is None else args.workers)


def _folder(problem: str) -> str:
    """The problem's part of a default run folder's name, one folder: ':'
    becomes '_'; a problem naming a file by a path is its kind, the file's
    name and a short hash of the whole spec (``libsvm:data/d.svm``:
    ``libsvm_d.svm-`` and 6 hex digits), so two files never share a folder."""
    kind, _, rest = problem.partition(":")
    parts = [p for p in re.split(r"[/\\]", rest) if p]
    if len(parts) < 2 and not re.search(r"[/\\]", rest):
        return problem.replace(":", "_")
    digest = hashlib.sha1(problem.encode()).hexdigest()[:6]
    return f"{kind}_{parts[-1] if parts else 'data'}-{digest}"


def _train(args) -> None:
    from .api import train

    options = _given(args)
    prefix = "runs/"
    if args.command == "simulate":
        engine = SIMULATE_DEFAULTS["engine"]
        if options.get("engine") not in (None, engine):
            raise ConfigError(f"monsoon simulate runs on the {engine} engine, not --engine "
                              f"{options['engine']}: drop --engine, or run "
                              f"'monsoon train --engine {options['engine']}'")
        options["engine"], prefix = engine, "runs/sim-"
    single = registries()["strategy"].get(args.strategy).single_worker
    workers = _workers(args)  # serial's default is 1; a count given is train's to refuse
    default = f"{prefix}{_folder(args.problem)}-{args.strategy}"
    out = default if args.out is None else args.out  # --out "" is refused, not the default
    result = train(args.problem, args.strategy, 1 if single and args.workers is None else workers,
                   out=out, cli=True, **options)
    s = result.summary
    if s.get("follower"):  # a torch engine rank other than 0: rank 0 reports
        return
    virtual = registries()["engine"].get(s["engine"]).virtual_time
    rate = s["examples_per_s"]  # None where the run took no time (the sim at no cost)
    print(f"{s['problem']} {s['strategy']} x{s['workers']}: final_loss {s['final_loss']:.6g}, "
          f"{'-' if rate is None else format(rate, '.4g')} examples/s, "
          f"{'simulated' if virtual else 'wall'} "
          f"{s['wall_time_s']:.3g} s (+{s['startup_s']:.2g} s start-up)")
    if "utilization" in s:
        # a part with no time (a run of no step) or no shards (the pipeline) is None
        parts = [f"{name} {s['utilization'][key]:.1%}" for key, name in
                 (("workers", "workers"), ("shards", "server shards"))
                 if s["utilization"].get(key) is not None]
        print(f"utilization: {', '.join(parts) or 'none measured'}; "
              f"simulated in {s['real_time_s']:.3g} s")
    early = s.get("stopped_at_target") or s.get("stopped_converged")
    if early:  # the run ended before its budget, on purpose
        print(f"stopped early: {early}")
    if s["failed_workers"]:
        print("failed workers: " + json.dumps(s["failed_workers"]))
    print(f"run folder: {result.run_dir}")


def _compare(args) -> None:
    from .compare import compare

    out = f"runs/compare-{_folder(args.problem)}" if args.out is None else args.out
    comparison = compare(args.problem, args.strategies, _workers(args), out=out, cli=True,
                         **_given(args))
    print((comparison.out / "report.md").read_text())
    print(f"report: {comparison.out / 'report.md'}  plot: {comparison.out / 'comparison.png'}")


def main(argv=None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # refused by the command's parser: its help is where to look
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "options":
        from .docs import option_tables

        print(option_tables())
        return 0
    try:
        if args.command in ("train", "simulate"):
            _train(args)
        else:
            _compare(args)
    except Interrupted as exc:  # the run folder and a checkpoint are written
        print(f"monsoon: {exc}", file=sys.stderr)
        return exc.exit_code
    except TrainingDiverged as exc:
        print(f"monsoon: {exc}", file=sys.stderr)
        return 1
    except MonsoonError as exc:
        code = 2 if isinstance(exc, ValueError) else 1
        print(f"monsoon: error: {exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("monsoon: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

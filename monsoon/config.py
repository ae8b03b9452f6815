"""The run's configuration, checked at the boundary before any worker starts.

A run has its own options (``RUN_OPTIONS``: the problem, the budget, the
seed...) and takes, besides, the options its chosen strategy, rule, engine
and problem declare (``monsoon/options.py``). Nothing here knows any
component by name: each builds itself from its options' values with
``from_options``.

Invariants: an option that none of the chosen components takes is refused
in one line that names the components that do; every check names the flag
to change (from Python, the keyword: ``resolve``'s ``cli``); the learning
rate, the batch size and the budget default to the problem's suggestions.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import devices as _devices
from .compressors import COMPRESSORS
from .engines import ENGINES, Engine
from .compressors import messages as _messages
from .errors import ConfigError
from .options import SEED_MAX, Option, at_least, declared, in_range, option_values, positive
from .problems import PROBLEMS, Problem, problem_spec
from .record.checkpoints import trajectory
from .rules import RULES, Rule
from .rules.sgd import SGD
from .strategies import STRATEGIES, Budget, RunInfo
from .strategies.base import refuse_short_passes
from .strategies.ops import Apply, Push

FALLBACK = {"lr": 0.01, "epochs": 10, "batch_size": 32}
DTYPES = ("float32", "float64")

RUN_OPTIONS = (
    Option("problem", str, "exp", "a named problem, or NAME:ARGUMENT"),
    Option("strategy", str, "serial", "how workers cooperate"),
    Option("workers", int, 1, "number of workers (serial runs exactly 1)", check=at_least(1)),
    Option("engine", str, "local", "where the workers run"),
    Option("rule", str, "sgd", "the update rule"),
    Option("lr", float, None, "learning rate (default: the problem's)", check=positive,
           label="learning rate"),
    Option("epochs", int, None, "passes over the training set (default: the problem's)",
           check=at_least(1)),
    Option("steps", int, None, "gradient steps in total, over all workers", check=at_least(1)),
    Option("batch_size", int, None, "examples per update (default: the problem's)",
           check=at_least(1), label="batch size"),
    Option("seed", int, 0, "fixes the data order and the initial parameters; 0 to 2**32 - 1",
           check=in_range(0, SEED_MAX)),
    Option("dtype", str, "float32", "parameter precision", choices=DTYPES),
    Option("device", str, "cpu", "where torch problems compute: cpu, cuda (worker k on GPU "
           "k mod GPUs), cuda:N, or auto (cuda where available, else cpu); docs/gpu.md",
           check=_devices.check_spec),
    Option("precision", str, "32", "torch problems: 32 (the module's own dtype), or bf16 "
           "(autocast in bfloat16, float32 master weights); docs/gpu.md",
           choices=("32", "bf16")),
    Option("target_loss", float, None, "stop the run once an evaluated loss is at or below "
           "this, and report the time to reach it: the local, ray, torch and spark engines "
           "stop there (not spark's sync on mini-batches); the sim runs its whole budget and "
           "reports the time"),
    Option("tol", float, None, "stop once an epoch lowers the loss by less than this fraction "
           "of it, as MLlib's tol: the local, ray, torch and spark engines stop there (not "
           "spark's sync; the sim refuses it); a problem's default tol goes with its default "
           "budget, on spark",
           check=lambda v: None if v > 0 else "above 0"),
    Option("compress", str, "none", "compress what each worker sends: none, topk:FRACTION, "
           "randk:FRACTION, qsgd:LEVELS, sign or powersgd:RANK; strategies whose workers send "
           "messages take it (docs/compression.md)",
           check=_messages.check_spec),
    Option("no_error_feedback", bool, False, "send compressed messages without carrying "
           "the residual to the next one (with --compress; refused without it)"),
    Option("evals", int, 100, "loss-curve points: one each 1/EVALS of the example budget, "
           "and one whenever max(0.5 s, 1/EVALS of the time so far) passes without one, so "
           "about EVALS or more (0: none, refused with --target-loss or --tol, which are "
           "checked on these rows)",
           check=lambda v: None if v >= 0 else "0 or more"),
    Option("eval_share", float, 0.5, "the loss curve is evaluated after the run in at most "
           "this share of the run's time (and at least 5 s); past it, rows are thinned evenly",
           check=positive),
    Option("out", str, None, "run folder (the command line's default: runs/PROBLEM-STRATEGY; "
           "simulate: runs/sim-PROBLEM-STRATEGY; compare: its own folder, "
           "runs/compare-PROBLEM, with each strategy's run in OUT/STRATEGY; "
           "monsoon.train writes none unless given); a run there replaces the previous run's "
           "results, and checkpoints of another run (set aside when it starts, given back "
           "if it is refused or ends without a summary of its own); a folder another run is "
           "using is refused (exit 2), and so is a folder monsoon did not write that holds "
           "a file a run (or compare) writes, or where the problem's own data file would be "
           "written over"),
    Option("progress", bool, None, "show a progress bar (default: on a terminal)"),
    Option("live_every", float, 1.0, "write live series (each worker's mini-batch loss, "
           "examples/s, staleness) at most this often, in seconds (0: none); docs/live.md",
           check=lambda v: None if v >= 0 and v == v and v != float("inf") else "0 or more"),
    Option("tensorboard", bool, None, "write TensorBoard event files under OUT/tb (default: "
           "yes where there is a run folder; pip install tensorboard to view them)",
           shown_default="on where there is a run folder"),
    Option("mlflow", str, None, "log the run to MLflow: its config, the live series, the run "
           "folder; the bare flag uses MLFLOW_TRACKING_URI or MLflow's default "
           "(pip install 'monsoon[mlflow]')", const="auto", label="MLflow tracking URI"),
)
RUN = {o.name: o for o in RUN_OPTIONS}
# `monsoon simulate`'s own defaults, where they are not the run's (a virtual
# cluster wants more workers, and more examples to share among them); it
# runs on the sim engine only, so its help shows no --engine.
SIMULATE_DEFAULTS = {"engine": "sim", "strategy": "async", "problem": "logistic", "workers": 64}
# ``monsoon compare``'s own: its --strategies and --repeats (docs/options.md lists them)
COMPARE_DEFAULTS = {"strategies": ("serial", "sync", "async", "hogwild"), "repeats": 1}
REPEATS_HELP = ("run every strategy this many times, in rotation, and report the median "
                "speeds and their ranges")


def registries() -> dict:
    """The component registries, by kind, in the order their options are listed."""
    return {"strategy": STRATEGIES, "rule": RULES, "engine": ENGINES, "problem": PROBLEMS,
            "compressor": COMPRESSORS}


def component_options() -> dict[str, Option]:
    found: dict[str, Option] = {}
    for registry in registries().values():
        for name, option in registry.options().items():
            found.setdefault(name, option)
    return found


# the command line's flags and other libraries' names that monsoon spells otherwise
API_SPELLINGS = {"quiet": "progress=False", "no_progress": "progress=False", "learning_rate": "lr",
                 "n_epochs": "epochs", "max_iter": "epochs"}


def _spellings(name: str, valid: list[str]) -> list[str]:
    """What an unknown option ``name`` may have meant: the API's spelling of
    a command-line flag, or the valid names it is close to or part of
    (``beta``: ``hogwild_beta``)."""
    import difflib

    if name in API_SPELLINGS:
        return [API_SPELLINGS[name]]
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.75)
    close += [v for v in valid if v not in close and name in v.split("_")]
    return close[:3]


def _chosen(kind: str, names, cli: bool) -> str:
    """Components of ``kind`` as the caller chooses them: ``--strategy
    serial, hogwild`` on the command line, ``strategy="serial", "hogwild"``
    in Python."""
    if cli:
        return f"{registries()[kind].flag} {', '.join(names)}"
    return f"{kind}=" + ", ".join(f'"{n}"' for n in names)


def refuse_untaken(given, chosen: dict[str, list[str]], cli: bool = True) -> None:
    """Refuse an option that is unknown, or that no chosen component takes.
    ``chosen`` maps each kind to the names chosen (compare chooses several
    strategies; a Problem instance is no named problem); ``cli``: the
    options came from the command line (the refusal names flags), else from
    Python (keywords)."""
    known = component_options()
    unknown = sorted(set(given) - set(RUN) - set(known))
    if unknown:
        valid = sorted(set(RUN) | set(known))
        hints = {name: _spellings(name, valid) for name in unknown}
        if any(hints.values()):
            said = ", ".join(f"{name} (did you mean {' or '.join(hints[name])}?)"
                             if hints[name] else name for name in unknown)
            raise ConfigError(f"unknown option(s) {said}; `monsoon options` lists them all")
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; valid options: "
                          f"{', '.join(valid)}")
    for name in given:
        if name in RUN:
            continue
        takers = {kind: registry.takers(name) for kind, registry in registries().items()}
        if any(set(chosen.get(kind, ())) & set(names) for kind, names in takers.items()):
            continue
        kind, names = next((k, n) for k, n in takers.items() if n)
        mine = (_chosen(kind, chosen[kind], cli) if chosen.get(kind) else
                f"{registries()[kind].flag} given here" if cli else f"the {kind} given here")
        raise ConfigError(f"{known[name].named(cli)} applies to {_chosen(kind, names, cli)} "
                          f"only; {mine} does not take it")


def for_strategy(options: dict, strategy: str) -> dict:
    """The options that concern ``strategy``: those of other strategies are
    left out (``compare`` passes one set of options to several), and a
    per-strategy ``--compress S=SPEC,...`` becomes this strategy's spec. One
    spec for every strategy compresses those that send messages
    (``messages.sends_messages``); the others run uncompressed, as they
    would with it."""
    out = {k: v for k, v in options.items()
           if not STRATEGIES.takers(k) or strategy in STRATEGIES.takers(k)}
    specs = _messages.by_strategy(out.get("compress"))
    if specs is not None:  # --compress STRATEGY=SPEC,...: this strategy's, else none
        out["compress"] = specs.get(strategy, "none")
    elif out.get("compress") is not None and not _messages.sends_messages(
            STRATEGIES.get(strategy)):
        out["compress"] = "none"
    if not _compressed(out.get("compress")):  # nothing of this strategy's is compressed
        out.pop("no_error_feedback", None)
    return out


def _compressed(spec) -> bool:
    """Whether ``--compress``'s value compresses anything: one spec, or
    any of compare's ``STRATEGY=SPEC,...``."""
    specs = _messages.by_strategy(spec)
    return any(_messages.parse(one)[0] != "none"
               for one in (specs.values() if specs is not None else [spec or "none"]))


def check_error_feedback(spec, no_error_feedback, cli: bool = True) -> None:
    """Refuse, in one line, ``--no-error-feedback`` where nothing is
    compressed: it only changes how compressed messages are sent, and would
    be recorded in config.json while changing nothing."""
    if no_error_feedback and not _compressed(spec):
        flag, compress = ((RUN["no_error_feedback"].cli, "--compress (e.g. --compress "
                           "topk:0.01)") if cli else
                          ("no_error_feedback=", 'compress= (e.g. compress="topk:0.01")'))
        raise ConfigError(f"{flag} applies to compressed runs only; add {compress}, or drop "
                          f"{flag}")


def check_compare_compress(spec, strategies: list[str]) -> None:
    """``compare``'s ``--compress``, refused in one line before any run: a
    spec named for a strategy that sends no messages, or one spec for
    strategies none of which does (``messages.check_strategy``), each line
    ending with what to change in compare's own flags."""
    if spec is None:
        return
    specs = _messages.by_strategy(spec)
    if specs is None:
        if _messages.parse(spec)[0] == "none" or any(
                _messages.sends_messages(STRATEGIES.get(s)) for s in strategies):
            return
        takers = ", ".join(_messages.senders(STRATEGIES.all()))
        _messages.check_strategy(spec, STRATEGIES.get(strategies[0]), STRATEGIES.all(),
                                 f"drop --compress, or add to --strategies "
                                 f"({','.join(strategies)}) one that sends messages: {takers}")
        return
    for name, one in specs.items():
        if name in strategies and _messages.parse(one)[0] != "none":
            _messages.check_strategy(one, STRATEGIES.get(name), STRATEGIES.all(),
                                     f"drop {name}={one} from --compress")


@dataclass
class Resolved:
    run: dict                # the run's options, defaults filled in
    values: dict             # kind -> that component's option values
    problem: Problem
    rule: object             # the rule the server (the engine) applies
    strategy: object
    engine: object
    budget: Budget
    processes: int           # workers the engine starts (backups included)
    devices: list | None = None   # each worker's device (``devices.plan``)
    cli: bool = True         # given on the command line (messages name flags), else in Python

    def config(self) -> dict:
        """Every setting of the run, flat: what config.json records."""
        out = dict(self.run)
        for values in self.values.values():
            out.update(values)
        return out


def _check_full_batch(run: dict, engine) -> None:
    """A full-batch rule (lbfgs) needs each step's loss, on the whole vector:
    the strategies an engine hands it to (``Engine.gives_loss``)."""
    rule, strategy = run["rule"], run["strategy"]
    if not engine.gives_loss(STRATEGIES.get(strategy)):
        pairs = {name: [s for s, kind in sorted(STRATEGIES.all().items()) if cls.gives_loss(kind)]
                 for name, cls in ENGINES.all().items()}
        options = "; ".join(f"--engine {name} --strategy {' or '.join(takes)}"
                            for name, takes in pairs.items() if takes)
        raise ConfigError(f"rule {rule} takes one full-batch step at a time with its loss; "
                          f"{run['engine']} does not give it to {strategy}: use {options}")


def _check_delays(rule, strategy, run: dict, given, shared, cli: bool) -> None:
    """``--staleness-lr`` and a rule that keeps each worker's read
    (``Rule.init_reader``: dcasgd, adarevision) act on stale updates. A
    strategy whose rule runs on each worker's private copy
    (``Strategy.local_rule``: local SGD, EASGD; its server's rule is its
    own) applies it with staleness 0 and no read: they would change
    nothing yet be recorded, so they are refused, but where ``compare``
    gives them to every strategy (``shared``), as ``--beta`` is."""
    import numpy as np

    if strategy.local_rule is None:
        return
    mine = set(given) - set(shared)
    if rule.staleness_lr and "staleness_lr" in mine:
        flag = component_options()["staleness_lr"].named(cli)
        what, instead = f"{flag} divides the rate by an update's staleness", f"drop {flag}"
    elif rule.init_reader(1, np.float64)._fields and "rule" in mine:
        what = f"rule {run['rule']} adjusts each gradient's step for its delay"
        instead = "use another rule"
    else:
        return
    stale = {Push, Apply}  # the ops that apply an update a worker read before others
    *some, last = sorted(name for name, cls in STRATEGIES.all().items()
                         if stale & set(cls.uses) and not cls.single_worker)
    where = f"{', '.join(some)} or {last}" if some else last
    raise ConfigError(f"{what}, but {run['strategy']} applies the rule to each worker's "
                      "private copy, where no update is stale, so it would change nothing: "
                      f"{instead}, or train with --strategy {where}")


def _mine(given, shared) -> set:
    """The options given to this run alone (not by ``compare`` to every
    strategy), and not as None."""
    return {k for k in set(given) - set(shared) if given[k] is not None}


def _check_schedule(values: dict, given, shared, cli: bool) -> None:
    """``--lr-gamma`` and ``--lr-step-size`` shape the step schedule: with
    a constant one they would change nothing yet be recorded, so they are
    refused, but where ``compare`` gives them to every strategy
    (``shared``), as ``--beta`` is."""
    if values.get("lr_schedule", "constant") != "constant":
        return
    mine = _mine(given, shared)
    unused = [k for k in ("lr_gamma", "lr_step_size") if k in mine]
    if unused:
        known = component_options()
        flags = " and ".join(known[k].named(cli) for k in unused)
        step = "--lr-schedule step" if cli else 'lr_schedule="step"'
        raise ConfigError(f"{flags} shape{'s' if len(unused) == 1 else ''} the step schedule, "
                          f"but the learning rate is constant here: add {step}, or drop {flags}")


# options one of which drops the other when both are given (or, with a value
# of None, when the first is given and the second's value leaves it nothing to do)
_PAIRS = (
    ("cuts", "balance", "{0} places the stages, and {1} only balances stages placed "
     "without it"),
    ("sim_stage_compute_s", "sim_compute_s", "{0} gives each stage's time, in place of {1}"),
)


def _check_pairs(values: dict, given, shared, cli: bool) -> None:
    """Refuse, in one line, two options given together where one drops the
    other, and ``--straggler-factor`` without stragglers to slow (neither
    ``--straggler-p`` nor ``--slow-fraction``): recorded, they would change
    nothing. As ``--beta``, what ``compare`` gives every strategy is taken."""
    mine = _mine(given, shared)
    known = component_options()
    for kept, dropped, why in _PAIRS:
        if {kept, dropped} <= mine:
            flags = known[kept].named(cli), known[dropped].named(cli)
            raise ConfigError(why.format(*flags) + f": give {flags[0]} or {flags[1]}, not both")
    engine = values["engine"]
    if ("sim_straggler_factor" in mine and not engine.get("sim_straggler_p")
            and not engine.get("sim_slow_fraction")):
        flag = known["sim_straggler_factor"].named(cli)
        raise ConfigError(f"{flag} slows stragglers, and there are none: add "
                          f"{known['sim_straggler_p'].named(cli)} or "
                          f"{known['sim_slow_fraction'].named(cli)}, or drop {flag}")


def _standardize(problem, name: str, rules) -> None:
    """Give each rule that asks for it (``Rule.wants_metric``: AdaGrad's
    standardize_below) the problem's inverse feature variances."""
    wanting = {id(r): r for r in rules if r is not None and r.wants_metric}
    if not wanting:
        return
    if problem.inverse_variance is None:
        raise ConfigError(f"rule {name}'s standardize_below needs each feature's variance, "
                          f"which {problem.name} does not give (a linear problem does: "
                          "spark:PATH, a libsvm file); drop --standardize-below")
    metric = problem.inverse_variance()
    for r in wanting.values():
        r.precondition(metric)


def check_rule(name: str, rule) -> None:
    """Refuse, in one line and before any worker starts, a rule class that
    the engines could not run: one that is not a ``Rule``, that lacks its
    ``apply``, or whose ``__init__`` does not take what
    ``Rule.from_options`` gives it."""
    broken = f"rule {name!r} does not follow the rule contract: "
    if not (isinstance(rule, type) and issubclass(rule, Rule)):
        raise ConfigError(broken + "its class must subclass monsoon.rules.Rule (docs/extending.md)")
    if rule.apply is Rule.apply:
        raise ConfigError(broken + f"its class {rule.__name__} must define apply(w, g, state, "
                          "info), the update (docs/extending.md)")
    if getattr(rule.from_options, "__func__", None) is Rule.from_options.__func__:
        import inspect

        common = {o.name for o in Rule.options}
        own = {o.name: o.default for o in declared(rule) if o.name not in common}
        try:  # what Rule.from_options calls it with
            inspect.signature(rule).bind(None, staleness_lr=False, **own)
        except TypeError as exc:
            raise ConfigError(broken + f"its __init__(schedule, ...) must take **common (the "
                              "options every rule takes, such as staleness_lr) and hand them "
                              "to Rule.__init__, and a keyword for each option of its own "
                              f"({exc}); see docs/extending.md") from None


def resolve(problem, strategy: str, workers: int, given: dict,
            shared: frozenset = frozenset(), cli: bool = True) -> Resolved:
    """Check the options, fill in defaults and build the run's components.
    ``problem`` is a name or a ``Problem``; ``shared``: the given options
    that are passed to several runs at once (``compare``), which a run that
    has no use for them takes without refusing them; ``cli``: they came
    from the command line, else from Python (``Option.value``). Raises
    ConfigError."""
    instance = problem if isinstance(problem, Problem) else None
    if instance is None and not isinstance(problem, str):
        raise ConfigError("problem must be a problem's name or a Problem instance")
    run = {o.name: o.default for o in RUN_OPTIONS}
    for name, raw in {**given, "problem": problem if instance is None else instance.name,
                      "strategy": strategy, "workers": workers}.items():
        if name in RUN and raw is not None:
            run[name] = RUN[name].value(raw, cli)
    if instance is not None:  # a built problem trains in its own precision
        import numpy as np

        own = str(np.dtype(instance.dtype))
        if given.get("dtype") is not None and run["dtype"] != own:
            raise ConfigError(f"dtype {run['dtype']} was given, but the problem was built in "
                              f"{own}, and trains in it; drop dtype, or build the problem in "
                              f"{run['dtype']}")
        run["dtype"] = own
    if run["epochs"] is not None and run["steps"] is not None:
        raise ConfigError("give either --epochs or --steps, not both")
    check_error_feedback(run["compress"], run["no_error_feedback"], cli)
    spec = problem_spec(run["problem"])[0] if instance is None else None
    if spec is not None and spec.engine is not None and run["engine"] != spec.engine:
        raise ConfigError(f"problem {run['problem']} lives in {spec.engine} and trains on the "
                          f"{spec.engine} engine only; add --engine {spec.engine}")
    defaults = spec.defaults if spec is not None else \
        dict(instance.defaults or {})
    override = defaults.get("by_strategy", {}).get(run["strategy"], {})
    if ("rule" in override and RULES.get(override["rule"]).full_batch
            and (given.get("batch_size") is not None or not ENGINES.get(run["engine"]).gives_loss(
                STRATEGIES.get(run["strategy"])))):
        override = {}  # mini-batches asked for, or an engine without the step's loss
    defaults = {**defaults, **override}
    if given.get("rule") is None and "rule" in defaults:  # the problem's rule (spark:PATH)
        run["rule"] = defaults["rule"]
    components = {"strategy": STRATEGIES.get(run["strategy"]), "rule": RULES.get(run["rule"]),
                  "engine": ENGINES.get(run["engine"])}
    chosen = {kind: [run[kind]] for kind in components}
    if spec is not None:
        components["problem"], chosen["problem"] = spec, [spec.name]
    refuse_untaken(given, chosen, cli)
    check_rule(run["rule"], components["rule"])
    values = {kind: option_values(c, given, cli) for kind, c in components.items()}
    if run["rule"] == defaults.get("rule"):  # the problem's rule: its values for its options
        values["rule"].update({k: v for k, v in defaults.items()
                               if k in values["rule"] and given.get(k) is None})
    _check_schedule(values["rule"], given, shared, cli)
    _check_pairs(values, given, shared, cli)
    # the problem's values for the engine's options (spark: data's average_epochs)
    values["engine"].update({k: v for k, v in defaults.items()
                             if k in values["engine"] and given.get(k) is None})

    full_batch = components["rule"].full_batch
    if full_batch:  # the rule's own defaults (lbfgs: 100 full-batch steps) before the problem's
        if run["tol"] is not None:
            raise ConfigError(f"--tol stops mini-batch runs; {run['rule']} takes full-batch "
                              "steps and stops by their count (--epochs) or --target-loss: "
                              "drop --tol")
        defaults = {k: v for k, v in defaults.items() if k not in ("steps", "batch_size", "tol")}
        defaults.update(getattr(components["rule"], "defaults", {}))
        _check_full_batch(run, components["engine"])
    lr_given = run["lr"] is not None
    if not lr_given:
        run["lr"] = defaults.get("lr", FALLBACK["lr"])
    if run["batch_size"] is None and not full_batch:
        run["batch_size"] = defaults.get("batch_size", FALLBACK["batch_size"])
    engine_cls, strategy_cls = components["engine"], components["strategy"]
    evaluates = engine_cls.evaluates_while_running(strategy_cls)
    if run["tol"] is not None and not engine_cls.stops_on_loss(strategy_cls):
        raise ConfigError(f"--tol needs the loss evaluated while the run goes, which the "
                          f"{run['engine']} engine does not do for {run['strategy']}: drop "
                          "--tol (--epochs or --steps bound the run)")
    _check_evals(run, engine_cls, strategy_cls, full_batch, cli)
    if run["epochs"] is None and run["steps"] is None:
        if run["tol"] is None and evaluates:
            run["tol"] = defaults.get("tol")  # the problem's stopping rule, with its budget
        if "steps" in defaults:
            run["steps"] = defaults["steps"]
        else:
            run["epochs"] = defaults.get("epochs", FALLBACK["epochs"])

    def build(lr):  # the rule and the strategy at learning rate lr
        rule = components["rule"].from_options(lr, **values["rule"])
        info = RunInfo(workers=run["workers"], lr=lr, out=run["out"], cli=cli)
        return (rule, *components["strategy"].from_options(info, rule, **values["strategy"]))

    rule, strat, server_rule = build(run["lr"])
    _check_delays(rule, strat, run, given, shared, cli)
    if instance is None:
        from .problems import make_problem

        instance = make_problem(run["problem"], run["dtype"], **values["problem"])
    if full_batch:  # every step sees every example
        if run["batch_size"] not in (None, instance.n_examples):
            raise ConfigError(f"rule {run['rule']} takes the full batch each step; drop "
                              f"--batch-size (or give {instance.n_examples}, every example)")
        run["batch_size"] = instance.n_examples
        if instance.inverse_variance is not None:  # MLlib's standardization, as H_0
            server_rule.precondition(instance.inverse_variance())
    processes = run["workers"] + strat.backup_workers
    largest = strat.largest_batch(processes, instance.n_examples)
    if run["batch_size"] > largest and given.get("batch_size") is None:
        run["batch_size"] = largest  # a default batch larger than the data a worker draws from
    budget = Budget(epochs=run["epochs"], steps=run["steps"])
    if (not lr_given and defaults.get("lr_per_example") and isinstance(rule, SGD)
            and not _loop_runs(components["engine"], instance, rule, strat, budget, given)):
        run["lr"] *= run["batch_size"]  # the per-example step, over a batch's mean gradient
        rule, strat, server_rule = build(run["lr"])
    _standardize(instance, run["rule"], (server_rule, rule, strat.local_rule))
    info = RunInfo(workers=run["workers"], lr=run["lr"], out=run["out"], problem=instance,
                   device=run["device"], cli=cli)
    if not (isinstance(components["engine"], type) and issubclass(components["engine"], Engine)):
        raise ConfigError(f"engine {run['engine']!r} does not follow the engine contract: its "
                          "class must subclass monsoon.engines.Engine (docs/extending.md)")
    engine = components["engine"].from_options(info, **values["engine"])
    engine.given = frozenset(given)
    engine.cli = strat.cli = cli
    engine.shared = frozenset(shared)
    engine.compression = _messages.Compression.from_run(run["compress"],
                                                        run["no_error_feedback"], instance)
    if engine.compression.active:
        _messages.check_strategy(run["compress"], strat, STRATEGIES.all())
        _messages.check_engine(engine, strat)
    engine.check(strat, processes)  # refused in one line before any work starts
    strat.validate(processes, run["batch_size"], instance.n_examples)
    if run["batch_size"] > instance.n_examples:
        raise ConfigError(f"batch size {run['batch_size']} is larger than the "
                          f"{instance.n_examples} training examples; use --batch-size "
                          f"{instance.n_examples} or less")
    if run["batch_size"] > largest:
        raise ConfigError(f"batch size {run['batch_size']} is larger than a worker's part of "
                          f"the data: each {run['strategy']} worker draws its batches from its "
                          f"own {largest} of the {instance.n_examples} examples; use "
                          f"--batch-size {largest} or less, or fewer workers")
    # what the strategy and engine would refuse once started, refused now,
    # before the run folder is touched
    strat.preflight(instance, processes, run["batch_size"])
    _check_fewest_rows(instance, strat, processes, run)
    engine.preflight(instance, strat, processes, run["batch_size"])
    _check_beta(engine, instance, server_rule, strat, budget, given, shared)
    device = _devices.choose(run["device"], instance, strat, engine, processes, rule=server_rule)
    if run["precision"] != "32":
        _devices.check_precision(run["precision"], instance)
    resolved = Resolved(run, values, instance, server_rule, strat, engine, budget, processes,
                        _devices.plan(device, engine, processes), cli)
    engine.settings = trajectory(resolved.config())  # what its checkpoints' identity holds
    return resolved


def _check_evals(run: dict, engine, strategy, full_batch: bool, cli: bool) -> None:
    """``--target-loss`` and ``--tol`` are checked on the loss curve's rows
    (``Recorder.record``; the sim reports ``time_to_target_s`` from them):
    with ``--evals 0`` there are none, so the run would never stop there nor
    report a time to the target. Refused in one line before the run, but
    where the engine stops at the target from each full-batch step's own
    loss (``Engine.stops_at_step_loss``: spark's sync L-BFGS)."""
    if run["evals"] != 0:
        return
    for name in ("target_loss", "tol"):
        if run[name] is None or (name == "target_loss" and full_batch
                                 and engine.stops_at_step_loss(strategy)):
            continue
        flag, evals = RUN[name].named(cli).rstrip("="), RUN["evals"]
        raise ConfigError(f"{flag} is checked on the loss curve's rows and "
                          f"{evals.given(0, cli)} records none: give {evals.named(cli)}"
                          f"{' ' if cli else ''}1 or more, or drop {flag}")


def _check_fewest_rows(problem, strategy, workers: int, run: dict) -> None:
    """A model that cannot take a forward pass of one example in training
    (BatchNorm: ``fewest_rows``) is refused, in one line naming a batch
    size that works, where the strategy's plan would hand a worker one (an
    epoch's short last batch, or a batch cut among the workers): it failed
    in a worker after an epoch. The plan is never changed for it."""
    if problem.fewest_rows is None:
        return
    need, why = problem.fewest_rows()
    n, size, steps = problem.n_examples, run["batch_size"], run["steps"]

    def fewest(b):
        return min(strategy.pass_sizes(workers, b, n, steps), default=need)

    refuse_short_passes(
        need, why, fewest, size, min(strategy.largest_batch(workers, n), n),
        f"{strategy.name} with {workers} worker{'s' if workers > 1 else ''} at batch size {size} "
        f"on {n} examples gives a worker one (an epoch's short last batch, or a batch cut among "
        "the workers)",
        f"no batch size gives every pass {need} or more with {workers} workers: use fewer workers")


def _loop_runs(engine, problem, rule, strategy, budget, given) -> bool:
    """Whether the engine runs the problem's compiled per-example loop
    (``uses_kernel``: the local engine's condition) instead of mini-batches."""
    uses_kernel = getattr(engine, "uses_kernel", None)
    return uses_kernel is not None and uses_kernel(problem, rule, strategy, budget,
                                                   frozenset(given))


def _check_beta(engine, problem, rule, strategy, budget, given, shared) -> None:
    """``--beta`` scales the step size of the compiled per-example loop
    each epoch, and nothing else: given where the engine does not run that
    loop (``uses_kernel``: the local engine's condition), it would be
    recorded and have no effect, so it is refused, as ``--shards`` without
    a server to split is (its default is not, nor a value ``compare`` gives
    every strategy)."""
    if "hogwild_beta" not in set(given) - set(shared):
        return
    if not _loop_runs(engine, problem, rule, strategy, budget, given):
        raise ConfigError("--beta scales the step size per epoch of the compiled per-example "
                          "loop, which this run does not use (it needs the local engine, a "
                          "sparse problem, plain sgd at one rate, an --epochs budget and no "
                          "--batch-size): drop --beta")


__all__ = ["RUN_OPTIONS", "Resolved", "resolve", "refuse_untaken", "for_strategy",
           "check_compare_compress", "check_error_feedback",
           "registries", "component_options", "declared"]

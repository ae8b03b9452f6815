"""The engine contract: what every engine is, and when it takes a strategy.

An engine carries out the ops of a strategy's worker program
(``strategies/ops.py``) on real or virtual workers. It declares:

- ``name``, ``options`` (``monsoon.options.Option``), ``from_options(run,
  **values)``, ``run(...) -> EngineResult`` and ``describe()``; by default
  the options' values are the constructor's keywords (``arguments``) and
  ``describe`` reports the attributes named in ``described``;
- ``virtual_time``: its clock is simulated (the recorder then charges no
  evaluation cost to the run);
- ``evaluates_while_running(strategy)``, so a problem's default ``tol``
  applies; ``stops_on_loss(strategy)``, so ``--tol`` is taken (below);
- ``stops_on_signal``: SIGTERM/SIGINT make it stop its workers, write a
  final checkpoint and return (``lifecycle.StopSignals``);
- ``keeps_buffers(strategy)``, ``keeps_private_copies``, ``checkpoint_shapes``:
  what its checkpoints hold (BatchNorm's statistics, local SGD's and EASGD's
  copies, more arrays); ``--resume`` without them is refused (``check_resume``);
- ``ops``: the op classes it carries out, and ``meets``: the needs (below)
  it meets.

A strategy declares the ops its program yields (``Strategy.uses``) and the
needs of one configuration (``Strategy.needs(workers)``). An engine takes a
strategy when it carries out every op the program uses and meets every
need; otherwise ``refusal`` says, in one line, the first op or need it
lacks and the engines that have it. No engine compares strategy names: a
third-party strategy is treated like a built-in one.

A strategy that needs ``STAGES`` (``pipeline``) has no program of the
ops: an engine that meets it runs the stages with its own runner
(``pipeline.py`` in its package), handed over at the top of ``run``.

Shared pieces live outside every engine's package, never in one of them:
``shared_memory.SharedArrays``, ``record/checkpoints.py``; under
``server/``: ``shards`` (``shard_bounds``, ``DEFAULT_MAX_SHARDS``,
``replicates``), ``reduce``; under ``monitor/``: ``waiting``,
``processes`` (spawning worker processes), ``tally`` (``EngineResult``,
the result from the workers' end reports).
"""
from __future__ import annotations

from ..compressors.messages import Compression
from ..errors import ConfigError
from ..monitor.tally import EngineResult
from ..strategies import ops as _ops
from ..strategies.base import BACKUP_WORKERS, ELASTIC, SHARED_MEMORY, STAGES
from .options import CHECKPOINT_EVERY, RESUME, checkpoint_paths, refuse_checkpoints

# The needs a strategy may declare (``Strategy.needs``), and engines meet (``Engine.meets``).
NEEDS = {
    SHARED_MEMORY: "several workers updating one parameter array in place, with no lock",
    BACKUP_WORKERS: "steps that take the first N of N + b workers' contributions",
    STAGES: "stage workers that pass activations and gradients to each other",
    ELASTIC: "synchronous steps that carry on with the workers left when one is lost, and "
             "take a returning one back",
}

# What carrying out each op takes, for the refusal's one line.
OP_MEANING = {
    _ops.Gradient: "a gradient on the worker's data",
    _ops.Apply: "an in-place update of the parameters by the worker itself",
    _ops.SGDPass: "a compiled per-example loop over the shared parameters",
    _ops.Fetch: "a read of the server's parameters",
    _ops.Push: "a server that applies each push the moment it arrives",
    _ops.LocalStep: "a step on the worker's own copy",
    _ops.AllReduce: "a synchronous step over every worker's gradient",
    _ops.Average: "a synchronous average of the workers' drifts",
    _ops.LocalApply: "the inner rule on the worker's own copy",
    _ops.Elastic: "an elastic exchange with the centre parameters",
    _ops.Clock: "a clock per worker that holds a worker back to a staleness bound",
}
ALL_OPS = frozenset(OP_MEANING)

# The keys of config.json and summary.json for engine attributes named otherwise.
SUMMARY_KEYS = {"timeout": "timeout_s", "resume_dir": "resumed_from"}


class Engine:
    """Base class of every engine (monsoon's and third parties')."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        names = cls.__dict__.get("gives_loss")
        if isinstance(names, (set, frozenset)):
            # The older declaration, a set of strategy names: a non-empty one
            # said the engine hands whole steps their loss. The strategies'
            # own declaration (``full_batch_steps``) now says which those are.
            gives = bool(names)
            cls.gives_loss = classmethod(lambda _, strategy: gives and strategy.full_batch_steps)

    @staticmethod
    def keeps_buffers(strategy) -> bool:
        return False

    def checkpoint_shapes(self, problem, strategy, w0, workers: int) -> dict:
        """The arrays this engine's checkpoints of this run hold besides the
        parameters and rule state, as ``checkpoints.shapes``'s ``extra``
        ({name: (shape, dtype)}; {} by default): ``--resume`` refuses a
        checkpoint without them in one line (``checkpoints.check_resume``),
        and the engine's own resume asks for them."""
        return {}

    @staticmethod
    def restarted_launch() -> str | None:
        """The launch this process belongs to where a restarted attempt of it
        (torchrun --max-restarts) starts the run again, without --resume,
        and resumes its own folder's newest checkpoint: a new run there
        keeps the checkpoints of its identity that this launch wrote (their
        meta's ``launch``), and removes every other. None (every engine but
        torch, and torch's own launcher before any rank starts): it keeps
        none."""
        return None

    name = "engine"
    options: tuple = ()
    virtual_time = False
    stops_on_signal = False
    keeps_private_copies = True
    # Its checkpoints hold the private copies' inner rule state (momentum,
    # AdaGrad's sums, a schedule's step count): False, a stateful inner rule's
    # --resume is refused (``checkpoints.resume_refusal``).
    keeps_inner_state = True
    shared: frozenset = frozenset()  # those of them compare passes to every strategy
    cli = True  # the options came from the command line, else from Python (resolve sets it)
    given: frozenset = frozenset()  # the options the user set (resolve fills it in): an
    #                                 engine may pick its own value for the others
    ops: frozenset = frozenset()
    meets: frozenset = frozenset()
    backend_used: str | None = None   # how workers ran (summary.json's "backend")
    shards_used: int | None = None    # parameter-server shards, where the engine has them
    # How a worker finds its GPU under --device cuda (monsoon/devices.py): "index"
    # (worker k: cuda:(k mod GPUs)), "assigned" (the scheduler's), None (CPU only).
    device_placement: str | None = None
    compresses = False   # carries out --compress (compressors/messages.py)
    compression = Compression()  # the run's --compress (none by default), set before ``run``
    # The run's settings that shape its trajectory (``checkpoints.trajectory``,
    # set by resolve): its checkpoints' identity holds them (None: not compared).
    settings: dict | None = None

    # The attributes ``describe`` reports (config.json and summary.json), in
    # order, each under its own name or the key ``SUMMARY_KEYS`` gives it.
    described: tuple = ()

    @classmethod
    def from_options(cls, run, **values):
        return cls(**cls.arguments(run, **values))

    @classmethod
    def arguments(cls, run, **values) -> dict:
        """The constructor's keyword arguments from the options' values, each
        missing one at its declared default. Where the engine declares
        ``CHECKPOINT_EVERY`` and ``RESUME``, those two become
        ``checkpoint_dir``, ``checkpoint_every`` and ``resume_dir``
        (``checkpoint_paths``). An engine adds what is its own here."""
        args = {**{o.name: o.default for o in cls.options}, **values}
        if CHECKPOINT_EVERY in cls.options and RESUME in cls.options:
            args.update(checkpoint_paths(run.out, args.pop("checkpoint_every"),
                                         args.pop("resume")))
        return args

    def option(self, name: str):
        """Its option ``name``: ``.named(self.cli)`` and ``.given(value,
        self.cli)`` name it as the caller gave it (a flag, or a keyword)."""
        return next(o for o in type(self).options if o.name == name)

    def describe(self) -> dict:
        return {"engine": self.name,
                **{SUMMARY_KEYS.get(a, a): getattr(self, a) for a in self.described}}

    @classmethod
    def evaluates_while_running(cls, strategy) -> bool:
        """Whether the recorder evaluates the loss while a run of
        ``strategy`` goes, asked or not (``check_target``, as spark does
        between its jobs)."""
        return False

    @classmethod
    def stops_on_loss(cls, strategy) -> bool:
        """Whether a run of ``strategy`` given ``--target-loss`` or ``--tol``
        stops at the recorder's check of a row's loss (``check_target``): any
        engine on real time; the sim's virtual clock runs its whole budget."""
        return not cls.virtual_time

    @classmethod
    def stops_at_step_loss(cls, strategy) -> bool:
        """Whether ``--target-loss`` is checked on each full-batch step's
        own loss (``Recorder.target_met``), not only on the curve's rows,
        when this engine runs ``strategy`` (a class) with a full-batch rule."""
        return False

    @classmethod
    def gives_loss(cls, strategy) -> bool:
        """Whether this engine hands the rule each step's full-batch loss
        (``UpdateInfo.loss``: lbfgs) when it runs ``strategy`` (a class),
        one whose updates are whole steps (``Strategy.full_batch_steps``)."""
        return False

    def shares_device_arrays(self) -> bool:
        """Whether the workers are threads of this process, sharing one device
        tensor of parameters on a GPU (``devices.choose``)."""
        return False

    def run(self, problem, rule, strategy, w0, workers: int, batch_size: int, seed: int,
            budget, recorder) -> EngineResult:
        raise NotImplementedError

    def check(self, strategy, workers: int) -> None:
        """Refuse, in one line, a strategy this engine cannot carry out."""
        reason = refusal(self, strategy, workers)
        if reason is not None:
            raise ConfigError(reason)

    def preflight(self, problem, strategy, workers: int, batch_size: int) -> None:
        """Refuse, in one line, what this engine would otherwise refuse only
        once the run has started: ``config.resolve`` calls it (after
        ``check``), before the run folder is touched, so that a refused run
        writes nothing and leaves a previous run's folder as it was. By
        default: checkpoint options asked of a run that writes none, on
        every engine alike (``refuse_checkpoints``), and a ``--resume``
        folder with no checkpoints folder. An engine adds its own checks
        here."""
        refuse_checkpoints(self, strategy, workers)
        shards = getattr(self, "shards", None)
        if shards and "shards" in self.given and shards > problem.n_params:
            option = self.option("shards")
            raise ConfigError(f"{option.given(shards, self.cli)}: {problem.name} has "
                              f"{problem.n_params} parameters, and a shard holds at least one; "
                              f"use {option.given(problem.n_params, self.cli)} or fewer")


def _lacks(engine, strategy, workers: int):
    """The first op or need of ``strategy`` that ``engine`` (an instance or
    a class) lacks, as ``("op", cls)`` or ``("need", name)``; None if none."""
    ops = getattr(engine, "ops", None)
    if ops is None:  # an engine that declares nothing checks for itself
        return None
    for op in strategy.uses:
        if op not in ops:
            return "op", op
    meets = getattr(engine, "meets", frozenset())
    for need in sorted(strategy.needs(workers)):
        if need not in meets:
            return "need", need
    return None


def engines_for(strategy, workers: int) -> list[str]:
    """The registered engines that can run ``strategy`` on ``workers`` workers."""
    from . import ENGINES  # the registry, imported late: it imports every engine

    return [name for name, cls in ENGINES.all().items()
            if cls is not None and getattr(cls, "ops", None) is not None
            and _lacks(cls, strategy, workers) is None]


def refusal(engine, strategy, workers: int) -> str | None:
    """Why ``engine`` cannot run ``strategy`` with ``workers`` workers, in one
    line, or None when it can."""
    lack = _lacks(engine, strategy, workers)
    if lack is None:
        return None
    kind, item = lack
    others = ", ".join(n for n in engines_for(strategy, workers) if n != engine.name) or "none"
    if kind == "op":
        what = OP_MEANING.get(item) or (item.__doc__ or item.__name__).strip().splitlines()[0]
        return (f"the {engine.name} engine cannot carry out {item.__name__} ({what}), which "
                f"{strategy.name} uses; engines that run {strategy.name}: {others}")
    return (f"the {engine.name} engine has no {item} ({NEEDS.get(item, item)}), which "
            f"{strategy.name} needs here; engines that run {strategy.name}: {others}")

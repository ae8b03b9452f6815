"""The run configuration, validated at the boundary before any worker starts.

Every check here names what to change. Defaults for the learning rate, the
batch size and the budget come from the problem's catalog entry.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .engines import BACKENDS, engine_names, make_engine
from .errors import ConfigError
from .problems import Problem, make_problem, problem_defaults
from .rules import make_rule
from .strategies import Budget, make_strategy

FALLBACK = {"lr": 0.01, "epochs": 10, "batch_size": 32}
DTYPES = ("float32", "float64")


@dataclass
class TrainConfig:
    problem: str = "exp"
    strategy: str = "serial"
    workers: int = 1
    engine: str = "local"
    backend: str = "auto"   # processes; threads for problems with a compiled (GIL-free) loop
    rule: str = "sgd"
    lr: float | None = None
    lr_schedule: str = "constant"
    lr_gamma: float = 0.1
    lr_step_size: int = 1000
    momentum: float = 0.9
    epochs: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    seed: int = 0
    dtype: str = "float32"
    target_loss: float | None = None
    shards: int | None = None
    n_fetch: int = 1
    n_push: int = 1
    backup_workers: int = 0
    hogwild_beta: float = 0.9         # hogwild/serial on compiled loops: step decay per epoch
    staleness_lr: bool = False
    local_steps: int = 8
    diloco: bool = False
    outer_lr: float | None = None
    outer_momentum: float = 0.9
    easgd_alpha: float | None = None   # default 0.9 / workers (the paper's beta = 0.9)
    easgd_tau: int = 4
    dc_lambda: float | None = None   # dcasgd: lambda (0.04); dcasgd-a: lambda0 (2)
    # the sim engine's delay model (see engines/sim/delays.py)
    sim_compute_s: float = 1e-3
    sim_compute_sigma: float = 0.0
    sim_straggler_p: float = 0.0
    sim_straggler_factor: float = 10.0
    sim_slow_fraction: float = 0.0
    sim_latency_s: float = 0.0
    sim_bandwidth: float = 0.0
    sim_service_s: float = 0.0
    # the ray engine
    address: str | None = None       # None: a local Ray instance; "auto" or HOST:PORT: join
    checkpoint_every: int = 0         # updates between shard checkpoints (0: none)
    resume: str | None = None         # a run folder whose checkpoints to continue from
    run_name: str | None = None       # names the Ray actors monsoon-NAME-worker-K (default random)
    timeout: float = 60.0
    evals: int = 100
    out: str | None = None
    progress: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}


def _positive_int(name: str, value, flag: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"{name} must be a whole number of at least 1, got {value!r}; fix {flag}")


def engine_options(c: TrainConfig) -> dict:
    """The keyword arguments of ``make_engine`` for this configuration."""
    if c.engine == "sim":
        from .engines import DelayModel

        return {"shards": c.shards, "delays": DelayModel(
            compute_s=c.sim_compute_s, compute_sigma=c.sim_compute_sigma,
            straggler_p=c.sim_straggler_p, straggler_factor=c.sim_straggler_factor,
            slow_fraction=c.sim_slow_fraction, latency_s=c.sim_latency_s,
            bandwidth_Bps=c.sim_bandwidth, service_s=c.sim_service_s)}
    if c.engine == "ray":
        import os

        checkpoints = os.path.join(c.out, "checkpoints") if c.out and c.checkpoint_every else None
        resume = os.path.join(c.resume, "checkpoints") if c.resume else None
        if c.checkpoint_every and not c.out:
            raise ConfigError("--checkpoint-every needs a run folder (--out) to write to")
        if resume and not os.path.isdir(resume):
            raise ConfigError(f"--resume {c.resume}: no checkpoints folder there")
        return {"address": c.address, "timeout": c.timeout, "shards": c.shards,
                "checkpoint_dir": checkpoints, "checkpoint_every": c.checkpoint_every,
                "resume_dir": resume, "run_name": c.run_name}
    return {"backend": c.backend, "timeout": c.timeout, "shards": c.shards}


@dataclass
class Resolved:
    config: TrainConfig      # with the defaults filled in
    problem: Problem
    rule: object             # the rule the server (the engine) applies
    strategy: object
    budget: Budget
    processes: int           # workers the engine starts (backups included)


def _rule_options(c: TrainConfig) -> dict:
    if c.rule in ("momentum", "nesterov"):
        return {"momentum": c.momentum}
    if c.rule in ("dcasgd", "dcasgd-a") and c.dc_lambda is not None:
        if not c.dc_lambda >= 0:
            raise ConfigError(f"--dc-lambda must be 0 or more, got {c.dc_lambda}")
        return {"lam": c.dc_lambda}
    return {}


def _strategy_and_server_rule(c: TrainConfig, rule):
    """Most strategies apply ``rule`` on the server. Local SGD and EASGD apply
    it on each worker's copy, and the server runs the outer step instead."""
    if c.strategy == "async":
        return make_strategy("async", n_fetch=c.n_fetch, n_push=c.n_push,
                             local_lr=c.lr if c.n_fetch > 1 else 0.0), rule
    if c.strategy == "sync":
        return make_strategy("sync", backup_workers=c.backup_workers), rule
    if c.strategy == "local-sgd":
        if c.diloco:
            outer = make_rule("nesterov", c.outer_lr or 0.7, momentum=c.outer_momentum)
        else:
            outer = make_rule("sgd", c.outer_lr or 1.0)
        return make_strategy("local-sgd", local_rule=rule, local_steps=c.local_steps,
                             diloco=c.diloco), outer
    if c.strategy == "easgd":
        alpha = 0.9 / c.workers if c.easgd_alpha is None else c.easgd_alpha
        return (make_strategy("easgd", local_rule=rule, alpha=alpha, tau=c.easgd_tau),
                make_rule("sgd", 1.0))
    if c.strategy in ("hogwild", "serial"):
        if not 0 < c.hogwild_beta <= 1:
            raise ConfigError(f"--beta must be in (0, 1], got {c.hogwild_beta}")
        return make_strategy(c.strategy, beta=c.hogwild_beta), rule
    return make_strategy(c.strategy), rule


def resolve(config: TrainConfig, problem: Problem | None = None) -> Resolved:
    """Check ``config`` and build its pieces. Raises ConfigError."""
    c = config
    if c.dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {c.dtype!r}; choose one of: {', '.join(DTYPES)}")
    if problem is None:
        if not isinstance(c.problem, str):
            raise ConfigError("problem must be a catalog name or a Problem instance")
        defaults = problem_defaults(c.problem)  # raises on unknown names
    else:
        defaults = dict(getattr(problem, "defaults", {}) or {})
        c.problem = problem.name
    _positive_int("workers", c.workers, "--workers")
    _positive_int("epochs", c.epochs, "--epochs")
    _positive_int("steps", c.steps, "--steps")
    _positive_int("batch size", c.batch_size, "--batch-size")
    _positive_int("n_fetch", c.n_fetch, "--n-fetch")
    _positive_int("n_push", c.n_push, "--n-push")
    _positive_int("shards", c.shards, "--shards")
    _positive_int("local steps", c.local_steps, "--local-steps")
    _positive_int("easgd tau", c.easgd_tau, "--easgd-tau")
    if not isinstance(c.backup_workers, int) or c.backup_workers < 0:
        raise ConfigError(f"backup workers must be 0 or more, got {c.backup_workers!r}")
    if c.backup_workers and c.strategy != "sync":
        raise ConfigError("--backup-workers applies to --strategy sync only")
    if c.engine not in engine_names():
        make_engine(c.engine)  # raises, listing the engines there are
    if c.backend not in BACKENDS + ("auto",):
        raise ConfigError(f"unknown backend {c.backend!r}; choose one of: auto, "
                          f"{', '.join(BACKENDS)}")
    if c.epochs is not None and c.steps is not None:
        raise ConfigError("give either --epochs or --steps, not both")
    if c.lr is None:
        c.lr = defaults.get("lr", FALLBACK["lr"])
    if c.batch_size is None:
        c.batch_size = defaults.get("batch_size", FALLBACK["batch_size"])
    if c.epochs is None and c.steps is None:
        if "steps" in defaults:
            c.steps = defaults["steps"]
        else:
            c.epochs = defaults.get("epochs", FALLBACK["epochs"])
    if not (isinstance(c.timeout, (int, float)) and c.timeout > 0):
        raise ConfigError(f"timeout must be a positive number of seconds, got {c.timeout!r}")
    if c.target_loss is not None and not c.target_loss == c.target_loss:
        raise ConfigError("target loss must be a number")
    if c.strategy == "serial" and c.workers != 1:
        raise ConfigError(f"serial runs exactly 1 worker, not {c.workers}; "
                          "drop --workers or pick another strategy")
    make_strategy(c.strategy)  # an unknown name fails here, listing the valid ones
    rule = make_rule(c.rule, c.lr, c.lr_schedule, c.lr_gamma, c.lr_step_size,
                     staleness_lr=c.staleness_lr, **_rule_options(c))
    strategy, server_rule = _strategy_and_server_rule(c, rule)
    if problem is None:
        problem = make_problem(c.problem, c.dtype)
    if c.backend == "auto":
        # compiled loops release the GIL: threads share the data with no copy
        c.backend = "threads" if hasattr(problem, "sgd_pass") else "processes"
    processes = c.workers + c.backup_workers
    strategy.validate(processes, c.batch_size, problem.n_examples)
    if c.batch_size > problem.n_examples:
        raise ConfigError(f"batch size {c.batch_size} is larger than the {problem.n_examples} "
                          f"training examples; use --batch-size {problem.n_examples} or less")
    return Resolved(c, problem, server_rule, strategy, Budget(epochs=c.epochs, steps=c.steps),
                    processes)

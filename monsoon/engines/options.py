"""Options several engines share: one declaration each, so ``--timeout``
means the same on every engine that takes it."""
from __future__ import annotations

import os

import numpy as np

from ..errors import ConfigError
from ..options import Option, at_least, positive
from ..server.shards import replicates_bytes
from ..strategies.base import STAGES
from ..strategies.ops import AllReduce, Average, Elastic, Fetch, Push

# the ops that reach the server (its shards, on local and sim)
SERVER_OPS = (Push, Fetch, AllReduce, Average, Elastic)

TIMEOUT = Option("timeout", float, 60.0, "seconds any wait may last", check=positive)
SHARDS = Option("shards", int, None, "parameter-server shards (default: workers, at most 8; "
                "on ray, at most one per 262,144 parameters; hogwild on sim: the slices of "
                "a worker's read)", check=at_least(1))
CHECKPOINT_EVERY = Option("checkpoint_every", int, 1000, "write a checkpoint every K updates into "
                          "OUT/checkpoints, when there is a run folder (0: only when "
                          "interrupted); on the local engine K is a floor for every strategy "
                          "but sync: a checkpoint also waits 19 times as long as the previous "
                          "one took to write (about a twentieth of the run at most), so on "
                          "fast steps they come further apart and not on multiples of K; "
                          "refused for a run that writes none: pipeline, and local-sgd and "
                          "easgd on ray, spark and torch",
                          check=lambda v: None if v >= 0 else "0 or more")
# an empty path named no folder: it resumed nothing and cleared the run folder as a new run
RESUME = Option("resume", str, None, "continue from the checkpoints of this run folder",
                check=lambda v: None if v.strip() else "a run folder's path, not empty")


def refuse_unused_shards(engine, problem, strategy, device: str = "cpu",
                         reads_by_shard: bool = False) -> None:
    """Refuse, in one line, a given ``--shards`` (but compare's, given to
    every strategy) where the run has no server shards (``no_shards``)."""
    why = no_shards(problem, strategy, device, reads_by_shard)
    if "shards" in engine.given - engine.shared and why:
        flag = SHARDS.named(engine.cli)
        raise ConfigError(f"{flag} splits the server's parameters; {strategy.name} here "
                          f"has no server to split ({why}): drop {flag}")


def no_shards(problem, strategy, device: str = "cpu",
              reads_by_shard: bool = False) -> str | None:
    """Why a run has no server shards, or None: one worker in this process,
    stages, no op that reaches a server (Hogwild!'s in-place updates; but
    where the engine cuts its read of the shared vector at the shards,
    ``reads_by_shard``: the sim's), or a replicated synchronous step
    (small parameters, on the CPU: every worker applies the mean to its own
    copy; ``device`` None: an engine that never replicates, ray)."""
    if strategy.single_worker:
        return "its one worker updates the parameters itself"
    if STAGES in strategy.needs(2):
        return "each stage updates its own parameters"
    if not reads_by_shard and not set(SERVER_OPS) & set(strategy.uses):
        return "its workers update the shared parameters in place"
    itemsize = np.dtype(problem.dtype).itemsize
    if device == "cpu" and replicates_bytes(strategy, problem.n_params * itemsize):
        return "its workers each apply the mean to their own copy of the parameters"
    return None


def checkpoint_paths(out: str | None, checkpoint_every: int, resume: str | None) -> dict:
    """``checkpoint_dir``, ``checkpoint_every`` and ``resume_dir`` for an
    engine, from the run folder and the two options. With no run folder
    there is nowhere to write checkpoints: ``checkpoint_dir`` is None. The
    folder to resume is checked by ``refuse_checkpoints`` (the engine's
    ``preflight``), which knows the strategy and so can say why a run that
    writes none has no checkpoints there."""
    return {"checkpoint_dir": os.path.join(out, "checkpoints") if out else None,
            "checkpoint_every": checkpoint_every,
            "resume_dir": os.path.join(resume, "checkpoints") if resume else None}


def refuse_checkpoints(engine, strategy, workers: int) -> None:
    """Refuse, in one line, checkpoint options for a run that writes none
    (``checkpoints.writes_none`` says why: the same rule on every engine),
    and a ``--resume`` folder without a checkpoints folder. A run folder
    turns checkpoints on by default: only a ``--checkpoint-every`` the user
    gave (``engine.given``, also through compare, which asks it of every
    strategy; an engine built without them: another value than the
    default) is refused."""
    from ..record.checkpoints import writes_none

    resume_dir = getattr(engine, "resume_dir", None)
    resume = os.path.dirname(resume_dir) if resume_dir else None
    none = writes_none(engine, strategy, workers)
    every = getattr(engine, "checkpoint_every", CHECKPOINT_EVERY.default)
    given = getattr(engine, "given", frozenset())
    asked = "checkpoint_every" in given if given else every != CHECKPOINT_EVERY.default
    cli = getattr(engine, "cli", True)  # refusals name the option as the caller gave it
    if none is not None:
        why, keepers = none
        instead = (f", or run {strategy.name} on {keepers}, whose checkpoints hold them"
                   if keepers else "")
        if resume:
            raise ConfigError(f"{RESUME.given(resume, cli)}: {why}, so this run cannot "
                              f"resume; drop {RESUME.named(cli)}{instead}")
        if asked and getattr(engine, "checkpoint_dir", None):
            raise ConfigError(f"{CHECKPOINT_EVERY.given(every, cli)}: {why}, so this run "
                              f"writes none; drop {CHECKPOINT_EVERY.named(cli)}{instead}")
    if resume and not os.path.isdir(resume_dir):
        raise ConfigError(f"{RESUME.given(resume, cli)}: no checkpoints folder there")

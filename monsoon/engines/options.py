"""Options several engines share: one declaration each, so ``--timeout``
means the same on every engine that takes it."""
from __future__ import annotations

import os

from ..errors import ConfigError
from ..options import Option, at_least, positive

TIMEOUT = Option("timeout", float, 60.0, "seconds any wait may last", check=positive)
SHARDS = Option("shards", int, None, "parameter-server shards (default: workers, at most 8; "
                "on ray, at most one per 262,144 parameters)", check=at_least(1))
CHECKPOINT_EVERY = Option("checkpoint_every", int, 1000, "write a checkpoint every K updates into "
                          "OUT/checkpoints, when there is a run folder (0: only when "
                          "interrupted)",
                          check=lambda v: None if v >= 0 else "0 or more")
RESUME = Option("resume", str, None, "continue from the checkpoints of this run folder")


def checkpoint_paths(out: str | None, checkpoint_every: int, resume: str | None) -> dict:
    """``checkpoint_dir``, ``checkpoint_every`` and ``resume_dir`` for an
    engine, from the run folder and the two options, checked. With no run
    folder there is nowhere to write checkpoints: ``checkpoint_dir`` is None."""
    resume_dir = os.path.join(resume, "checkpoints") if resume else None
    if resume_dir and not os.path.isdir(resume_dir):
        raise ConfigError(f"--resume {resume}: no checkpoints folder there")
    return {"checkpoint_dir": os.path.join(out, "checkpoints") if out else None,
            "checkpoint_every": checkpoint_every, "resume_dir": resume_dir}


def refuse_checkpoints(engine, what: str) -> None:
    """Refuse, in one line, checkpoint options for a run that writes none
    (``what``, e.g. "the pipeline strategy"). A run folder turns checkpoints
    on by default: only what the user asked for explicitly is refused."""
    asked = getattr(engine, "checkpoint_every", CHECKPOINT_EVERY.default)
    if getattr(engine, "resume_dir", None) or (getattr(engine, "checkpoint_dir", None)
                                               and asked != CHECKPOINT_EVERY.default):
        raise ConfigError(f"{what} does not write or resume checkpoints yet; drop "
                          "--checkpoint-every and --resume")

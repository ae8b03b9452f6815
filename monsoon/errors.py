"""Errors monsoon raises on purpose. Each message says what to change."""


class MonsoonError(Exception):
    """Base class: the command line prints these as one line, with no traceback."""


class ConfigError(MonsoonError, ValueError):
    """Bad input, found before any worker starts."""


class WorkerError(MonsoonError, RuntimeError):
    """A worker failed and the strategy cannot carry on without it (sync)."""


class TrainingDiverged(MonsoonError, FloatingPointError):
    """The loss became non-finite or too many updates were dropped."""


class WaitTimeout(MonsoonError, TimeoutError):
    """A wait (for a peer, a start signal or progress) ran past its timeout."""


class RunFailed(MonsoonError, RuntimeError):
    """An engine failed with an error of its own (a lost node, a library's
    exception): the run folder holds what was recorded, with status
    "failed", and the message says how to carry on."""


class Interrupted(MonsoonError):
    """SIGTERM or SIGINT stopped the run. The run folder (``run_dir``) holds
    what was recorded so far and a checkpoint to resume from; the command
    line exits with ``exit_code`` (128 + the signal's number)."""

    def __init__(self, message: str, signum: int, run_dir=None):
        super().__init__(message)
        self.signum = signum
        self.run_dir = run_dir

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

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

"""monsoon: parallel and distributed SGD behind one switch.

Strategies (``serial``, ``sync``, ``async``/Downpour, ``hogwild``) run any
problem (a torch module, or a catalog name) with any rule, on an engine
(``local``: processes or threads on this machine).
"""
__version__ = "0.1.0"

from .api import Result, train  # noqa: E402
from .compare import compare  # noqa: E402
from .errors import ConfigError, MonsoonError, TrainingDiverged, WorkerError  # noqa: E402
from .problems import Problem  # noqa: E402

__all__ = ["train", "compare", "Result", "Problem", "TorchProblem", "MonsoonError",
           "ConfigError", "WorkerError", "TrainingDiverged", "__version__"]


def __getattr__(name):
    # torch is imported on first use: a run on a NumPy problem never loads it
    if name == "TorchProblem":
        from .problems.torch_problem import TorchProblem

        return TorchProblem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

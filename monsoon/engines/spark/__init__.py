from .data import SparkData
from .engine import SparkEngine
from .session import start_session

__all__ = ["SparkData", "SparkEngine", "SparkTorchData", "start_session"]


def __getattr__(name):
    # torch is imported on first use: a linear model on Spark never loads it
    if name == "SparkTorchData":
        from .torch_data import SparkTorchData

        return SparkTorchData
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

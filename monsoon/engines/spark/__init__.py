from ...problems.spark_data import SparkData
from . import data  # noqa: F401 - installs the transport of the problems on Spark data
from .engine import SparkEngine
from .session import start_session

__all__ = ["SparkData", "SparkEngine", "SparkTorchData", "start_session"]


def __getattr__(name):
    # torch is imported on first use: a linear model on Spark never loads it
    if name == "SparkTorchData":
        from ...problems.spark_torch_data import SparkTorchData

        return SparkTorchData
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

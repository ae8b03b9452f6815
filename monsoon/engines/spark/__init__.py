from .data import SparkData
from .engine import SparkEngine
from .session import start_session

__all__ = ["SparkData", "SparkEngine", "start_session"]

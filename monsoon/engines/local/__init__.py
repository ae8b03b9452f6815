from .engine import BACKENDS, EngineResult, LocalEngine

__all__ = ["LocalEngine", "EngineResult", "BACKENDS"]

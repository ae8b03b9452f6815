from .engine import BACKENDS, LocalEngine

__all__ = ["LocalEngine", "BACKENDS"]

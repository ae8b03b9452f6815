from .delays import DelayModel
from .engine import SimEngine

__all__ = ["SimEngine", "DelayModel"]

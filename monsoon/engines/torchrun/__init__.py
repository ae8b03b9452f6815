"""The torch engine (``--engine torch``): strategies on torch.distributed,
under torchrun or torchrun's elastic agent. See ``engine.py``."""
from .engine import TorchEngine

__all__ = ["TorchEngine"]

"""Compressors: how a worker's message shrinks before it travels.

``COMPRESSORS`` is the registry: monsoon's own by name (one file each:
``topk``, ``randk``, ``qsgd``, ``sign``, ``powersgd``, and ``none`` in
``base.py``), and other packages' through the ``monsoon.compressors``
entry-point group (see ``registry.py``). A compressor subclasses
``base.Compressor`` and declares the argument ``--compress NAME:ARG``
takes; ``parse`` reads that spelling. The sender (error feedback, byte
counts) and the transports are ``compressors/messages.py``'s.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..registry import Registry
from .base import Compressor, Encoded
from .powersgd import PowerSGD
from .qsgd import QSGD
from .randk import RandK
from .sign import Sign
from .topk import TopK

COMPRESSORS = Registry("compressor", "monsoon.compressors", {
    "none": Compressor, "topk": TopK, "randk": RandK, "qsgd": QSGD, "sign": Sign,
    "powersgd": PowerSGD})

__all__ = ["COMPRESSORS", "Compressor", "Encoded", "PowerSGD", "QSGD", "RandK", "Sign", "TopK",
           "parse"]


def usage(name: str) -> str:
    """How --compress spells ``name``: "sign", "topk:FRACTION"."""
    argument = COMPRESSORS.get(name).argument
    return name if argument is None else f"{name}:{argument.name.upper()}"


def parse(spec: str | None) -> tuple[str, float | int | None]:
    """``NAME[:ARG]`` -> (name, arg), refused in one line when malformed."""
    spec = (spec or "none").strip()
    name, _, arg = spec.partition(":")
    if name not in COMPRESSORS:
        if COMPRESSORS.broken(name):
            COMPRESSORS.get(name)  # raises, naming the plug-in that failed to load
        raise ConfigError(f"--compress {spec!r}: unknown compressor {name!r}; use one of "
                          f"{', '.join(usage(n) for n in COMPRESSORS.names())}")
    argument = COMPRESSORS.get(name).argument
    if argument is None:
        if arg:
            raise ConfigError(f"--compress {name} takes no argument; use --compress {name}")
        return name, None
    try:
        value = argument.type(arg)
    except ValueError:
        value = None
    if value is None or (argument.check is not None and argument.check(value)):
        raise ConfigError(f"--compress {spec!r}: {name} needs {argument.help}, e.g. "
                          f"--compress {name}:{COMPRESSORS.get(name).example}")
    return name, value

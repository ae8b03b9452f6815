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
    "powersgd": PowerSGD}, base=Compressor)

__all__ = ["COMPRESSORS", "Compressor", "Encoded", "PowerSGD", "QSGD", "RandK", "Sign", "TopK",
           "need", "parse"]


def usage(name: str) -> str:
    """How --compress spells ``name``: "sign", "topk:FRACTION"."""
    argument = COMPRESSORS.get(name).argument
    return name if argument is None else f"{name}:{argument.name.upper()}"


def need(spec: str | None) -> str | None:
    """What ``--compress`` must be where ``spec`` is not a valid
    ``NAME[:ARG]`` (a phrase that completes "compress must be ..."), else
    None. A plug-in that failed to load raises, naming it."""
    spec = (spec or "none").strip()
    name, _, arg = spec.partition(":")
    if name not in COMPRESSORS:
        if COMPRESSORS.broken(name):
            COMPRESSORS.get(name)  # raises, naming the plug-in that failed to load
        return f"one of {', '.join(usage(n) for n in COMPRESSORS.names())}"
    kind = COMPRESSORS.get(name)
    if kind.argument is None:
        return f"just {name} ({name} takes no argument)" if arg else None
    try:
        value = kind.argument.type(arg)
    except ValueError:
        value = None
    if value is None or (kind.argument.check is not None and kind.argument.check(value)):
        return f"{usage(name)} with {kind.argument.help}, e.g. {name}:{kind.example}"
    return None


def parse(spec: str | None) -> tuple[str, float | int | None]:
    """``NAME[:ARG]`` -> (name, arg), refused in one line when malformed,
    in the words of the run option's own check (``need``)."""
    spec = (spec or "none").strip()
    missing = need(spec)
    if missing:
        raise ConfigError(f"compress must be {missing}, got {spec!r}; fix --compress")
    name, _, arg = spec.partition(":")
    argument = COMPRESSORS.get(name).argument
    return name, None if argument is None else argument.type(arg)

"""The compressor protocol, the identity compressor (``none``) and the wire
helpers every compressor packs with.

A compressor ``encode``s a flat message (a gradient, an accrued update, a
drift) into an ``Encoded`` (the arrays a transport would move and their
``nbytes``), ``decode``s it back, and ``pack``s it into its wire form:
exactly ``Encoded.nbytes`` bytes of uint8 that ``unpack`` reads back
knowing only the run's ``--compress``, the length and the dtype.
Invariant (tested): ``decode(unpack(pack(enc)))`` equals ``decode(enc)``.

A compressor is a component (``COMPRESSORS`` in ``__init__.py``): it
declares the argument after ``--compress NAME:`` (``argument``, an
``Option``; None: the name alone), what it needs of the problem
(``layout``), and builds a worker's own instance (``build``). Error
feedback, byte counts and transport are the sender's
(``compressors/messages.py``), never a compressor's.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from ..options import Option

SEED_BYTES = 8


@dataclass
class Encoded:
    """A message as a transport would move it: ``arrays`` and their size."""
    kind: str
    size: int            # the decoded vector's length
    arrays: dict = field(default_factory=dict)
    nbytes: int = 0


def index_bytes(k: int, d: int) -> int:
    """``k`` indices into ``d`` coordinates, bit-packed at ceil(log2 d) bits."""
    return math.ceil(k * max(1, math.ceil(math.log2(d))) / 8)


def pack_uints(x: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned integers below 2**bits, ``bits`` bits each, little-endian."""
    shifts = np.arange(bits, dtype=np.uint64)
    b = ((x.astype(np.uint64)[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)
    return np.packbits(b.reshape(-1), bitorder="little")


def unpack_uints(buf: np.ndarray, count: int, bits: int) -> np.ndarray:
    b = np.unpackbits(buf, count=count * bits, bitorder="little").reshape(count, bits)
    return (b.astype(np.uint64) << np.arange(bits, dtype=np.uint64)).sum(axis=1)


def to_bytes(*arrays) -> np.ndarray:
    """The arrays' bytes, one after another (a wire form)."""
    return np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays])


class Reader:
    """Reads arrays back, in order, from a packed message."""

    def __init__(self, buf: np.ndarray):
        self.buf, self.at = buf, 0

    def take(self, nbytes: int) -> np.ndarray:
        out = self.buf[self.at:self.at + nbytes]
        self.at += nbytes
        return out

    def array(self, count: int, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        return self.take(count * dtype.itemsize).view(dtype)


def rng_state(rng) -> np.ndarray:
    """A PCG64 generator's whole state as 6 uint64: state and increment
    (128 bits each, high word first), the cached 32-bit half and its flag."""
    st = rng.bit_generator.state
    words = []
    for big in (st["state"]["state"], st["state"]["inc"]):
        words += [big >> 64, big & ((1 << 64) - 1)]
    return np.array(words + [st["has_uint32"], st["uinteger"]], dtype=np.uint64)


def set_rng_state(rng, words: np.ndarray) -> None:
    w = [int(x) for x in words]
    rng.bit_generator.state = {"bit_generator": "PCG64",
                               "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
                               "has_uint32": w[4], "uinteger": w[5]}


def _nan(a):
    """``a`` with every float in it NaN (arrays, scalars, lists of them)."""
    if isinstance(a, float):
        return math.nan
    if isinstance(a, np.ndarray) and a.dtype.kind == "f":
        return np.full_like(a, np.nan)
    if isinstance(a, (list, tuple)):
        return type(a)(_nan(x) for x in a)
    return a


class Compressor:
    """``none``: the message travels whole. The base of every compressor."""
    name = "none"
    argument: Option | None = None  # the ARG of --compress NAME:ARG (None: no argument)
    example = None                  # an ARG that messages suggest

    @classmethod
    def layout(cls, problem) -> tuple:
        """What ``build`` needs of the problem (picklable), or ConfigError
        naming why this problem cannot be compressed so."""
        return ()

    @classmethod
    def build(cls, arg, seed: int, layout: tuple) -> "Compressor":
        """One worker's compressor: ``seed`` is that worker's own."""
        return cls()

    def state(self) -> dict:
        """What the compressor carries from one message to the next, as named
        arrays of a fixed shape (a checkpoint's): its random stream, if any."""
        rng = getattr(self, "rng", None)
        return {} if rng is None else {"rng": rng_state(rng)}

    def set_state(self, arrays: dict) -> None:
        if "rng" in arrays:
            set_rng_state(self.rng, arrays["rng"])

    def poisoned(self, v: np.ndarray) -> Encoded:
        """A message that decodes to NaN (``v`` was not finite), so the
        receiver drops it as it drops a non-finite dense message: the
        encoding of zeros with every float in it NaN. The compressor's own
        state (random stream, PowerSGD's Q) is left as it was."""
        enc = copy.deepcopy(self).encode(np.zeros_like(v))
        enc.arrays = {key: _nan(a) for key, a in enc.arrays.items()}
        return enc

    def encode(self, v: np.ndarray) -> Encoded:
        return Encoded("none", v.size, {"values": v}, v.nbytes)

    def decode(self, enc: Encoded, dtype) -> np.ndarray:
        return np.asarray(enc.arrays["values"], dtype=dtype)

    def pack(self, enc: Encoded, dtype) -> np.ndarray:
        return to_bytes(np.asarray(enc.arrays["values"], dtype=dtype))

    def unpack(self, buf: np.ndarray, size: int, dtype) -> Encoded:
        return Encoded("none", size, {"values": Reader(buf).array(size, dtype)}, buf.nbytes)

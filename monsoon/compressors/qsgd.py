"""``qsgd:S``: Q_s(v)_i = ||v||_2 sign(v_i) xi_i, xi_i = l/s or (l+1)/s
with P[(l+1)/s] = s|v_i|/||v||_2 - l (Alistarh et al. 2017, eq. 1,
unbiased); counted at fixed width: ceil(log2(s+1)) + 1 bits a coordinate,
and one norm. S is at most ``LEVELS_MAX`` (2**31 - 1): a level travels as
an int32 before it is packed, so a larger S is refused, not wrapped."""
from __future__ import annotations

import math

import numpy as np

from ..options import Option, in_range
from .base import Compressor, Encoded, Reader, pack_uints, to_bytes, unpack_uints


LEVELS_MAX = 2**31 - 1  # the largest level an int32 holds


class QSGD(Compressor):
    name = "qsgd"
    argument = Option("levels", int, None, f"a whole number from 1 to {LEVELS_MAX}",
                      check=in_range(1, LEVELS_MAX))
    example = "4"

    def __init__(self, levels: int, seed: int = 0):
        self.levels = self.argument.value(levels, cli=False)
        self.rng = np.random.default_rng(seed)

    @classmethod
    def build(cls, arg, seed, layout):
        return cls(arg, seed)

    def encode(self, v):
        s = self.levels
        norm = float(np.linalg.norm(v.astype(np.float64)))
        u = self.rng.random(v.size)
        if norm == 0.0:
            level = np.zeros(v.size, dtype=np.int32)
        else:
            r = np.abs(v.astype(np.float64)) / norm * s
            low = np.floor(r)
            # at most s: |v_i| <= ||v|| but the division may round up
            level = np.minimum(low + (u < r - low), s).astype(np.int32)
        norm = float(v.dtype.type(norm))  # as it travels: one value of v's dtype
        return Encoded("qsgd", v.size, {"norm": norm, "signs": np.signbit(v), "levels": level},
                       v.itemsize + math.ceil(v.size * self.bits / 8))

    @property
    def bits(self) -> int:
        return math.ceil(math.log2(self.levels + 1)) + 1  # the level, then the sign

    def decode(self, enc, dtype):
        a = enc.arrays
        mag = a["norm"] * a["levels"] / self.levels
        return np.where(a["signs"], -mag, mag).astype(dtype)

    def pack(self, enc, dtype):
        a = enc.arrays
        code = a["levels"].astype(np.uint64) | (a["signs"].astype(np.uint64) << (self.bits - 1))
        return to_bytes(np.array([a["norm"]], dtype=dtype), pack_uints(code, self.bits))

    def unpack(self, buf, size, dtype):
        r = Reader(buf)
        norm = float(r.array(1, dtype)[0])
        code = unpack_uints(r.take(math.ceil(size * self.bits / 8)), size, self.bits)
        sign = np.uint64(1) << np.uint64(self.bits - 1)
        return Encoded("qsgd", size, {"norm": norm, "signs": (code & sign) != 0,
                                      "levels": (code & (sign - np.uint64(1))).astype(np.int32)},
                       buf.nbytes)

"""``topk:F``: top-k sparsification, k = ceil(F d) largest |v_i| (Lin et
al. 2018, DGC; its momentum correction and clipping are not applied);
values plus indices bit-packed at ceil(log2 d) bits."""
from __future__ import annotations

import math

import numpy as np

from ..options import Option, in_range
from .base import Compressor, Encoded, Reader, index_bytes, pack_uints, to_bytes, unpack_uints

FRACTION = Option("fraction", float, None, "a fraction in (0, 1]",
                  check=in_range(0, 1, low_open=True))


class TopK(Compressor):
    name = "topk"
    argument = FRACTION
    example = "0.01"

    def __init__(self, fraction: float):
        self.fraction = fraction

    @classmethod
    def build(cls, arg, seed, layout):
        return cls(arg)

    def k(self, size: int) -> int:
        return max(1, math.ceil(self.fraction * size))

    def encode(self, v):
        k = self.k(v.size)
        idx = np.argpartition(np.abs(v), v.size - k)[v.size - k:].astype(np.int32)
        vals = v[idx]
        return Encoded("sparse", v.size, {"indices": idx, "values": vals},
                       k * v.itemsize + index_bytes(k, v.size))

    def decode(self, enc, dtype):
        out = np.zeros(enc.size, dtype=dtype)
        out[enc.arrays["indices"]] = enc.arrays["values"]
        return out

    def pack(self, enc, dtype):
        bits = max(1, math.ceil(math.log2(enc.size)))
        return to_bytes(np.asarray(enc.arrays["values"], dtype=dtype),
                        pack_uints(enc.arrays["indices"], bits))

    def unpack(self, buf, size, dtype):
        k, r = self.k(size), Reader(buf)
        values = r.array(k, dtype)
        bits = max(1, math.ceil(math.log2(size)))
        idx = unpack_uints(r.take(index_bytes(k, size)), k, bits).astype(np.int32)
        return Encoded("sparse", size, {"indices": idx, "values": values}, buf.nbytes)

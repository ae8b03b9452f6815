"""``randk:F``: k = ceil(F d) coordinates drawn uniformly without
replacement, sent unscaled (Stich, Cordonnier, Jaggi 2018); the receiver
draws the same indices from the message's seed, so they cost one seed."""
from __future__ import annotations

import numpy as np

from .base import SEED_BYTES, Encoded, Reader, to_bytes
from .topk import TopK


class RandK(TopK):
    name = "randk"  # its argument is topk's: the fraction

    def __init__(self, fraction: float, seed: int = 0):
        self.fraction = fraction
        self.rng = np.random.default_rng(seed)

    @classmethod
    def build(cls, arg, seed, layout):
        return cls(arg, seed)

    def encode(self, v):
        seed = int(self.rng.integers(2**63))
        idx = self.indices(seed, v.size)
        # the receiver regenerates the indices from the seed
        return Encoded("sparse", v.size, {"seed": seed, "indices": idx, "values": v[idx]},
                       self.k(v.size) * v.itemsize + SEED_BYTES)

    def indices(self, seed: int, size: int) -> np.ndarray:
        return np.sort(np.random.default_rng(seed).choice(size, self.k(size), replace=False))

    def pack(self, enc, dtype):
        return to_bytes(np.asarray(enc.arrays["values"], dtype=dtype),
                        np.array([enc.arrays["seed"]], dtype=np.uint64))

    def unpack(self, buf, size, dtype):
        r = Reader(buf)
        values = r.array(self.k(size), dtype)
        seed = int(r.array(1, np.uint64)[0])
        return Encoded("sparse", size, {"seed": seed, "indices": self.indices(seed, size),
                                        "values": values}, buf.nbytes)

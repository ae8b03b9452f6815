"""``sign``: scaled sign, (||v||_1 / d) sign(v) (signSGD, Bernstein et al.
2018, with the scale of Karimireddy et al. 2019); one bit a coordinate
(sign(0) = +1), and one scale."""
from __future__ import annotations

import math

import numpy as np

from .base import Compressor, Encoded, Reader, to_bytes


class Sign(Compressor):
    name = "sign"

    def encode(self, v):
        scale = float(v.dtype.type(np.abs(v.astype(np.float64)).sum() / v.size))
        return Encoded("sign", v.size, {"scale": scale, "negative": np.signbit(v)},
                       v.itemsize + math.ceil(v.size / 8))

    def decode(self, enc, dtype):
        s = enc.arrays["scale"]
        return np.where(enc.arrays["negative"], -s, s).astype(dtype)

    def pack(self, enc, dtype):
        return to_bytes(np.array([enc.arrays["scale"]], dtype=dtype),
                        np.packbits(enc.arrays["negative"], bitorder="little"))

    def unpack(self, buf, size, dtype):
        r = Reader(buf)
        scale = float(r.array(1, dtype)[0])
        negative = np.unpackbits(r.take(math.ceil(size / 8)), count=size,
                                 bitorder="little").astype(bool)
        return Encoded("sign", size, {"scale": scale, "negative": negative}, buf.nbytes)

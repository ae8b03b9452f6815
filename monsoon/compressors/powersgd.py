"""``powersgd:R``: per matrix slice M (n x m): P = M Q; P = orth(P);
Q = M^T P; M ~ P Q^T (Vogels et al. 2019, Algorithm 1, one power
iteration, Q warm-started from the previous message). Vectors (biases)
travel uncompressed. Each worker compresses its own message: the mean of
N decoded messages may have rank up to N R (the paper all-reduces P and Q).
The matrices are the problem's ``matrix_slices()`` (a torch problem's)."""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..options import Option, at_least
from .base import Compressor, Encoded, Reader, to_bytes


def orthogonalize(p: np.ndarray) -> np.ndarray:
    """Gram-Schmidt on the columns of ``p`` (PowerSGD's orth), as QR's Q."""
    q, r = np.linalg.qr(p)
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)  # a unique sign: diag(R) >= 0


class PowerSGD(Compressor):
    name = "powersgd"
    argument = Option("rank", int, None, "a whole number of at least 1", check=at_least(1))
    example = "2"

    def __init__(self, rank: int, matrices, seed: int = 0):
        self.rank = rank
        self.matrices = list(matrices)  # (offset, rows, cols)
        rng = np.random.default_rng(seed)
        self.q = [rng.standard_normal((cols, min(rank, rows, cols)))
                  for _, rows, cols in self.matrices]

    @classmethod
    def layout(cls, problem) -> tuple:
        """(offset, rows, cols) of each matrix-shaped parameter in the flat vector."""
        fn = problem.matrix_slices
        matrices = tuple(fn()) if fn is not None else ()
        if not matrices:
            raise ConfigError("--compress powersgd needs matrix-shaped parameters, and this "
                              "problem declares none (a torch problem does); use topk:F instead")
        return matrices

    @classmethod
    def build(cls, arg, seed, layout):
        return cls(arg, layout, seed)

    def state(self) -> dict:
        """The warm-start Q of every matrix, flat."""
        return {"q": np.concatenate([q.reshape(-1) for q in self.q])}

    def set_state(self, arrays: dict) -> None:
        flat, at = arrays["q"], 0
        for i, q in enumerate(self.q):
            self.q[i] = np.array(flat[at:at + q.size], dtype=q.dtype).reshape(q.shape)
            at += q.size

    def encode(self, v):
        covered = np.zeros(v.size, dtype=bool)
        factors, nbytes = [], 0
        for i, (a, rows, cols) in enumerate(self.matrices):
            m = v[a:a + rows * cols].reshape(rows, cols).astype(np.float64)
            p = orthogonalize(m @ self.q[i])
            q = m.T @ p
            self.q[i] = q  # warm start
            factors.append((p.astype(v.dtype), q.astype(v.dtype)))  # as they travel
            covered[a:a + rows * cols] = True
            nbytes += (rows + cols) * p.shape[1] * v.itemsize
        rest = v[~covered]
        return Encoded("lowrank", v.size, {"factors": factors, "rest": rest},
                       nbytes + rest.nbytes)

    def decode(self, enc, dtype):
        out = np.empty(enc.size, dtype=dtype)
        covered = np.zeros(enc.size, dtype=bool)
        for (a, rows, cols), (p, q) in zip(self.matrices, enc.arrays["factors"]):
            out[a:a + rows * cols] = (p @ q.T).reshape(-1)
            covered[a:a + rows * cols] = True
        out[~covered] = enc.arrays["rest"]
        return out

    def pack(self, enc, dtype):
        return to_bytes(*(np.asarray(f, dtype=dtype) for pq in enc.arrays["factors"] for f in pq),
                        np.asarray(enc.arrays["rest"], dtype=dtype))

    def unpack(self, buf, size, dtype):
        r, factors, covered = Reader(buf), [], 0
        for (_, rows, cols), q in zip(self.matrices, self.q):
            rank = q.shape[1]
            factors.append((r.array(rows * rank, dtype).reshape(rows, rank),
                            r.array(cols * rank, dtype).reshape(cols, rank)))
            covered += rows * cols
        return Encoded("lowrank", size, {"factors": factors, "rest": r.array(size - covered,
                                                                              dtype)}, buf.nbytes)

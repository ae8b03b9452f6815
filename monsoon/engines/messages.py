"""What a worker sends, how it is compressed, and the bytes it costs.

A message is a flat vector (a gradient, an accrued update, a drift). A
compressor encodes it once, at the sender, into an ``Encoded`` (the arrays
a transport would move, and their ``nbytes``) and decodes it back; the
decoded vector is what the server or the collective sees.

- ``topk:F``  top-k sparsification, k = ceil(F d) largest |v_i| (Lin et al.
  2018, DGC; its momentum correction and clipping are not applied); values
  plus indices bit-packed at ceil(log2 d) bits.
- ``randk:F`` k = ceil(F d) coordinates drawn uniformly without replacement,
  sent unscaled (Stich, Cordonnier, Jaggi 2018); the indices cost one seed.
- ``qsgd:S``  Q_s(v)_i = ||v||_2 sign(v_i) xi_i, xi_i = l/s or (l+1)/s with
  P[(l+1)/s] = s|v_i|/||v||_2 - l (Alistarh et al. 2017, eq. 1, unbiased);
  counted at fixed width: ceil(log2(s+1)) + 1 bits a coordinate, one norm.
- ``sign``    scaled sign, (||v||_1 / d) sign(v) (signSGD, Bernstein et al.
  2018, with the scale of Karimireddy et al. 2019); one bit a coordinate
  (sign(0) = +1), one scale.
- ``powersgd:R`` per matrix slice M (n x m): P = M Q; P = orth(P);
  Q = M^T P; M ~ P Q^T (Vogels et al. 2019, Algorithm 1, one power
  iteration, Q warm-started from the previous message). Vectors (biases)
  travel uncompressed. Each worker compresses its own message: the mean of
  N decoded messages may have rank up to N R (the paper all-reduces P and Q).

Error feedback (Seide et al. 2014; Karimireddy et al. 2019): the sender
adds the residual e to the message, sends C(v + e) and keeps
e' = v + e - D(C(v + e)). Invariant (tested): sent + e' == v + e.
``Sender.state``/``restore``: the residual and the compressor's state
(random stream, PowerSGD's Q), which a checkpoint holds (``stateful``).

Wire form: ``pack`` writes an ``Encoded`` as exactly ``nbytes`` bytes
(uint8, bit-packed); invariant (tested): ``receive`` of it equals the
sender's own decode. ``Sender`` (compressor, residual, bytes sent and
received): ``send`` returns the decoded message (local, sim share memory),
``pack`` the wire form (ray, spark, torch move it). ``compressing`` wraps a
worker program so Push and AllReduce carry one or the other. EASGD: read x~,
send D = C(alpha (x_i - x~) + e); x~ += D, x_i -= D (Zhang et al. 2015's
asynchronous exchange, the decoded difference on both sides).
"""
from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from ..strategies.ops import AllReduce, Average, Elastic, Fetch, Push
from .reduce import finite

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


def _bytes(*arrays) -> np.ndarray:
    return np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays])


class _Reader:
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


class Compressor:
    """``encode``/``decode`` a message; ``pack``/``unpack``: its wire form,
    exactly ``Encoded.nbytes`` bytes (uint8), read back knowing only the
    run's ``Compression``, the length ``size`` and the ``dtype``."""
    name = "none"

    def state(self) -> dict:
        """What the compressor carries from one message to the next, as named
        arrays of a fixed shape (a checkpoint's): its random stream, if any."""
        rng = getattr(self, "rng", None)
        return {} if rng is None else {"rng": rng_state(rng)}

    def set_state(self, arrays: dict) -> None:
        if "rng" in arrays:
            set_rng_state(self.rng, arrays["rng"])

    def encode(self, v: np.ndarray) -> Encoded:
        return Encoded("none", v.size, {"values": v}, v.nbytes)

    def decode(self, enc: Encoded, dtype) -> np.ndarray:
        return np.asarray(enc.arrays["values"], dtype=dtype)

    def pack(self, enc: Encoded, dtype) -> np.ndarray:
        return _bytes(np.asarray(enc.arrays["values"], dtype=dtype))

    def unpack(self, buf: np.ndarray, size: int, dtype) -> Encoded:
        return Encoded("none", size, {"values": _Reader(buf).array(size, dtype)}, buf.nbytes)


class TopK(Compressor):
    name = "topk"

    def __init__(self, fraction: float):
        self.fraction = fraction

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
        return _bytes(np.asarray(enc.arrays["values"], dtype=dtype),
                      pack_uints(enc.arrays["indices"], bits))

    def unpack(self, buf, size, dtype):
        k, r = self.k(size), _Reader(buf)
        values = r.array(k, dtype)
        bits = max(1, math.ceil(math.log2(size)))
        idx = unpack_uints(r.take(index_bytes(k, size)), k, bits).astype(np.int32)
        return Encoded("sparse", size, {"indices": idx, "values": values}, buf.nbytes)


class RandK(TopK):
    name = "randk"

    def __init__(self, fraction: float, seed: int = 0):
        self.fraction = fraction
        self.rng = np.random.default_rng(seed)

    def encode(self, v):
        seed = int(self.rng.integers(2**63))
        idx = self.indices(seed, v.size)
        # the receiver regenerates the indices from the seed
        return Encoded("sparse", v.size, {"seed": seed, "indices": idx, "values": v[idx]},
                       self.k(v.size) * v.itemsize + SEED_BYTES)

    def indices(self, seed: int, size: int) -> np.ndarray:
        return np.sort(np.random.default_rng(seed).choice(size, self.k(size), replace=False))

    def pack(self, enc, dtype):
        return _bytes(np.asarray(enc.arrays["values"], dtype=dtype),
                      np.array([enc.arrays["seed"]], dtype=np.uint64))

    def unpack(self, buf, size, dtype):
        r = _Reader(buf)
        values = r.array(self.k(size), dtype)
        seed = int(r.array(1, np.uint64)[0])
        return Encoded("sparse", size, {"seed": seed, "indices": self.indices(seed, size),
                                        "values": values}, buf.nbytes)


class QSGD(Compressor):
    name = "qsgd"

    def __init__(self, levels: int, seed: int = 0):
        self.levels = levels
        self.rng = np.random.default_rng(seed)

    def encode(self, v):
        s = self.levels
        norm = float(np.linalg.norm(v.astype(np.float64)))
        u = self.rng.random(v.size)
        if norm == 0.0:
            level = np.zeros(v.size, dtype=np.int32)
        else:
            r = np.abs(v.astype(np.float64)) / norm * s
            low = np.floor(r)
            level = (low + (u < r - low)).astype(np.int32)
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
        return _bytes(np.array([a["norm"]], dtype=dtype), pack_uints(code, self.bits))

    def unpack(self, buf, size, dtype):
        r = _Reader(buf)
        norm = float(r.array(1, dtype)[0])
        code = unpack_uints(r.take(math.ceil(size * self.bits / 8)), size, self.bits)
        sign = np.uint64(1) << np.uint64(self.bits - 1)
        return Encoded("qsgd", size, {"norm": norm, "signs": (code & sign) != 0,
                                      "levels": (code & (sign - np.uint64(1))).astype(np.int32)},
                       buf.nbytes)


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
        return _bytes(np.array([enc.arrays["scale"]], dtype=dtype),
                      np.packbits(enc.arrays["negative"], bitorder="little"))

    def unpack(self, buf, size, dtype):
        r = _Reader(buf)
        scale = float(r.array(1, dtype)[0])
        negative = np.unpackbits(r.take(math.ceil(size / 8)), count=size,
                                 bitorder="little").astype(bool)
        return Encoded("sign", size, {"scale": scale, "negative": negative}, buf.nbytes)


def orthogonalize(p: np.ndarray) -> np.ndarray:
    """Gram-Schmidt on the columns of ``p`` (PowerSGD's orth), as QR's Q."""
    q, r = np.linalg.qr(p)
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)  # a unique sign: diag(R) >= 0


class PowerSGD(Compressor):
    name = "powersgd"

    def __init__(self, rank: int, matrices, seed: int = 0):
        self.rank = rank
        self.matrices = list(matrices)  # (offset, rows, cols)
        rng = np.random.default_rng(seed)
        self.q = [rng.standard_normal((cols, min(rank, rows, cols)))
                  for _, rows, cols in self.matrices]

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
        return _bytes(*(np.asarray(f, dtype=dtype) for pq in enc.arrays["factors"] for f in pq),
                      np.asarray(enc.arrays["rest"], dtype=dtype))

    def unpack(self, buf, size, dtype):
        r, factors, covered = _Reader(buf), [], 0
        for (_, rows, cols), q in zip(self.matrices, self.q):
            rank = q.shape[1]
            factors.append((r.array(rows * rank, dtype).reshape(rows, rank),
                            r.array(cols * rank, dtype).reshape(cols, rank)))
            covered += rows * cols
        return Encoded("lowrank", size, {"factors": factors, "rest": r.array(size - covered,
                                                                              dtype)}, buf.nbytes)


NAMES = ("none", "topk", "randk", "qsgd", "sign", "powersgd")


def parse(spec: str | None) -> tuple[str, float | int | None]:
    """``NAME[:ARG]`` -> (name, arg), refused in one line when malformed."""
    spec = (spec or "none").strip()
    name, _, arg = spec.partition(":")
    if name not in NAMES:
        raise ConfigError(f"--compress {spec!r}: unknown compressor {name!r}; use one of "
                          "none, topk:FRACTION, randk:FRACTION, qsgd:LEVELS, sign, powersgd:RANK")
    if name in ("none", "sign"):
        if arg:
            raise ConfigError(f"--compress {name} takes no argument; use --compress {name}")
        return name, None
    try:
        value = float(arg) if name in ("topk", "randk") else int(arg)
    except ValueError:
        value = None
    if name in ("topk", "randk") and (value is None or not 0 < value <= 1):
        raise ConfigError(f"--compress {spec!r}: {name} needs a fraction in (0, 1], "
                          f"e.g. --compress {name}:0.01")
    if name in ("qsgd", "powersgd") and (value is None or value < 1):
        raise ConfigError(f"--compress {spec!r}: {name} needs a whole number of at least 1, "
                          f"e.g. --compress {name}:{4 if name == 'qsgd' else 2}")
    return name, value


def by_strategy(spec) -> dict | None:
    """``monsoon compare``'s ``--compress STRATEGY=SPEC,...`` as {strategy: spec};
    None for one spec that every strategy takes."""
    if not isinstance(spec, str) or "=" not in spec:
        return None
    out = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, one = part.partition("=")
        out[name.strip()] = one.strip()
    return out


def check_spec(spec) -> str | None:
    """The run option's check: None when fine, else what it must be."""
    try:
        parse(spec)
    except ConfigError as exc:
        return str(exc).split(": ", 1)[-1]
    return None


def matrix_slices(problem) -> list[tuple[int, int, int]]:
    """(offset, rows, cols) of each matrix-shaped parameter in the flat
    vector: the problem's ``matrix_slices()`` if it has one, else none."""
    fn = getattr(problem, "matrix_slices", None)
    return list(fn()) if fn is not None else []


@dataclass(frozen=True)
class Compression:
    """A run's ``--compress`` and error feedback (pickled to workers)."""
    name: str = "none"
    arg: float | int | None = None
    error_feedback: bool = True
    matrices: tuple = ()

    @classmethod
    def from_run(cls, spec, no_error_feedback: bool, problem) -> "Compression":
        name, arg = parse(spec)
        matrices = tuple(matrix_slices(problem)) if name == "powersgd" else ()
        if name == "powersgd" and not matrices:
            raise ConfigError("--compress powersgd needs matrix-shaped parameters, and this "
                              "problem declares none (a torch problem does); use topk:F instead")
        return cls(name, arg, not no_error_feedback, matrices)

    @property
    def active(self) -> bool:
        return self.name != "none"

    @property
    def stateful(self) -> bool:
        """Whether a worker's sender carries state from one message to the
        next (an error-feedback residual, a random stream, PowerSGD's Q),
        which a checkpoint must hold for a resumed run to equal an
        uninterrupted one."""
        return self.active and (self.error_feedback or bool(self.compressor(0).state()))

    def sender_layout(self, size: int, dtype) -> dict:
        """One sender's checkpointed arrays, {name: (shape, dtype)}."""
        out = {"residual": ((size,), str(np.dtype(dtype))), "has": ((1,), "int64")}
        for name, arr in self.compressor(0).state().items():
            out[name] = (arr.shape, str(arr.dtype))
        return out

    def compressor(self, rank: int) -> Compressor:
        seed = 1_000_003 * (rank + 1)
        if self.name == "topk":
            return TopK(self.arg)
        if self.name == "randk":
            return RandK(self.arg, seed)
        if self.name == "qsgd":
            return QSGD(self.arg, seed)
        if self.name == "sign":
            return Sign()
        if self.name == "powersgd":
            return PowerSGD(self.arg, self.matrices, seed)
        return Compressor()

    def wire_nbytes(self, size: int, dtype) -> int:
        """The packed size of any message of ``size`` coordinates: the same for
        every message of a run (an all-gather needs equal lengths)."""
        c = self.compressor(0)
        return c.encode(np.zeros(size, dtype=dtype)).nbytes

    def describe(self) -> str:
        return self.name if self.arg is None else f"{self.name}:{self.arg:g}"


def _poisoned(compressor: Compressor, v: np.ndarray) -> Encoded:
    """A message that decodes to NaN (``v`` was not finite): the receiver
    drops it, as it drops a non-finite dense message. The compressor's own
    state (random stream, PowerSGD's Q) is left as it was."""
    enc = copy.deepcopy(compressor).encode(np.zeros_like(v))
    a = enc.arrays
    for key in ("values", "rest"):
        if key in a:
            a[key] = np.full_like(a[key], np.nan)
    for key in ("norm", "scale"):
        if key in a:
            a[key] = math.nan
    if "factors" in a:
        a["factors"] = [(np.full_like(p, np.nan), q) for p, q in a["factors"]]
    return enc


@functools.lru_cache(maxsize=16)
def _decoder(compression: "Compression") -> Compressor:
    return compression.compressor(0)  # decode and unpack use no per-worker state


def receive(compression: "Compression", message: np.ndarray, size: int, dtype) -> np.ndarray:
    """The receiving side: the dense vector a message decodes to. ``message``
    is ``Sender.pack``'s wire form, or the dense vector itself when the run
    does not compress."""
    if compression is None or not compression.active:
        return message
    c = _decoder(compression)
    return c.decode(c.unpack(np.asarray(message, dtype=np.uint8), size, dtype), dtype)


class Sender:
    """One worker's outgoing side: compressor, error-feedback residual and
    byte counts (``raw_bytes``: what the messages would have cost dense).

    ``send`` returns the decoded message (engines that share memory: local,
    sim); ``pack`` returns its wire form, ``Encoded.nbytes`` bytes of uint8,
    which the receiver turns back with ``receive`` (ray, spark, torch). A
    non-finite message is sent as one that decodes to NaN (the receiver
    drops it) and leaves the residual as it was."""

    def __init__(self, compression: Compression, rank: int = 0):
        self.compression = compression
        self.compressor = compression.compressor(rank)
        self.residual = None
        self.sent_bytes = self.raw_bytes = self.received_bytes = self.messages = 0
        self.last_nbytes = 0

    def _encode(self, v: np.ndarray) -> tuple[Encoded, np.ndarray]:
        self.messages += 1
        self.raw_bytes += v.nbytes
        if not finite(v):
            enc = _poisoned(self.compressor, v)
            out = self.compressor.decode(enc, v.dtype)
        else:
            full = v if self.residual is None else v + self.residual
            enc = self.compressor.encode(full)
            out = self.compressor.decode(enc, v.dtype)
            if self.compression.error_feedback:
                self.residual = full - out
        self.sent_bytes += enc.nbytes
        self.last_nbytes = enc.nbytes
        return enc, out

    def _plain(self, v: np.ndarray) -> np.ndarray:
        self.messages += 1
        self.raw_bytes += v.nbytes
        self.sent_bytes += v.nbytes
        self.last_nbytes = v.nbytes
        return v

    def send(self, v: np.ndarray) -> np.ndarray:
        """Encode ``v`` (plus the residual), count it, and return the decoded
        vector the receiver sees (``v`` itself when nothing compresses)."""
        if not self.compression.active:
            return self._plain(v)
        return self._encode(v)[1]

    def pack(self, v: np.ndarray) -> np.ndarray:
        """As ``send``, but return the wire form (``v`` itself when nothing
        compresses): exactly ``last_nbytes`` bytes."""
        return self.exchange(v)[0]

    def exchange(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(wire form, decoded vector)``: for a sender that applies what it
        sent itself (EASGD's x_i -= D)."""
        if not self.compression.active:
            return self._plain(v), v
        enc, out = self._encode(v)
        return self.compressor.pack(enc, v.dtype), out

    def dense(self, nbytes: int, received: int = 0) -> None:
        """Count an uncompressed message (an elastic exchange, a read)."""
        self.sent_bytes += nbytes
        self.raw_bytes += nbytes
        self.received_bytes += received
        if nbytes:
            self.messages += 1
        self.last_nbytes = nbytes

    def state(self, size: int, dtype) -> dict:
        """What ``restore`` needs to carry on as this sender would have, as
        ``Compression.sender_layout``'s arrays: the residual (``has``: 1 once
        there is one) and the compressor's state."""
        has = self.residual is not None
        return {"residual": self.residual if has else np.zeros(size, dtype=dtype),
                "has": np.array([int(has)], dtype=np.int64), **self.compressor.state()}

    def restore(self, arrays: dict) -> None:
        self.residual = np.array(arrays["residual"], copy=True) if int(arrays["has"][0]) else None
        self.compressor.set_state(arrays)

    def stats(self) -> dict:
        norm = 0.0 if self.residual is None else float(np.linalg.norm(self.residual))
        return {"sent": self.sent_bytes, "raw": self.raw_bytes,
                "received": self.received_bytes, "messages": self.messages,
                "residual_norm": norm}


def compressing(program, sender: Sender, nbytes: int, packed: bool = False,
                fetch_bytes: int | None = None):
    """``program`` with each Push's and AllReduce's vector replaced by the
    message the receiver gets: decoded (``packed=False``: engines that share
    memory) or its wire form (``packed=True``: the engine moves it and the
    receiver calls ``receive``); every worker's bytes counted. ``nbytes``:
    the parameter vector's size (what a Fetch or a synchronous step
    returns; ``fetch_bytes``: what a Fetch costs where it differs, 0 where
    the worker holds a replica of the server). Average's drift and EASGD's elastic difference are formed by
    the engine, which sends them through ``sender`` itself (a compressed
    elastic exchange first reads the centre: ``nbytes`` received)."""
    out = sender.pack if packed else sender.send
    result = None
    try:
        while True:
            try:
                op = program.send(result)
            except StopIteration:
                return
            kind = type(op)
            if kind is Push:
                if packed and not finite(op.grad):
                    result = yield op  # the engine drops it, as it drops any non-finite push
                    continue
                op = Push(out(op.grad), op.ticket)
            elif kind is AllReduce:
                if op.grad is not None:
                    op = AllReduce(out(op.grad), op.examples)
                sender.received_bytes += nbytes
            elif kind is Average:
                sender.received_bytes += nbytes
            elif kind is Fetch:
                sender.dense(0, nbytes if fetch_bytes is None else fetch_bytes)
            elif kind is Elastic:
                if sender.compression.active:
                    sender.received_bytes += nbytes
                else:
                    sender.dense(nbytes, nbytes)
            result = yield op
    finally:
        program.close()


def summarize(stats: list[dict], compression: Compression, updates: int) -> dict:
    """summary.json's fields from each worker's ``Sender.stats()``."""
    sent = sum(s["sent"] for s in stats)
    raw = sum(s["raw"] for s in stats)
    received = sum(s["received"] for s in stats)
    return {
        "compress": compression.describe(),
        "error_feedback": compression.error_feedback and compression.active,
        "bytes_sent": int(sent), "bytes_received": int(received),
        "bytes_sent_uncompressed": int(raw),
        "compression_ratio": raw / sent if sent else None,
        "bytes_sent_per_update": sent / updates if updates else None,
        "bytes_sent_per_worker": [int(s["sent"]) for s in stats],
        "bytes_received_per_worker": [int(s["received"]) for s in stats],
        "residual_norm": float(math.sqrt(sum(s["residual_norm"] ** 2 for s in stats))),
    }


def add_bytes_column(rows: list[dict], per_update: float) -> None:
    """metrics.csv's ``bytes_sent`` at each row: the row's updates times the
    run's mean bytes sent per update. Every message of a compressor has one
    size (k values and indices, a fixed-width code, the same factors), so
    where each update sends the same messages this is the count at that
    row; where they differ (an epoch's short last batch, backup workers'
    late sends, dropped non-finite messages) it is the run's mean rate."""
    for row in rows:
        row["bytes_sent"] = int(round(row["updates"] * per_update))


def check_engine(engine, strategy) -> None:
    """Refuse, in one line, a compressed run this engine or strategy lacks:
    an engine without ``compresses``, or whose ``compression_refused(strategy)``
    names a reason."""
    if not getattr(engine, "compresses", False):
        raise ConfigError(f"the {engine.name} engine does not compress messages; drop "
                          "--compress, or use --engine local, sim, ray, spark or torch")
    refused = getattr(engine, "compression_refused", None)
    reason = refused(strategy) if refused is not None else None
    if reason:
        raise ConfigError(reason)

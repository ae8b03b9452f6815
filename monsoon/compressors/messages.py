"""What a worker sends, how much it costs, and how it travels.

A message is a flat vector (a gradient, an accrued update, a drift). The
run's compressor (``monsoon/compressors/``, one file each: ``topk``,
``randk``, ``qsgd``, ``sign``, ``powersgd``, or a plug-in's) encodes it
once, at the sender, into an ``Encoded`` and decodes it back; the decoded
vector is what the server or the collective sees. ``Compression`` is the
run's ``--compress NAME:ARG`` and error feedback, pickled to the workers.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019): the sender
adds the residual e to the message, sends C(v + e) and keeps
e' = v + e - D(C(v + e)). Invariant (tested): sent + e' == v + e.
``Sender.state``/``restore``: the residual and the compressor's state
(random stream, PowerSGD's Q), which a checkpoint holds (``stateful``);
with ``keep_previous`` set, also as they were before the last message (a
synchronous worker that stops before the step its message was for is
applied hands that state over: the resumed run sends the message again;
``take_back``: a late one that a step with backup workers dropped).

Wire form: the compressor's ``pack`` writes an ``Encoded`` as exactly
``nbytes`` bytes (uint8, bit-packed); invariant (tested): ``receive`` of it
equals the sender's own decode. ``Sender`` (compressor, residual, bytes
sent and received): ``send`` returns the decoded message (local, sim share
memory), ``pack`` the wire form (ray, spark, torch move it).
``compressing`` wraps a worker program so Push and AllReduce carry one or
the other. EASGD: read x~, send D = C(alpha (x_i - x~) + e); x~ += D,
x_i -= D (Zhang et al. 2015's asynchronous exchange, the decoded
difference on both sides). ``summarize`` and ``add_bytes_column``: the
summary's byte fields and metrics.csv's ``bytes_sent``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from . import COMPRESSORS, Compressor, need, parse
# the compressors' old import paths (tests, benchmarks)
from . import PowerSGD, QSGD, RandK, Sign, TopK  # noqa: F401
from .base import Encoded, index_bytes  # noqa: F401
from ..errors import ConfigError
from ..strategies.ops import AllReduce, Average, Elastic, Fetch, Push
from ..server.reduce import finite


def by_strategy(spec) -> dict | None:
    """``monsoon compare``'s ``--compress STRATEGY=SPEC,...`` as {strategy: spec};
    None for one spec that every strategy takes. A strategy named twice is
    refused in one line, as ``--strategies sync,sync`` is."""
    if not isinstance(spec, str) or "=" not in spec:
        return None
    out = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, one = part.partition("=")
        if name.strip() in out:
            raise ConfigError(f"--compress names {name.strip()} twice ({spec}); give each "
                              "strategy one spec, e.g. --compress sync=topk:0.01,async=sign")
        out[name.strip()] = one.strip()
    return out


def check_spec(spec) -> str | None:
    """The run option's check: None when fine, else what it must be
    (``compressors.need``)."""
    return need(spec)


@dataclass(frozen=True)
class Compression:
    """A run's ``--compress`` and error feedback (pickled to workers)."""
    name: str = "none"
    arg: float | int | None = None
    error_feedback: bool = True
    layout: tuple = ()  # what the compressor needs of the problem (PowerSGD: its matrices)
    kind: type | None = None  # the compressor's class (None: the one registered as ``name``)

    @classmethod
    def from_run(cls, spec, no_error_feedback: bool, problem) -> "Compression":
        name, arg = parse(spec)
        kind = COMPRESSORS.get(name)  # travels with the run: workers need no registry
        return cls(name, arg, not no_error_feedback, kind.layout(problem), kind)

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
        """Worker ``rank``'s compressor, with its own random stream."""
        kind = self.kind or COMPRESSORS.get(self.name)
        return kind.build(self.arg, 1_000_003 * (rank + 1), self.layout)

    def wire_nbytes(self, size: int, dtype) -> int:
        """The packed size of any message of ``size`` coordinates: the same for
        every message of a run (an all-gather needs equal lengths)."""
        c = self.compressor(0)
        return c.encode(np.zeros(size, dtype=dtype)).nbytes

    def describe(self) -> str:
        return self.name if self.arg is None else f"{self.name}:{self.arg:g}"


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
    drops it) and leaves the residual as it was; ``last_finite`` says
    whether the last encoded vector was finite (a receiver that decodes only
    its slice of the message, a Ray shard, cannot see it)."""

    keep_previous = False  # keep ``previous``: the state before the last message

    def __init__(self, compression: Compression, rank: int = 0):
        self.compression = compression
        self.compressor = compression.compressor(rank)
        self.residual = None
        # (residual, compressor state) before the last message, where kept: the
        # residual is never changed in place, only replaced, so this holds a reference
        self.previous = None
        self.sent_bytes = self.raw_bytes = self.received_bytes = self.messages = 0
        self.counted = (0, 0, 0, 0)  # the counts before the last message
        self.last_nbytes = 0
        self.last_finite = True

    def _encode(self, v: np.ndarray) -> tuple[Encoded, np.ndarray]:
        self.counted = (self.sent_bytes, self.raw_bytes, self.received_bytes, self.messages)
        if self.keep_previous:
            self.previous = (self.residual, {k: np.array(a, copy=True)
                                             for k, a in self.compressor.state().items()})
        self.messages += 1
        self.raw_bytes += v.nbytes
        self.last_finite = finite(v)
        if not self.last_finite:
            enc = self.compressor.poisoned(v)
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
        self.counted = (self.sent_bytes, self.raw_bytes, self.received_bytes, self.messages)
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

    def state(self, size: int, dtype, before_last: bool = False) -> dict:
        """What ``restore`` needs to carry on as this sender would have, as
        ``Compression.sender_layout``'s arrays: the residual (``has``: 1 once
        there is one) and the compressor's state; ``before_last``: as they
        were before the last message (``keep_previous`` must be set)."""
        if before_last:
            residual, kept = self._previous()
        else:
            residual, kept = self.residual, self.compressor.state()
        has = residual is not None
        return {"residual": residual if has else np.zeros(size, dtype=dtype),
                "has": np.array([int(has)], dtype=np.int64), **kept}

    def restore(self, arrays: dict) -> None:
        self.residual = np.array(arrays["residual"], copy=True) if int(arrays["has"][0]) else None
        self.compressor.set_state(arrays)

    def take_back(self) -> None:
        """The last message was dropped unapplied (a backup worker's late
        contribution to a synchronous step): the residual and the
        compressor's state go back to before it, as if it was never sent
        (``keep_previous`` must be set); its bytes stay counted."""
        if not self.compression.active:
            return
        self.residual, kept = self._previous()  # never changed in place: no copy
        self.compressor.set_state(kept)

    def _previous(self) -> tuple:
        if self.previous is None:
            raise RuntimeError("the sender kept no state from before its last message "
                               "(keep_previous unset); please report this bug")
        return self.previous

    def uncount_last(self) -> None:
        """Take the last message (and what it received back) out of the
        counts: a synchronous worker's message of a step that a stop left
        unapplied, which the resumed run sends again (``RunTally.carry``)."""
        self.sent_bytes, self.raw_bytes, self.received_bytes, self.messages = self.counted

    def stats(self, residual: bool = True) -> dict:
        """The counts (``summarize`` reads them) and the residual's norm;
        ``residual`` False: 0 there (a running worker's progress: the norm
        is a pass over the vector, and a lost worker's residual is lost)."""
        norm = 0.0 if self.residual is None or not residual \
            else float(np.linalg.norm(self.residual))
        return {"sent": self.sent_bytes, "raw": self.raw_bytes,
                "received": self.received_bytes, "messages": self.messages,
                "residual_norm": norm}


def compressing(program, sender: Sender, nbytes: int, packed: bool = False,
                fetch_bytes: int | None = None):
    """``program`` with each Push's and AllReduce's vector replaced by the
    message the receiver gets: decoded (``packed=False``: engines that share
    memory) or its wire form (``packed=True``: the engine moves it and the
    receiver calls ``receive``); every worker's bytes counted (a non-finite
    push too, at the size of the message that decodes to NaN: local and the
    sim hand it to the server, which drops it; ray drops it at the worker,
    since the server would, so ``bytes_sent`` is one figure for the same
    pushes on every engine). ``nbytes``:
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
                    # the engine drops it at the sender (a shard that decodes
                    # only its slice could not tell); it is counted as sent,
                    # at its wire size, as where the server drops it on arrival
                    out(op.grad)
                    result = yield op
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
    """summary.json's fields from each worker's ``Sender.stats()``;
    ``updates``: those the counts cover (a resumed run's may not be all)."""
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


# The ops whose vector is a worker's message: ``compressing`` encodes Push's and
# AllReduce's, and the engine sends Average's drift and Elastic's difference
# through the worker's Sender. A strategy whose program yields none of them
# (serial, hogwild: workers apply to shared parameters; pipeline: its stages
# pass activations) sends nothing that --compress could shrink.
CARRIERS = (Push, AllReduce, Average, Elastic)


def sends_messages(strategy) -> bool:
    """Whether ``strategy`` (a class or an instance) sends messages that a
    compressor encodes: its declared ops (``Strategy.uses``) include one of
    ``CARRIERS``."""
    return any(isinstance(op, type) and issubclass(op, CARRIERS)
               for op in getattr(strategy, "uses", ()))


def senders(strategies: dict) -> list[str]:
    """The names of ``strategies`` ({name: class}) that send messages."""
    return [name for name, cls in strategies.items() if cls is not None and sends_messages(cls)]


def check_strategy(spec: str, strategy, strategies: dict, advice: str | None = None) -> None:
    """Refuse, in one line, ``--compress`` for a strategy that sends no
    messages (``sends_messages``), naming those of ``strategies`` (the
    registry's, {name: class}) that do: it would run uncompressed while its
    summary recorded the compressor. ``advice``: what to change, where it is
    not a run's (``compare``'s own flags)."""
    if sends_messages(strategy):
        return
    advice = advice or f"drop --compress, or use --strategy {', '.join(senders(strategies))}"
    raise ConfigError(f"--compress {spec}: strategy {strategy.name} sends no messages to "
                      f"compress; {advice}")


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

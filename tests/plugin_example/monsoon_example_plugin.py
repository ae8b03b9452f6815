"""A third-party package that adds a strategy, a rule, an engine, a problem
and a compressor to monsoon through entry points (see pyproject.toml beside this file).

- ``clipped-sync``: synchronous SGD in which each worker clips its slice's
  gradient to an L2 norm of at most ``--clip-norm`` before the average.
- ``signum``: signSGD with momentum (Bernstein et al., ICML 2018):
  m <- beta m + (1 - beta) g;  w <- w - lr sign(m).
- ``noisy-line``: least squares on a planted linear model whose label noise
  is ``--noise``.
- ``round-robin``: an engine that runs every worker's program in one
  thread, ``--quantum`` ops of each worker in turn (strategies whose workers
  only compute and apply: serial, hogwild).
- ``fp16``: a compressor (``--compress fp16``) that sends each coordinate
  as an IEEE half-precision float, 2 bytes; error feedback keeps the
  rounding error.
"""
import time
from collections import Counter
from typing import NamedTuple

import numpy as np

from monsoon.compressors import Compressor, Encoded
from monsoon.compressors.base import Reader
from monsoon.engines import Engine, EngineResult
from monsoon.errors import ConfigError
from monsoon.options import Option, at_least, positive
from monsoon.rules import UpdateInfo
from monsoon.problems import ProblemSpec
from monsoon.problems.linear import synthetic
from monsoon.rules import Rule
from monsoon.strategies.batches import global_batches, part_bounds
from monsoon.strategies import WorkerJob
from monsoon.strategies.base import SHARED_MEMORY
from monsoon.strategies.ops import AllReduce, Apply, Gradient, weighted
from monsoon.strategies.sync import Sync


class ClippedSync(Sync):
    name = "clipped-sync"
    options = (Option("clip_norm", float, 1.0, "largest L2 norm of a worker's gradient",
                      check=positive),)

    @classmethod
    def from_options(cls, run, rule, clip_norm=1.0):
        strategy = cls()
        strategy.clip_norm = clip_norm
        return strategy, rule

    def program(self, job):
        for batch in global_batches(job.n_examples, job.batch_size, job.seed, job.budget):
            start, stop = part_bounds(len(batch), job.workers, job.rank)
            _, grad = yield Gradient(batch[start:stop])
            norm = float(np.linalg.norm(grad))
            if norm > self.clip_norm:
                grad *= self.clip_norm / norm
            yield AllReduce(grad, stop - start)

    def describe(self):
        return {"strategy": self.name, "clip_norm": self.clip_norm}


class SignumState(NamedTuple):
    momentum: np.ndarray


class Signum(Rule):
    name = "signum"
    options = Rule.options + (
        Option("signum_beta", float, 0.9, "momentum of the sign's average",
               check=lambda v: None if 0 <= v < 1 else "in [0, 1)"),)

    def __init__(self, schedule, signum_beta=0.9, **common):
        super().__init__(schedule, **common)
        self.beta = signum_beta

    def init(self, n, dtype, zeros=np.zeros):
        return SignumState(zeros(n, dtype=dtype))

    def apply(self, w, g, state, info):
        m = state.momentum
        m *= self.beta
        m += (1 - self.beta) * g
        w -= self.learning_rate(info) * np.sign(m)

    def describe(self):
        return {**super().describe(), "signum_beta": self.beta}


def noisy_line(dtype="float64", noise=0.1, rows=4096):
    return synthetic("squared", n=rows, noise=noise, dtype=dtype, name="noisy-line")


NOISY_LINE = ProblemSpec(
    "noisy-line", noisy_line, "least squares on a planted linear model with label noise",
    defaults={"lr": 0.05, "epochs": 2, "batch_size": 16},
    options=(Option("noise", float, 0.1, "standard deviation of the label noise",
                    check=lambda v: None if v >= 0 else "0 or more"),
             Option("rows", int, 4096, "training examples", check=at_least(16))))


class RoundRobin(Engine):
    name = "round-robin"
    backend_used = "one thread"
    ops = frozenset({Gradient, Apply})
    meets = frozenset({SHARED_MEMORY})  # every worker's Apply writes the one array
    options = (Option("quantum", int, 1, "ops each worker runs before the next one's turn",
                      check=at_least(1)),)

    @classmethod
    def from_options(cls, run, quantum=1):
        return cls(quantum)

    def __init__(self, quantum=1):
        self.quantum = quantum

    def describe(self):
        return {"engine": self.name, "quantum": self.quantum}

    def run(self, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder):
        self.check(strategy, workers)
        w, state = np.array(w0, copy=True), rule.init(w0.size, w0.dtype)
        programs = {rank: strategy.program(WorkerJob(rank, workers, problem.n_examples,
                                                     batch_size, seed, budget))
                    for rank in range(workers)}
        replies = dict.fromkeys(programs)
        examples = updates = dropped = 0
        recorder.start(w)
        t0 = time.perf_counter()
        while programs:
            for rank in list(programs):
                for _ in range(self.quantum):
                    try:
                        op = programs[rank].send(replies[rank])
                    except StopIteration:
                        del programs[rank]
                        break
                    if isinstance(op, Gradient):
                        loss, grad = problem.gradient(w, op.indices)
                        replies[rank] = loss, weighted(grad, op.weight)
                        examples += len(op.indices)
                    elif isinstance(op, Apply):
                        replies[rank] = None
                        if np.isfinite(op.grad).all():
                            rule.apply(w, op.grad, state, UpdateInfo(step=updates, worker=rank))
                            updates += 1
                        else:
                            dropped += 1
                    else:
                        raise ConfigError(f"the round-robin engine cannot run {type(op).__name__}")
        return EngineResult(w, 0.0, time.perf_counter() - t0, examples, updates, dropped,
                            Counter())


class HalfPrecision(Compressor):
    name = "fp16"

    def encode(self, v):
        half = v.astype(np.float16)
        return Encoded("fp16", v.size, {"values": half}, half.nbytes)

    def decode(self, enc, dtype):
        return enc.arrays["values"].astype(dtype)

    def pack(self, enc, dtype):
        return enc.arrays["values"].view(np.uint8)

    def unpack(self, buf, size, dtype):
        return Encoded("fp16", size, {"values": Reader(buf).array(size, np.float16)}, buf.nbytes)

"""The sim engine's model of a cluster's time.

- Compute: each gradient takes ``compute_s`` seconds, constant or lognormal
  (``compute_sigma`` > 0, the spread of log-time, mean kept at compute_s).
  Stragglers: with probability ``straggler_p`` a step is
  ``straggler_factor`` times slower, and a fraction ``slow_fraction`` of the
  workers (the highest ranks) are always that much slower.
- Network: a message of b bytes takes ``latency_s + b / bandwidth_Bps``
  (bandwidth 0 means infinite).
- Server: each shard serves one request at a time, taking ``service_s``;
  requests queue when it is busy, which is how a server becomes the
  bottleneck.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ...errors import ConfigError


@dataclass(frozen=True)
class DelayModel:
    compute_s: float = 1e-3
    compute_sigma: float = 0.0
    straggler_p: float = 0.0
    straggler_factor: float = 10.0
    slow_fraction: float = 0.0
    latency_s: float = 0.0
    bandwidth_Bps: float = 0.0
    service_s: float = 0.0

    def __post_init__(self):
        for name in ("compute_s", "compute_sigma", "latency_s", "bandwidth_Bps", "service_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if not 0 <= self.straggler_p <= 1 or not 0 <= self.slow_fraction <= 1:
            raise ConfigError("straggler probability and slow fraction must be in [0, 1]")
        if not self.straggler_factor >= 1:
            raise ConfigError(f"straggler factor must be at least 1, got {self.straggler_factor}")

    def slow_workers(self, workers: int) -> int:
        return int(round(self.slow_fraction * workers))

    def compute_time(self, rng: np.random.Generator, rank: int, workers: int) -> float:
        t = self.compute_s
        if self.compute_sigma > 0:  # lognormal with mean compute_s
            s = self.compute_sigma
            t *= math.exp(rng.normal(-0.5 * s * s, s))
        if rank >= workers - self.slow_workers(workers):
            t *= self.straggler_factor
        elif self.straggler_p > 0 and rng.random() < self.straggler_p:
            t *= self.straggler_factor
        return t

    def message_time(self, nbytes: int) -> float:
        return self.latency_s + (nbytes / self.bandwidth_Bps if self.bandwidth_Bps > 0 else 0.0)

    def describe(self) -> dict:
        return asdict(self)

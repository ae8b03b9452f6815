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
from ...options import Option, at_least, in_range

_NOT_NEGATIVE = lambda v: None if v >= 0 else "0 or more"  # noqa: E731

# The delay model's options: keyword sim_X, flag --X (sim_bandwidth: --bandwidth).
OPTIONS = (
    Option("sim_compute_s", float, 1e-3, "seconds per gradient", flag="--compute-s",
           label="compute time", check=_NOT_NEGATIVE),
    Option("sim_compute_sigma", float, 0.0, "lognormal spread of compute time (0: constant)",
           flag="--compute-sigma", label="compute sigma", check=_NOT_NEGATIVE),
    Option("sim_straggler_p", float, 0.0, "probability that a step is --straggler-factor times "
           "slower", flag="--straggler-p", label="straggler probability", check=in_range(0, 1)),
    Option("sim_straggler_factor", float, 10.0, "how much slower a straggler is",
           flag="--straggler-factor", label="straggler factor", check=at_least(1.0)),
    Option("sim_slow_fraction", float, 0.0, "fraction of workers always --straggler-factor "
           "times slower", flag="--slow-fraction", label="slow fraction", check=in_range(0, 1)),
    Option("sim_latency_s", float, 0.0, "seconds per message, before bandwidth",
           flag="--latency-s", label="latency", check=_NOT_NEGATIVE),
    Option("sim_bandwidth", float, 0.0, "bytes per second per message (0: infinite)",
           flag="--bandwidth", label="bandwidth", check=_NOT_NEGATIVE),
    Option("sim_service_s", float, 0.0, "seconds a server shard spends on each request",
           flag="--service-s", label="service time", check=_NOT_NEGATIVE),
)


def delay_model(sim_compute_s=1e-3, sim_compute_sigma=0.0, sim_straggler_p=0.0,
                sim_straggler_factor=10.0, sim_slow_fraction=0.0, sim_latency_s=0.0,
                sim_bandwidth=0.0, sim_service_s=0.0) -> "DelayModel":
    """The delay model from its options' values."""
    return DelayModel(sim_compute_s, sim_compute_sigma, sim_straggler_p, sim_straggler_factor,
                      sim_slow_fraction, sim_latency_s, sim_bandwidth, sim_service_s)


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

"""The sim engine's model of a cluster's time.

- Compute: ``compute_s`` is the time of one gradient over a whole batch
  (``--batch-size`` examples); a gradient over k examples takes ``compute_s
  * k / batch_size`` (a sync worker's 1/N slice, 1/N of it), constant or
  lognormal (``compute_sigma`` > 0, the spread of log-time, mean kept).
  Stragglers: with probability ``straggler_p`` a step is
  ``straggler_factor`` times slower, and a fraction ``slow_fraction`` of the
  workers (the highest ranks, rounded up to whole workers) are always that
  much slower.
- Network: a message of b bytes takes ``latency_s + b / bandwidth_Bps``
  (bandwidth 0 means infinite); one with no payload (a request) counts
  ``REQUEST_BYTES``.
- Server: each shard serves one request at a time, taking ``service_s``;
  requests queue when it is busy, which is how a server becomes the
  bottleneck.
- Pipeline stages (``stage_compute_s``, the pipeline strategy only): each
  stage's own compute seconds per batch, as measured (stages are rarely
  equal: the last computes the loss, the first no input gradient); without
  it a stage gets ``compute_s`` times its share of the parameters.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ...errors import ConfigError
from ...options import Option, at_least, in_range

_NOT_NEGATIVE = lambda v: None if v >= 0 else "0 or more"  # noqa: E731

REQUEST_BYTES = 64  # a message without a payload: a fetch request, SSP's clock reply

# The largest --compute-sigma. A lognormal draw keeps its mean at compute_s
# only through rare long draws: its median is exp(-sigma**2 / 2) of the mean,
# and half the mean rests on draws more than sigma deviations above the median.
# At sigma 3 (median 1% of compute_s, such draws 1 in 740) the mean compute
# time of 10,000 steps is 0.89 of compute_s in the median run; at 4, 0.56; at
# 10 every draw is below 1e-20 of it (at 39, 0): the simulated time no longer
# has the mean it was given.
SIGMA_MAX = 3.0


def _sigma_check(v):
    if 0 <= v <= SIGMA_MAX:
        return None
    return (f"in [0, {SIGMA_MAX:g}] (past {SIGMA_MAX:g} a lognormal's mean rests on draws "
            f"too rare for a run to meet, so steps would take far less than --compute-s)")


def parse_stage_times(text: str) -> tuple[float, ...]:
    """``"0.02,0.03"`` -> (0.02, 0.03); ConfigError naming the flag otherwise."""
    try:
        times = tuple(float(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        times = ()
    if not times or not all(t >= 0 and math.isfinite(t) for t in times):
        raise ConfigError(f"--stage-compute-s takes one number of seconds (0 or more) per "
                          f"pipeline stage, separated by commas, like 0.021,0.028; got {text!r}")
    return times


def _stage_check(text: str):
    try:
        parse_stage_times(text)
    except ConfigError:  # Option.value names the option as given (flag or keyword)
        return ("one number of seconds (0 or more) per pipeline stage, separated by commas, "
                "like 0.021,0.028")
    return None


# The delay model's options: keyword sim_X, flag --X (sim_bandwidth: --bandwidth).
OPTIONS = (
    Option("sim_compute_s", float, 1e-3, "seconds of one gradient over --batch-size examples "
           "(a gradient over k examples takes k / --batch-size of it: a sync worker's slice "
           "of N, 1/N)", flag="--compute-s",
           label="compute time", check=_NOT_NEGATIVE),
    Option("sim_compute_sigma", float, 0.0, "lognormal spread of compute time (0: constant; "
           "at most 3, past which a run rarely meets the draws that keep the mean)",
           flag="--compute-sigma", label="compute sigma", check=_sigma_check),
    Option("sim_straggler_p", float, 0.0, "probability that a step is --straggler-factor times "
           "slower", flag="--straggler-p", label="straggler probability", check=in_range(0, 1)),
    Option("sim_straggler_factor", float, 10.0, "how much slower a straggler is",
           flag="--straggler-factor", label="straggler factor", check=at_least(1.0)),
    Option("sim_slow_fraction", float, 0.0, "fraction of workers always --straggler-factor "
           "times slower, rounded up to whole workers (summary: delays.slow_workers)",
           flag="--slow-fraction", label="slow fraction", check=in_range(0, 1)),
    Option("sim_latency_s", float, 0.0, "seconds per message, before bandwidth",
           flag="--latency-s", label="latency", check=_NOT_NEGATIVE),
    Option("sim_bandwidth", float, 0.0, "bytes per second per message (0: infinite)",
           flag="--bandwidth", label="bandwidth", check=_NOT_NEGATIVE),
    Option("sim_service_s", float, 0.0, "seconds a server shard spends on each request",
           flag="--service-s", label="service time", check=_NOT_NEGATIVE),
    Option("sim_stage_compute_s", str, None, "pipeline: each stage's forward + backward + "
           "update seconds on one batch at the run's micro-batch size, like 0.021,0.028 "
           "(default: --compute-s shared by parameter count)", flag="--stage-compute-s",
           label="stage compute time", check=_stage_check),
)


def delay_model(**values) -> "DelayModel":
    """The delay model from its options' values (``OPTIONS``, in the order of
    its fields), each missing one at its default."""
    return DelayModel(*(values.get(o.name, o.default) for o in OPTIONS))


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
    stage_compute_s: str | None = None  # as given (config.json round-trips it)

    def __post_init__(self):
        for name in ("compute_s", "compute_sigma", "latency_s", "bandwidth_Bps", "service_s"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ConfigError(f"{name} must be a finite number, 0 or more, "
                                  f"got {getattr(self, name)}")
        if not self.compute_sigma <= SIGMA_MAX:
            raise ConfigError(f"compute_sigma must be {_sigma_check(self.compute_sigma)}, "
                              f"got {self.compute_sigma}")
        if not 0 <= self.straggler_p <= 1 or not 0 <= self.slow_fraction <= 1:
            raise ConfigError("straggler probability and slow fraction must be in [0, 1]")
        if not 1 <= self.straggler_factor < math.inf:
            raise ConfigError(f"straggler factor must be a finite number, at least 1, "
                              f"got {self.straggler_factor}")
        if self.stage_compute_s is not None:
            parse_stage_times(self.stage_compute_s)

    def stage_times(self, stages: int, cli: bool = True) -> tuple[float, ...] | None:
        """Each pipeline stage's compute seconds per batch, or None (not
        given); a refusal names the option as given (``cli``: the flag)."""
        if self.stage_compute_s is None:
            return None
        times = parse_stage_times(self.stage_compute_s)
        if len(times) != stages:
            option = next(o for o in OPTIONS if o.name == "sim_stage_compute_s")
            given = option.given(self.stage_compute_s, cli)
            raise ConfigError(f"{given} gives {len(times)} "
                              f"stage time(s), but the pipeline has {stages} stages; give "
                              f"{stages}, separated by commas")
        return times

    def slow_workers(self, workers: int) -> int:
        """The workers always slow: ``slow_fraction`` of them, rounded up (a
        positive fraction slows one at least; 0.25 of 2 is 1, 0.75 of 2 is
        2). Python's round() went to the even count: 0.5 to none, 1.5 to 2."""
        return math.ceil(round(self.slow_fraction * workers, 9))  # 0.3 * 10 is 3, not 4

    def compute_time(self, rng: np.random.Generator, rank: int, workers: int,
                     share: float = 1.0) -> float:
        """Seconds of one gradient of worker ``rank``: ``compute_s`` times
        ``share`` (its examples over the batch size), drawn and slowed."""
        t = self.compute_s * share
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

    def describe(self, workers: int | None = None) -> dict:
        """The model's settings; given the run's ``workers``, with the
        number always slow (``slow_workers``) too, as the summary has it."""
        out = asdict(self)
        if workers is not None:
            out["slow_workers"] = self.slow_workers(workers)
        return out

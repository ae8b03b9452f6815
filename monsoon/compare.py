"""``monsoon compare``: the same problem and budget under several strategies.

Writes one run folder per strategy (``OUT/STRATEGY/``), ``comparison.csv``,
``comparison.png`` (loss against wall time and against epochs, one curve per
strategy) and ``report.md``. ``serial`` always runs with one worker: it is the
baseline the speedups are measured against.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .api import Result, train
from .config import for_strategy, refuse_untaken
from .errors import ConfigError
from .record.report import write_comparison
from .strategies import STRATEGIES


@dataclass
class Comparison:
    results: dict[str, Result]
    rows: list[dict]
    out: Path


def compare(problem="exp", strategies=("serial", "sync", "async", "hogwild"), workers: int = 2,
            out="runs/compare", **options) -> Comparison:
    if isinstance(strategies, str):
        strategies = [s.strip() for s in strategies.split(",") if s.strip()]
    if not strategies:
        raise ConfigError("no strategies given; e.g. --strategies serial,sync,async,hogwild")
    classes = {s: STRATEGIES.get(s) for s in strategies}  # an unknown name lists the valid ones
    if len(set(strategies)) != len(strategies):
        raise ConfigError("a strategy is listed twice in --strategies")
    # an option is refused only when none of the strategies takes it
    refuse_untaken({k: v for k, v in options.items() if STRATEGIES.takers(k)},
                   {"strategy": list(strategies)})
    out = Path(out)
    results = {}
    for s in strategies:
        results[s] = train(problem, strategy=s, workers=1 if classes[s].single_worker else workers,
                           out=out / s, raise_on_divergence=False, **for_strategy(options, s))
    name = next(iter(results.values())).summary["problem"]
    rows = write_comparison(out, name, [r.summary for r in results.values()],
                            {s: r.history for s, r in results.items()},
                            target=options.get("target_loss"))
    return Comparison(results, rows, out)

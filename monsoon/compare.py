"""``monsoon compare``: the same problem and budget under several strategies.

Writes one run folder per strategy (``OUT/STRATEGY/``), ``comparison.csv``,
``comparison.png`` (loss against wall time and against epochs, one curve per
strategy) and ``report.md``. ``serial`` always runs with one worker: it is the
baseline the speedups are measured against.

``repeats``: every strategy runs that many times, in turns (serial, sync,
..., serial, sync, ...), so that a slow spell of a shared machine falls on
all of them alike. The report's speeds are then the medians of those runs
(with their ranges), and each speedup the median of the runs' ratios to the
serial run of their turn. The first turn's folders are ``OUT/STRATEGY/`` (its
curves are the ones plotted); later turns write ``OUT/repeats/STRATEGY-K/``.
``compress``: one ``--compress`` spec for every strategy, or one per
strategy, ``STRATEGY=SPEC,...`` (e.g. ``sync=topk:0.01,local-sgd=powersgd:2``;
a strategy not named runs uncompressed; one spec compresses the strategies
that send messages, and those that send none, serial and hogwild, run
uncompressed). comparison.csv and report.md then
carry each run's bytes sent and compression ratio.

Short single runs vary from one to the next on a busy machine;
bench/quick_start.py measures how much for the quick start's report.
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from pathlib import Path

from .api import Result, check, train
from .config import (RUN, check_compare_compress, check_error_feedback, for_strategy,
                     refuse_untaken)
from .compressors.messages import by_strategy
from .errors import ConfigError
from .record.report import write_comparison
from .strategies import STRATEGIES


@dataclass
class Comparison:
    results: dict[str, Result]
    rows: list[dict]
    out: Path


def compare(problem="exp", strategies=("serial", "sync", "async", "hogwild"), workers: int = 2,
            out="runs/compare", repeats: int = 1, **options) -> Comparison:
    if isinstance(strategies, str):
        strategies = [s.strip() for s in strategies.split(",") if s.strip()]
    if not strategies:
        raise ConfigError("no strategies given; e.g. --strategies serial,sync,async,hogwild")
    classes = {s: STRATEGIES.get(s) for s in strategies}  # an unknown name lists the valid ones
    RUN["workers"].value(workers)  # checked even where every strategy runs one worker
    if len(set(strategies)) != len(strategies):
        raise ConfigError("a strategy is listed twice in --strategies")
    # an option is refused only when none of the strategies takes it
    refuse_untaken({k: v for k, v in options.items() if STRATEGIES.takers(k)},
                   {"strategy": list(strategies)})
    if isinstance(repeats, bool) or not isinstance(repeats, Integral) or repeats < 1:
        raise ConfigError(f"repeats must be a whole number >= 1 (got {repeats!r}); "
                          "e.g. --repeats 3")
    named = set(by_strategy(options.get("compress")) or ()) - set(strategies)
    if named:
        raise ConfigError(f"--compress names {', '.join(sorted(named))}, not in --strategies "
                          f"({', '.join(strategies)}); give STRATEGY=SPEC for those listed")
    check_compare_compress(options.get("compress"), list(strategies))
    check_error_feedback(options.get("compress"), options.get("no_error_feedback"))
    out = Path(out)
    counts = {s: 1 if classes[s].single_worker else workers for s in strategies}
    # passed to every strategy: one that has no use for an option (serial, --shards) takes it
    shared = frozenset(k for k, v in options.items() if v is not None)
    for s in strategies:  # every strategy's run checked before any starts
        check(problem, s, counts[s], out=out / s, shared=shared, **for_strategy(options, s))
    results, turns = {}, {s: [] for s in strategies}
    for turn in range(int(repeats)):
        for s in strategies:
            folder = out / s if turn == 0 else out / "repeats" / f"{s}-{turn + 1}"
            result = train(problem, strategy=s, workers=counts[s], out=folder,
                           raise_on_divergence=False, shared=shared, **for_strategy(options, s))
            results.setdefault(s, result)
            turns[s].append(result.summary)
    name = next(iter(results.values())).summary["problem"]
    rows = write_comparison(out, name, [turns[s] for s in strategies],
                            {s: r.history for s, r in results.items()},
                            target=options.get("target_loss"))
    return Comparison(results, rows, out)


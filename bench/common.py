"""Shared by the benchmarks: interleaved repetitions and a ratio table.

Absolute times drift on shared machines, so every benchmark runs monsoon and
its peer alternately in one process tree, several times, and reports the
ratio of the medians."""
from __future__ import annotations

import json
import platform
import statistics
import sys
import time


def interleave(runs: dict, repeats: int) -> dict[str, list[float]]:
    """Call each ``runs[name]()`` (returning a number) ``repeats`` times, in turn."""
    results = {name: [] for name in runs}
    for rep in range(repeats):
        for name, fn in runs.items():
            value = fn()
            results[name].append(value)
            print(f"  rep {rep + 1}/{repeats} {name}: {value:.6g}", file=sys.stderr, flush=True)
    return results


WARMUP = 3  # steps left out of a run's figure, as ddp_peer leaves out of DDP's


def examples_per_s_after_warmup(run, warmup: int = WARMUP) -> float:
    """A monsoon run's examples/s from its loss-curve rows, leaving out the
    steps before ``warmup`` updates (first-touch page faults, allocator and
    BLAS start-up), as the peers' figures leave them out; the whole run's
    figure if no row falls between."""
    rows, last = run.history, run.history[-1]
    warm = next((r for r in rows if r["updates"] >= warmup), last)
    if warm is last:
        return run.summary["examples_per_s"]
    return (last["examples"] - warm["examples"]) / (last["time_s"] - warm["time_s"])


def median(values):
    return statistics.median(values)


def median_and_range(values, fmt: str) -> str:
    """``values``' median and their range, each as ``fmt``: "1.15 (runs 1.14-1.17)"."""
    return f"{median(values):{fmt}} (runs {min(values):{fmt}}-{max(values):{fmt}})"


def report(title: str, rows: list[tuple[str, str]], extra: dict | None = None) -> None:
    print(f"\n## {title}")
    print(f"python {platform.python_version()}, {platform.machine()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    if extra is not None:
        print(json.dumps(extra))

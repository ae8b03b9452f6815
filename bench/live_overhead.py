"""Live series at the default interval against the same run without them.

Each shape runs with a run folder either way; "on" writes the live series
(TensorBoard event files under OUT/tb, every ``--live-every`` 1 s, the
default), "off" passes ``live_every=0``. Shapes: the quick start's sync
(``exp``, 2 workers, the problem's defaults) and the sync sweep's shapes
(bench/sync_sweep.py, 2 workers). The figure is the run's examples/s
(``summary.json``: start-up excluded); the runs alternate on, off, on, ...
and each shape's ratio is the median of the turns' on/off ratios.

Target (issue 34): >= 0.98 on every shape.

    flock /tmp/monsoon-bench.lock python bench/live_overhead.py [--repeats 5] [--shapes ...]
"""
import argparse
import tempfile

import numpy as np
import torch
from torch import nn

import monsoon
from common import interleave, median, median_and_range, report
from records import row, write_record
from sync_sweep import LR, SHAPES, data

TARGET = 0.98


def quick_start(live_every: float) -> float:
    with tempfile.TemporaryDirectory() as out:
        run = monsoon.train("exp", "sync", 2, out=out, progress=False, live_every=live_every)
    return run.summary["examples_per_s"]


def sweep_shape(name: str, live_every: float) -> float:
    make_model, batch, steps = SHAPES[name]
    X, y = data()
    torch.manual_seed(0)
    problem = monsoon.TorchProblem(make_model(), nn.CrossEntropyLoss(), X, torch.as_tensor(y),
                                   name="sweep")
    with tempfile.TemporaryDirectory() as out:
        run = monsoon.train(problem, "sync", 2, steps=steps, batch_size=batch, lr=LR, seed=0,
                            out=out, progress=False, live_every=live_every)
    return run.summary["examples_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shapes", default="quick-start," + ",".join(SHAPES),
                    help="comma-separated: quick-start and any of bench/sync_sweep.py's")
    args = ap.parse_args()
    records, lines, met = [], [], True
    for name in [s.strip() for s in args.shapes.split(",") if s.strip()]:
        run = quick_start if name == "quick-start" else (lambda lv, n=name: sweep_shape(n, lv))
        got = interleave({"on": lambda: run(1.0), "off": lambda: run(0.0)}, args.repeats)
        ratios = [a / b for a, b in zip(got["on"], got["off"])]
        ratio = median(ratios)
        ok = ratio >= TARGET
        met &= ok
        records.append(row(name, ours=got["on"], peer=got["off"], ratio=ratio,
                           ratio_runs=ratios, unit="examples/s", target=f">= {TARGET}", met=ok))
        lines.append((name, f"{median_and_range(ratios, '.3f')}  (on "
                            f"{np.median(got['on']):.4g}, off {np.median(got['off']):.4g} ex/s)"))
    report("live series on / off, sync x2, examples/s (median of interleaved turns)", lines)
    worst = min(records, key=lambda r: r["ratio"])
    write_record("live_overhead", vars(args), records, {
        "ratio": worst["ratio"], "target": f">= {TARGET} on every shape", "met": met,
        "line": f"live series at the default interval: worst shape {worst['ratio']:.3f}x the "
                f"run without them ({worst['name']}) (target >= {TARGET})"})


if __name__ == "__main__":
    main()

"""Sync across shapes: monsoon ``sync`` x2 against DDP (gloo) x2 and against one
process using every core, on MLPs from 64 to 2048 wide with batches from 32 to
1024, and a small CNN.

Each shape runs the three side by side, interleaved, ``--repeats`` times:

- monsoon ``sync`` with 2 workers, as ``monsoon.train`` runs it by default
  (loss curve on), examples/s from its loss-curve rows after the first 3
  steps (start-up and warm-up excluded, as the peers exclude them);
- DDP on gloo, 2 processes with one torch thread each (``ddp_peer.py``);
- the ceiling: one process, plain SGD, run both with one torch thread per
  core and with one thread; the ceiling is the larger of the two medians
  (the better configuration for the shape, not the luckier of two runs).

Printed per shape: the medians and the two ratios, sync/ceiling (target
>= 0.9) and sync/DDP (target >= 1.1); then the worst shape of each.

    python bench/sync_sweep.py [--repeats 3] [--quick]
"""
import argparse
import functools
import os

import numpy as np
import torch
from torch import nn

import monsoon
from common import examples_per_s_after_warmup, interleave, median, report
from ddp_peer import ddp_examples_per_s, one_process_examples_per_s
from records import row, write_record

N_EXAMPLES, LR = 8192, 0.01


def mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)),
                         nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(512, 10))


def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N_EXAMPLES, 784)).astype(np.float32)
    y = rng.integers(0, 10, N_EXAMPLES)
    return X, y


# name -> (model factory, batch, steps); steps sized for a few seconds a run
# here, and at least 40: monsoon's rate is read off its loss-curve rows, whose
# counters move a whole step at a time, so the rows after the warm-up must
# span many steps (with 8, mlp2048's spanned one: 0.5-5x the true rate)
SHAPES = {
    "mlp64-b32": (functools.partial(mlp, 64), 32, 3000),
    "mlp256-b128": (functools.partial(mlp, 256), 128, 1000),
    "mlp512-b256": (functools.partial(mlp, 512), 256, 120),
    "mlp1024-b512": (functools.partial(mlp, 1024), 512, 60),
    "mlp2048-b1024": (functools.partial(mlp, 2048), 1024, 40),
    "cnn-b128": (cnn, 128, 60),
}


def monsoon_rate(make_model, batch, steps, strategy="sync", workers=2, **options) -> float:
    """monsoon's examples/s on a shape (``sync`` x2 by default; the other
    benchmarks of the sweep's shapes pass their strategy, engine, options)."""
    X, y = data()
    torch.manual_seed(0)
    problem = monsoon.TorchProblem(make_model(), nn.CrossEntropyLoss(), X, torch.as_tensor(y),
                                   name="sweep")
    run = monsoon.train(problem, strategy, workers, steps=steps, batch_size=batch, lr=LR, seed=0,
                        progress=False, **options)
    return examples_per_s_after_warmup(run)


def ddp(make_model, batch, steps) -> float:
    return ddp_examples_per_s(make_model, data, nn.CrossEntropyLoss(), batch, LR, steps)


def one_process(make_model, batch, steps, threads) -> float:
    """One process, plain SGD, ``threads`` torch threads: with one thread per
    core, or with one thread where a small model's ops are too short to split."""
    return one_process_examples_per_s(make_model, data, nn.CrossEntropyLoss(), batch, LR, steps,
                                      threads)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a quarter of the steps, 1 repeat")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset")
    args = ap.parse_args()
    repeats = 1 if args.quick else args.repeats
    rows, extra, records = [], {}, []
    worst_ceiling, worst_ddp = (None, np.inf), (None, np.inf)
    for name in args.shapes.split(","):
        make_model, batch, steps = SHAPES[name]
        steps = max(4, steps // 4) if args.quick else steps
        print(f"{name}:", flush=True)
        runs = {"sync": lambda: monsoon_rate(make_model, batch, steps),
                "ddp": lambda: ddp(make_model, batch, steps)}
        for threads in sorted({1, os.cpu_count() or 1}):
            runs[f"one process, {threads} thread(s)"] = functools.partial(
                one_process, make_model, batch, steps, threads)
        times = interleave(runs, repeats)
        m = {k: median(v) for k, v in times.items()}
        best = max((k for k in times if k.startswith("one process")), key=m.get)
        m["ceiling"], times["ceiling"] = m[best], times[best]
        vs_ceiling, vs_ddp = m["sync"] / m["ceiling"], m["sync"] / m["ddp"]
        spread = (min(times["sync"]) / m["ceiling"], max(times["sync"]) / m["ceiling"])
        rows.append((f"{name} examples/s sync / DDP / ceiling",
                     f"{m['sync']:.0f} / {m['ddp']:.0f} / {m['ceiling']:.0f}"))
        rows.append((f"{name} sync/ceiling, sync/DDP",
                     f"{vs_ceiling:.2f} (runs {spread[0]:.2f}-{spread[1]:.2f}), {vs_ddp:.2f}"))
        extra[name] = {**times, "vs_ceiling": vs_ceiling, "vs_ddp": vs_ddp}
        records.append(row(f"{name} vs one process", times["sync"], times["ceiling"],
                           vs_ceiling, ">= 0.9", vs_ceiling >= 0.9, unit="examples/s",
                           ratio_runs=[v / m["ceiling"] for v in times["sync"]]))
        records.append(row(f"{name} vs DDP", times["sync"], times["ddp"], vs_ddp, ">= 1.1",
                           vs_ddp >= 1.1, unit="examples/s",
                           ratio_runs=[v / m["ddp"] for v in times["sync"]]))
        worst_ceiling = min(worst_ceiling, (name, vs_ceiling), key=lambda t: t[1])
        worst_ddp = min(worst_ddp, (name, vs_ddp), key=lambda t: t[1])
    rows.append(("worst sync/ceiling", f"{worst_ceiling[1]:.2f} ({worst_ceiling[0]})"
                 "   (target >= 0.9)"))
    rows.append(("worst sync/DDP", f"{worst_ddp[1]:.2f} ({worst_ddp[0]})   (target >= 1.1)"))
    report(f"sync x2 vs DDP x2 vs one process ({os.cpu_count()} cores), median of {repeats}",
           rows, extra)
    met = worst_ceiling[1] >= 0.9 and worst_ddp[1] >= 1.1
    write_record("sync_sweep", vars(args), records, {
        "ratio": worst_ceiling[1], "target": ">= 0.9 vs one process, >= 1.1 vs DDP, every shape",
        "met": met, "worst_vs_ddp": worst_ddp[1],
        "line": f"worst shape: sync x2 at {worst_ceiling[1]:.2f}x one process "
                f"({worst_ceiling[0]}) and {worst_ddp[1]:.2f}x DDP ({worst_ddp[0]}) "
                f"(targets >= 0.9 and >= 1.1)"})


if __name__ == "__main__":
    main()

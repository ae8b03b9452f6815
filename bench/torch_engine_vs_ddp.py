"""The torch engine's sync x2 against PyTorch DDP x2, both on gloo, on the
shapes of ``sync_sweep.py`` (MLPs 64 to 2048 wide, batches 32 to 1024, a
small CNN).

Each shape runs the two side by side, interleaved, ``--repeats`` times:

- ``monsoon.train(problem, "sync", 2, engine="torch")``: torchrun's elastic
  agent starts 2 ranks (one torch thread each); examples/s of rank 0's
  training loop after its first 3 steps, from the loss curve's rows (the
  default 100 per run): the same
  3 warm-up steps DDP's figure leaves out;
- DDP on gloo, 2 spawned processes with one torch thread each
  (``ddp_peer.py``), after 3 warm-up steps.

Printed per shape: the medians, the ratio engine/DDP (target >= 1.0) and the
spread of the engine's runs over DDP's median; then the worst shape.

    python bench/torch_engine_vs_ddp.py [--repeats 3] [--scale 0.5] [--shapes a,b]
"""
import argparse
import os

import numpy as np
from torch import nn

from common import interleave, median, report
from ddp_peer import ddp_examples_per_s
from records import row, write_record
from sync_sweep import LR, SHAPES, data, monsoon_rate

# loss-curve rows: the CLI's default, as a user runs it (each also costs a
# full-data evaluation after the run, outside the figure)
EVALS = 100


def torch_engine(make_model, batch, steps) -> float:
    return monsoon_rate(make_model, batch, steps, engine="torch", dist_backend="gloo",
                        evals=EVALS)


def ddp(make_model, batch, steps) -> float:
    return ddp_examples_per_s(make_model, data, nn.CrossEntropyLoss(), batch, LR, steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply sync_sweep's steps")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one torch thread per rank, as DDP's
    rows, extra, worst, records = [], {}, (None, np.inf), []
    for name in args.shapes.split(","):
        make_model, batch, steps = SHAPES[name]
        steps = max(4, int(steps * args.scale))
        print(f"{name}: {steps} steps", flush=True)
        times = interleave({"torch": lambda: torch_engine(make_model, batch, steps),
                            "ddp": lambda: ddp(make_model, batch, steps)}, args.repeats)
        m = {k: median(v) for k, v in times.items()}
        ratio = m["torch"] / m["ddp"]
        spread = (min(times["torch"]) / m["ddp"], max(times["torch"]) / m["ddp"])
        rows.append((f"{name} examples/s torch engine / DDP",
                     f"{m['torch']:.0f} / {m['ddp']:.0f}"))
        rows.append((f"{name} torch engine / DDP",
                     f"{ratio:.2f} (engine runs {spread[0]:.2f}-{spread[1]:.2f})"))
        extra[name] = {**times, "ratio": ratio}
        records.append(row(name, times["torch"], times["ddp"], ratio, ">= 1.0", ratio >= 1.0,
                           unit="examples/s",
                           ratio_runs=[v / m["ddp"] for v in times["torch"]]))
        worst = min(worst, (name, ratio), key=lambda t: t[1])
    rows.append(("worst torch engine / DDP", f"{worst[1]:.2f} ({worst[0]})   (target >= 1.0)"))
    report(f"torch engine sync x2 vs DDP x2 (gloo, {os.cpu_count()} cores), median of "
           f"{args.repeats}", rows, extra)
    write_record("torch_engine_vs_ddp", vars(args), records, {
        "ratio": worst[1], "target": ">= 1.0 every shape", "met": worst[1] >= 1.0,
        "line": f"worst shape: the torch engine at {worst[1]:.2f}x DDP's examples/s "
                f"({worst[0]}; target >= 1.0)"})


if __name__ == "__main__":
    main()

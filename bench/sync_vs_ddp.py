"""monsoon ``sync`` (2 workers) against PyTorch DistributedDataParallel (gloo, 2 processes).

The model is an MLP 784-1024-1024-10 (1.86M parameters) with cross-entropy,
global batch 256 (128 per worker), plain SGD, on synthetic MNIST-shaped data.
Both sides use one torch thread per process on this 2-core machine, both
exclude start-up and a few warm-up steps, and the peers run alternately.
Printed: examples/s of each, and their ratio (target >= 1.5). For scale,
one process with 2 threads is also timed.

    python bench/sync_vs_ddp.py [--steps 60] [--repeats 3]
"""
import argparse

import numpy as np
import torch
from torch import nn

import monsoon
from common import interleave, median, report
from ddp_peer import ddp_examples_per_s, one_process_examples_per_s
from records import row, write_record

N_EXAMPLES, BATCH, LR = 8192, 256, 0.01


def mlp():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N_EXAMPLES, 784)).astype(np.float32)
    y = rng.integers(0, 10, N_EXAMPLES)
    return X, y


def monsoon_sync(steps: int) -> float:
    X, y = data()
    torch.manual_seed(0)
    problem = monsoon.TorchProblem(mlp(), nn.CrossEntropyLoss(), X, torch.as_tensor(y), name="mlp")
    run = monsoon.train(problem, "sync", 2, steps=steps, batch_size=BATCH, lr=LR, evals=0,
                        progress=False)
    return run.summary["examples_per_s"]


def ddp(steps: int) -> float:
    return ddp_examples_per_s(mlp, data, nn.CrossEntropyLoss(), BATCH, LR, steps)


def one_process(steps: int, threads: int = 2) -> float:
    return one_process_examples_per_s(mlp, data, nn.CrossEntropyLoss(), BATCH, LR, steps, threads)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    results = interleave({"monsoon sync x2": lambda: monsoon_sync(args.steps),
                          "DDP gloo x2": lambda: ddp(args.steps),
                          "1 process, 2 threads": lambda: one_process(args.steps)}, args.repeats)
    m = {k: median(v) for k, v in results.items()}
    ratio = m["monsoon sync x2"] / m["DDP gloo x2"]
    report("sync x2 vs DDP (gloo) x2, MLP 784-1024-1024-10, batch 256", [
        ("monsoon sync x2, examples/s", f"{m['monsoon sync x2']:.0f}"),
        ("DDP gloo x2, examples/s", f"{m['DDP gloo x2']:.0f}"),
        ("1 process 2 threads, examples/s", f"{m['1 process, 2 threads']:.0f}"),
        ("ratio monsoon/DDP", f"{ratio:.2f}   (target >= 1.5)"),
    ], {k: v for k, v in results.items()} | {"ratio": ratio})
    ours, ddp_runs = results["monsoon sync x2"], results["DDP gloo x2"]
    spread = [v / m["DDP gloo x2"] for v in ours]
    one = m["1 process, 2 threads"]
    write_record("sync_vs_ddp", vars(args), [
        row("sync x2 / DDP x2", ours, ddp_runs, ratio, ">= 1.5", ratio >= 1.5,
            unit="examples/s", ratio_runs=spread),
        row("sync x2 / one process, 2 threads", ours, results["1 process, 2 threads"],
            m["monsoon sync x2"] / one, unit="examples/s")],
        {"ratio": ratio, "ratio_runs": spread, "target": ">= 1.5", "met": ratio >= 1.5,
         "line": f"sync x2 runs {ratio:.2f}x DDP's examples/s (target >= 1.5), "
                 f"{m['monsoon sync x2'] / one:.2f}x one process with 2 threads"})


if __name__ == "__main__":
    main()

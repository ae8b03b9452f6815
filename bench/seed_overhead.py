"""Seed 001's problem (``exp``): time per step of ``sync`` with 2 workers over ``serial``.

Seed 001 found its data-parallel version "roughly twice as slow" as one CPU,
and PyTorch DDP on gloo is 5.6x slower than serial on this problem. Target:
monsoon's ratio <= 1.1. Start-up (spawning workers) is excluded from both,
as DDP's process-group set-up would be; time per step = wall time / updates.

    python bench/seed_overhead.py [--steps 3000] [--repeats 5]
"""
import argparse

import monsoon
from common import interleave, median, report


def per_step_us(strategy: str, workers: int, steps: int) -> float:
    run = monsoon.train("exp", strategy, workers, steps=steps, evals=0, seed=0, progress=False)
    return 1e6 * run.summary["wall_time_s"] / run.summary["updates"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    times = interleave({"serial": lambda: per_step_us("serial", 1, args.steps),
                        "sync-2": lambda: per_step_us("sync", 2, args.steps)}, args.repeats)
    serial, sync = median(times["serial"]), median(times["sync-2"])
    report("seed 001 (exp): sync x2 vs serial, time per step", [
        ("serial, us/step (median)", f"{serial:.1f}"),
        ("sync x2, us/step (median)", f"{sync:.1f}"),
        ("ratio sync/serial", f"{sync / serial:.2f}   (target <= 1.1; DDP on gloo: 5.6)"),
    ], {"serial_us": times["serial"], "sync2_us": times["sync-2"], "ratio": sync / serial})


if __name__ == "__main__":
    main()

"""Seed 001's problem (``exp``): time per step of ``sync`` with 2 workers over ``serial``.

Seed 001 found its data-parallel version "roughly twice as slow" as one CPU,
and PyTorch DDP on gloo is 5.6x slower than serial on this problem. Target:
monsoon's ratio <= 1.1. Start-up (spawning workers) is excluded from both,
as DDP's process-group set-up would be; time per step = wall time / updates.

    python bench/seed_overhead.py [--steps 3000] [--repeats 5]

DDP (gloo, 2 processes) runs the same model, batch and steps alongside.
"""
import argparse

import torch

import monsoon
from common import interleave, median, report
from ddp_peer import ddp_examples_per_s
from monsoon.problems import make_problem

BATCH = 16


def exp_model():
    return make_problem("exp").model_at(make_problem("exp").initial_params(0))


def exp_data():
    p = make_problem("exp")
    return p.X, p.y


def per_step_us(strategy: str, workers: int, steps: int) -> float:
    run = monsoon.train("exp", strategy, workers, steps=steps, batch_size=BATCH, evals=0,
                        seed=0, progress=False)
    return 1e6 * run.summary["wall_time_s"] / run.summary["updates"]


def ddp_per_step_us(steps: int) -> float:
    return 1e6 * BATCH / ddp_examples_per_s(exp_model, exp_data, torch.nn.MSELoss(), BATCH,
                                            0.05, steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    times = interleave({"serial": lambda: per_step_us("serial", 1, args.steps),
                        "sync-2": lambda: per_step_us("sync", 2, args.steps),
                        "ddp-2": lambda: ddp_per_step_us(args.steps)}, args.repeats)
    serial, sync, ddp = (median(times[k]) for k in ("serial", "sync-2", "ddp-2"))
    report("seed 001 (exp): time per step over serial's", [
        ("serial, us/step (median)", f"{serial:.1f}"),
        ("monsoon sync x2, us/step (median)", f"{sync:.1f}"),
        ("DDP gloo x2, us/step (median)", f"{ddp:.1f}"),
        ("ratio sync/serial", f"{sync / serial:.2f}   (target <= 1.1)"),
        ("ratio DDP/serial", f"{ddp / serial:.2f}"),
    ], {**times, "ratio": sync / serial, "ddp_ratio": ddp / serial})


if __name__ == "__main__":
    main()

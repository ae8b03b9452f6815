"""How fast the sim engine simulates: 1,000 workers, 100,000 updates.

Async (Downpour) on the ``linear`` model (21 parameters, staleness-aware rate:
plain SGD diverges at delays of 1000) with lognormal
compute times: every update is a real gradient and a real rule
application, plus the events of a fetch and a push. Prints simulated updates
per (real) second and its ratio to serial SGD's steps per second on the same
model, which is the cost of the simulation over the math itself.
Target: the whole run under 2 minutes.

    python bench/sim_scale.py [--workers 1000] [--updates 100000]
"""
import argparse
import time

import monsoon
from common import report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--updates", type=int, default=100_000)
    args = ap.parse_args()
    t = time.perf_counter()
    sim = monsoon.train("linear", "async", args.workers, engine="sim", steps=args.updates,
                        sim_compute_sigma=0.5, sim_latency_s=1e-4, staleness_lr=True, evals=20,
                        progress=False)
    sim_wall = time.perf_counter() - t
    serial = monsoon.train("linear", "serial", steps=args.updates, evals=0, progress=False)
    sim_rate = sim.summary["updates"] / sim.summary["real_time_s"]
    serial_rate = serial.summary["updates"] / serial.summary["wall_time_s"]
    report(f"sim engine: {args.workers} workers, {args.updates} updates (linear, async)", [
        ("whole run, s", f"{sim_wall:.1f}   (target < 120)"),
        ("simulated updates per second", f"{sim_rate:.0f}"),
        ("serial SGD steps per second", f"{serial_rate:.0f}"),
        ("ratio sim/serial", f"{sim_rate / serial_rate:.3f}   (the simulation's overhead: "
                             f"{serial_rate / sim_rate:.1f}x the math)"),
        ("simulated time, s", f"{sim.summary['wall_time_s']:.2f}"),
        ("staleness mean", f"{sim.summary['staleness']['mean']:.0f}"),
    ], {"run_s": sim_wall, "sim_updates_per_s": sim_rate, "serial_steps_per_s": serial_rate})


if __name__ == "__main__":
    main()

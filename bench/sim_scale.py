"""How fast the sim engine simulates: 1,000 workers, 100,000 updates.

Async (Downpour) on the ``linear`` model (21 parameters, staleness-aware rate:
plain SGD diverges at delays of 1000) with lognormal
compute times: every update is a real gradient and a real rule
application, plus the events of a fetch and a push. Prints simulated updates
per (real) second and its ratio to serial SGD's steps per second on the same
model, which is the cost of the simulation over the math itself.
Target: the whole run under 2 minutes.

    python bench/sim_scale.py [--workers 1000] [--updates 100000] [--repeats 3]
"""
import argparse
import time

import monsoon
from common import interleave, median, median_and_range, report
from records import row, write_record


def sim_run(workers: int, updates: int) -> dict:
    t = time.perf_counter()
    sim = monsoon.train("linear", "async", workers, engine="sim", steps=updates,
                        sim_compute_sigma=0.5, sim_latency_s=1e-4, staleness_lr=True, evals=20,
                        progress=False)
    return {"run_s": time.perf_counter() - t,
            "rate": sim.summary["updates"] / sim.summary["real_time_s"],
            "simulated_s": sim.summary["wall_time_s"],
            "staleness": sim.summary["staleness"]["mean"]}


def serial_rate(updates: int) -> float:
    serial = monsoon.train("linear", "serial", steps=updates, evals=0, progress=False)
    return serial.summary["updates"] / serial.summary["wall_time_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--updates", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sims = []

    def timed_sim() -> float:
        sims.append(sim_run(args.workers, args.updates))
        return sims[-1]["run_s"]

    times = interleave({"sim": timed_sim, "serial": lambda: serial_rate(args.updates)},
                       args.repeats)
    serial = median(times["serial"])
    rates = [s["rate"] for s in sims]
    rate = median(rates)
    report(f"sim engine: {args.workers} workers, {args.updates} updates (linear, async), "
           f"median of {args.repeats}", [
        ("whole run, s", median_and_range(times["sim"], ".1f") + "   (target < 120)"),
        ("simulated updates per second", median_and_range(rates, ".0f")),
        ("serial SGD steps per second", f"{serial:.0f}"),
        ("ratio sim/serial", f"{rate / serial:.3f}   (the simulation's overhead: "
                             f"{serial / rate:.1f}x the math)"),
        ("simulated time, s", f"{sims[0]['simulated_s']:.2f}"),
        ("staleness mean", f"{sims[0]['staleness']:.0f}"),
    ], {"run_s": times["sim"], "sim_updates_per_s": rates, "serial_steps_per_s": times["serial"]})
    run_s = median(times["sim"])
    write_record("sim_scale", vars(args), [
        row("whole run", ratio=run_s, ratio_runs=times["sim"], target="< 120", met=run_s < 120,
            unit="s"),
        row("simulated updates/s over serial steps/s", rates, times["serial"], rate / serial,
            unit="per s")],
        {"ratio": run_s, "ratio_runs": times["sim"], "target": "< 120 s", "met": run_s < 120,
         "line": f"{args.workers} simulated workers, {args.updates} updates: {run_s:.1f} s "
                 f"(target < 120 s), {serial / rate:.1f}x the cost of the bare SGD math"})


if __name__ == "__main__":
    main()

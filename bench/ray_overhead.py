"""monsoon's ray engine against the same Downpour loop written directly with
Ray actors, on a 1M-parameter model (``quadratic``), one parameter-server
shard, 2 workers, on a local Ray instance. Prints updates/s of each and the
overhead ratio raw / monsoon (target <= 1.2). Start-up is excluded from both.

    python bench/ray_overhead.py [--updates 300] [--repeats 3]
"""
import argparse
import os
import sys

import ray

import monsoon
from common import interleave, median, report
from ray_peer import raw_ray_updates_per_s
from records import row, write_record


def monsoon_updates_per_s(workers: int, updates: int) -> float:
    run = monsoon.train("quadratic", "async", workers, engine="ray", steps=updates, shards=1,
                        evals=0, progress=False)
    return run.summary["updates"] / run.summary["wall_time_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", "")}})
    sys.path.insert(0, here)
    rates = interleave({"monsoon ray engine": lambda: monsoon_updates_per_s(args.workers, args.updates),
                        "raw Ray actors": lambda: raw_ray_updates_per_s(args.workers, args.updates)},
                       args.repeats)
    ray.shutdown()
    m, r = median(rates["monsoon ray engine"]), median(rates["raw Ray actors"])
    report(f"ray engine vs raw Ray actors: async, 1M parameters, {args.workers} workers", [
        ("monsoon ray engine, updates/s", f"{m:.1f}"),
        ("raw Ray actors, updates/s", f"{r:.1f}"),
        ("overhead ratio raw/monsoon", f"{r / m:.2f}   (target <= 1.2)"),
    ], {**rates, "overhead": r / m})
    spread = [r / v for v in rates["monsoon ray engine"]]
    write_record("ray_overhead", vars(args), [
        row("raw Ray / ray engine", rates["monsoon ray engine"], rates["raw Ray actors"], r / m,
            "<= 1.2", r / m <= 1.2, unit="updates/s", ratio_runs=spread)],
        {"ratio": r / m, "ratio_runs": spread, "target": "<= 1.2", "met": r / m <= 1.2,
         "line": f"the ray engine's overhead over raw Ray actors: {r / m:.2f}x (target <= 1.2)"})


if __name__ == "__main__":
    main()

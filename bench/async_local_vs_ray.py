"""Downpour on one machine: the local engine's shared-memory parameter server
against a Ray actor parameter server, 1M parameters (``quadratic``), 2
workers. A push to the local server is a locked in-place update; to a Ray
actor it is a 4 MB message. Each side runs with its defaults (the local
engine shards its server, one shard per worker; the Ray peer is one actor, as
in Ray's example). Prints updates/s of each and the ratio
local / Ray (target >= 10). Start-up is excluded from both.

    python bench/async_local_vs_ray.py [--repeats 3]
"""
import argparse
import os

import ray

import monsoon
from common import interleave, median, report
from ray_peer import raw_ray_updates_per_s
from records import row, write_record


def local_updates_per_s(workers: int, updates: int) -> float:
    # the local engine as a user gets it: one shard (lock) per worker
    run = monsoon.train("quadratic", "async", workers, steps=updates, evals=0, progress=False)
    return run.summary["updates"] / run.summary["wall_time_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--local-updates", type=int, default=3000)
    ap.add_argument("--ray-updates", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))

    def ray_rate():
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": here}})
        try:
            return raw_ray_updates_per_s(args.workers, args.ray_updates)
        finally:
            ray.shutdown()

    rates = interleave({"local engine": lambda: local_updates_per_s(args.workers, args.local_updates),
                        "Ray actor server": ray_rate}, args.repeats)
    lo, ra = median(rates["local engine"]), median(rates["Ray actor server"])
    report(f"async on one machine: local shared memory vs a Ray actor, 1M parameters, "
           f"{args.workers} workers", [
               ("local engine, updates/s", f"{lo:.0f}"),
               ("Ray actor parameter server, updates/s", f"{ra:.0f}"),
               ("ratio local/Ray", f"{lo / ra:.1f}   (target >= 10)"),
           ], {**rates, "ratio": lo / ra})
    spread = [v / ra for v in rates["local engine"]]
    write_record("async_local_vs_ray", vars(args), [
        row("local engine / Ray actor server", rates["local engine"], rates["Ray actor server"],
            lo / ra, ">= 10", lo / ra >= 10, unit="updates/s", ratio_runs=spread)],
        {"ratio": lo / ra, "ratio_runs": spread, "target": ">= 10", "met": lo / ra >= 10,
         "line": f"async on the local engine runs {lo / ra:.1f}x the updates/s of a Ray actor "
                 f"parameter server (target >= 10)"})


if __name__ == "__main__":
    main()

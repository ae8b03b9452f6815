"""The quick start's own report, as a user gets it: the README's command

    monsoon compare --problem exp --strategies serial,sync,async,hogwild --workers 2 --out DIR

run ``--repeats`` times. Each run's report compares the strategies against
serial, which runs first in the same process tree: its "speedup vs serial"
column (examples/s over serial's, start-up excluded, loss curve on) is what
this prints, per run, with the median and range over runs.

Between runs, the machine's floor for sync (``bare_sync.py``): two bare
processes computing half a batch each and meeting at a lock-free barrier,
against one process computing the whole batch, as a speed ratio. On seed
001's 1-16-1 net a gradient of 8 examples costs what one of 16 does, so no
data-parallel step can beat that floor here.

Target (issue 12): the report shows sync at >= 0.9x serial's speed.

    python bench/quick_start.py [--repeats 5]
"""
import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

from bare_sync import bare_alone_us, bare_pair_us
from common import median, median_and_range, report
from monsoon.problems import make_problem

STRATEGIES = ("serial", "sync", "async", "hogwild")
BATCH, FLOOR_STEPS = 16, 3000  # exp's default batch; as many steps as seed_overhead.py


def exp_problem():
    return make_problem("exp")


def quick_start_speedups() -> dict[str, float]:
    """One run of the README's compare command: each strategy's speed over serial's."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "monsoon", "compare", "--problem", "exp",
                        "--strategies", ",".join(STRATEGIES), "--workers", "2", "--out", out],
                       check=True, stdout=subprocess.DEVNULL, timeout=600)
        with open(Path(out) / "comparison.csv", newline="") as f:
            rows = {r["strategy"]: r for r in csv.DictReader(f)}
    return {s: float(rows[s]["speedup_vs_serial"]) for s in STRATEGIES if s != "serial"}


def floor_speed() -> float:
    """Speed of two bare processes over one (< 1: the pair is slower)."""
    return bare_alone_us(exp_problem, BATCH, FLOOR_STEPS) / bare_pair_us(exp_problem, BATCH,
                                                                         FLOOR_STEPS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    speed = {s: [] for s in STRATEGIES[1:]}
    floor = []
    for rep in range(args.repeats):  # interleaved: a report, then the floor
        for s, v in quick_start_speedups().items():
            speed[s].append(v)
        floor.append(floor_speed())
        print(f"  rep {rep + 1}/{args.repeats}: " + ", ".join(
            f"{s} {v[-1]:.2f}" for s, v in speed.items()) + f", floor {floor[-1]:.2f}",
            file=sys.stderr, flush=True)
    rows = [(f"{s}, speed over serial's", median_and_range(v, ".2f")
             + ("   (target >= 0.9)" if s == "sync" else "")) for s, v in speed.items()]
    rows += [("sync, reports at >= 0.9x", f"{sum(v >= 0.9 for v in speed['sync'])}"
                                          f"/{args.repeats}"),
             ("floor: bare pair's speed over one process", median_and_range(floor, ".2f"))]
    report("the quick start's report (monsoon compare on exp, 2 workers)", rows,
           {**speed, "floor": floor, "sync_median": median(speed["sync"])})


if __name__ == "__main__":
    main()

"""The quick start's own report, as a user gets it: the README's command

    monsoon compare --problem exp --strategies serial,sync,async,hogwild --workers 2 \
        --repeats 3 --out DIR

run ``--repeats`` times. Each report runs every strategy 3 times in rotation
and gives each one's speed over serial's (examples/s, start-up excluded,
loss curve on) as the median of the 3 turns' ratios: its "speedup vs
serial" column is what this prints, per report, with the median and range
over reports. ``--turns 1`` runs the command without ``--repeats``.

Between runs, the machine's floor for sync (``bare_sync.py``): two bare
processes computing half a batch each and meeting at a lock-free barrier,
against one process computing the whole batch, as a speed ratio. On seed
001's 1-16-1 net a gradient of 8 examples costs what one of 16 does, so no
data-parallel step can beat that floor here.

Target (issue 12): the report shows sync at >= 0.9x serial's speed.

    python bench/quick_start.py [--repeats 5] [--turns 3]
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
from records import row, write_record

STRATEGIES = ("serial", "sync", "async", "hogwild")
BATCH, FLOOR_STEPS = 16, 3000  # exp's default batch; as many steps as seed_overhead.py


def exp_problem():
    return make_problem("exp")


def quick_start_speedups(turns: int) -> dict[str, float]:
    """One run of the README's compare command: each strategy's speed over serial's."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "monsoon", "compare", "--problem", "exp",
                        "--strategies", ",".join(STRATEGIES), "--workers", "2",
                        "--repeats", str(turns), "--out", out],
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
    ap.add_argument("--repeats", type=int, default=5, help="reports")
    ap.add_argument("--turns", type=int, default=3, help="the command's own --repeats")
    args = ap.parse_args()
    speed = {s: [] for s in STRATEGIES[1:]}
    floor = []
    for rep in range(args.repeats):  # interleaved: a report, then the floor
        for s, v in quick_start_speedups(args.turns).items():
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
    report(f"the quick start's report (monsoon compare on exp, 2 workers, --repeats "
           f"{args.turns})", rows,
           {**speed, "floor": floor, "sync_median": median(speed["sync"])})
    ratio = median(speed["sync"])
    write_record("quick_start", vars(args), [
        row(f"{s} speed over serial's", ratio=median(v), ratio_runs=v,
            target=">= 0.9" if s == "sync" else None,
            met=median(v) >= 0.9 if s == "sync" else None) for s, v in speed.items()]
        + [row("floor: bare pair's speed over one process", ratio=median(floor),
               ratio_runs=floor)],
        {"ratio": ratio, "ratio_runs": speed["sync"], "target": ">= 0.9", "met": ratio >= 0.9,
         "line": f"the quick start's report gives sync {ratio:.2f}x serial's speed (median of "
                 f"{args.repeats} reports; {sum(v >= 0.9 for v in speed['sync'])} of them "
                 f">= 0.9; floor {median(floor):.2f}x)"})


if __name__ == "__main__":
    main()

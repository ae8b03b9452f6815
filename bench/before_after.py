"""The same benchmarks on two revisions of the package, interleaved.

A refactor must not cost speed. This runs each named benchmark script (from
this checkout) against the package of revision A, then of revision B, in
turn, ``--rounds`` times, on the same machine in the same minutes, and
compares the ratio each run's record reports (monsoon against its peer, so
machine drift cancels within a run). A and B are checked out as temporary
git worktrees; the script imports ``monsoon`` from whichever is first on
PYTHONPATH, and so do the worker processes it starts.

    python bench/before_after.py --before 2993888 --after HEAD \\
        --bench "sync_sweep --quick" --bench "spark_overhead --repeats 1"

Printed and recorded per benchmark row: the median ratio on A and on B, and
B / A. A row's own target says which way is better (``<= 1.2``: lower, a
time ratio; ``>= 2``: higher); its gain is B / A where higher is better and
A / B where lower is, and it is met at a gain of 1 or more, or where the
ranges of the two overlap (within the run-to-run spread). Rows without a
target of their own (a peer's ratio, the machine's floor) are shown as
context and not judged.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from records import write_record  # noqa: E402


def judge(name: str, before: list[float], after: list[float], target) -> dict:
    """One row of the record: the benchmark's ratio on each side, and its
    gain (> 1: the after side does better, the way ``target`` says is
    better). Met at a gain of 1 or more, or where the two ranges overlap;
    None (context, not judged) where the row has no target of its own."""
    change = statistics.median(after) / statistics.median(before)
    lower = str(target or "").lstrip().startswith("<")  # a time or loss ratio
    gain = 1 / change if lower else change
    overlap = min(after) <= max(before) and min(before) <= max(after)
    judged = target is not None
    return {"name": name,
            "before": {"median": statistics.median(before), "runs": before},
            "after": {"median": statistics.median(after), "runs": after},
            "ratio": change, "unit": "after / before (of the benchmark's ratio)",
            "better": "lower" if lower else "higher", "gain": gain,
            "target": "gain >= 1.0, or ranges overlapping" if judged
            else "not judged (the row has no target of its own)",
            "met": (gain >= 1 or overlap) if judged else None}


def worktree(rev: str, where: Path) -> Path:
    path = where / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), rev],
                   check=True, capture_output=True, timeout=120)
    return path


def run_once(bench: str, tree: Path, results: Path, timeout: float) -> dict:
    name, *args = shlex.split(bench)
    env = {**__import__("os").environ, "PYTHONPATH": str(tree),
           "MONSOON_BENCH_RESULTS": str(results)}
    before = set(results.rglob("*.json"))
    subprocess.run([sys.executable, str(HERE / f"{name}.py"), *args], env=env, check=True,
                   timeout=timeout, cwd=str(tree))  # python -m puts the cwd first on sys.path
    new = sorted(set(results.rglob("*.json")) - before)
    if not new:
        raise RuntimeError(f"{name} wrote no record")
    return json.loads(new[-1].read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--bench", action="append", required=True,
                    help="a bench script's name and its arguments, e.g. 'sync_sweep --quick'")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="monsoon-ab-"))
    trees = {"before": worktree(args.before, scratch), "after": worktree(args.after, scratch)}
    ratios: dict[tuple[str, str], dict[str, list[float]]] = {}
    try:
        for rnd in range(args.rounds):
            for bench in args.bench:
                for side in (("before", "after") if rnd % 2 == 0 else ("after", "before")):
                    record = run_once(bench, trees[side], scratch / side, args.timeout)
                    for row in record["rows"]:
                        if row.get("ratio") is None:
                            continue
                        key = (bench, row["name"])
                        ratios.setdefault(key, {"before": [], "after": [],
                                                "target": row.get("target")})[side].append(
                            float(row["ratio"]))
                    print(f"round {rnd + 1} {side}: {bench}: {record['summary']['line']}",
                          flush=True)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           capture_output=True, timeout=120)
    rows = []
    for (bench, name), sides in ratios.items():
        if not sides["before"] or not sides["after"]:
            continue
        row = judge(f"{bench.split()[0]}: {name}", sides["before"], sides["after"],
                    sides["target"])
        rows.append(row)
        verdict = ("  (context)" if row["met"] is None else
                   "" if row["met"] else "  (worse, outside the spread)")
        print(f"{bench.split()[0]:>22} {name:<32} before {row['before']['median']:.3f} "
              f"after {row['after']['median']:.3f}  after/before {row['ratio']:.3f} "
              f"({row['better']} is better){verdict}")
    judged_rows = [r for r in rows if r["met"] is not None]
    worst = min((r["gain"] for r in judged_rows), default=float("nan"))
    write_record("before_after", vars(args), rows, {
        "ratio": worst, "target": "gain >= 1.0, or within the run-to-run spread",
        "met": all(r["met"] for r in judged_rows),
        "line": f"{args.after} against {args.before}: worst gain {worst:.3f} "
                f"({sum(r['met'] for r in judged_rows)}/{len(judged_rows)} judged rows within "
                f"the spread or better)"})


if __name__ == "__main__":
    main()

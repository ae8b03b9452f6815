"""Memory of a run whose data is in memory: is it shared with the workers?

Runs ``sync`` with 2 worker processes on a linear model over an in-memory
dataset (float32, 64 features) of 1 GiB, then the same run over 1 MiB, each
in a fresh interpreter, and samples, every 20 ms, the memory of the run's
process and all its children: their PSS (proportional set size: a page
shared by k processes counts 1/k to each) outside shared memory, plus each
``/dev/shm`` file they map, counted once at its resident size. Pickling
the data to each worker would add one copy per worker (3 GiB in all);
sharing it keeps one. Target: the 1 GiB run uses less than 1.2 GiB more
than the 1 MiB run (one copy of the data plus 20%).

Two figures per run: ``peak`` over the whole run, and ``training``: the peak
while the worker processes are alive (moving the data into shared memory
holds two copies for a moment before the workers start).

Each run is repeated ``--repeats`` times, alternately; the median and the
range of the differences are printed.

    python bench/dataset_memory.py [--gib 1.0] [--repeats 3]
"""
import argparse
import os
import subprocess
import sys
import time

from common import median
from records import row, write_record

MIB = 1 << 20


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _tree(pid: int) -> dict[int, int]:
    """Every process under ``pid`` (itself included), with its depth below it."""
    depth, todo = {}, [(pid, 0)]
    while todo:
        p, d = todo.pop()
        depth[p] = d
        todo += [(c, d + 1) for c in _children(p)]
    return depth


def _rollup(pid: int, field: str) -> int:
    """``field`` of ``/proc/<pid>/smaps_rollup``, in bytes (0: the process is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _shm_rss(pid: int) -> dict[str, int]:
    """The resident bytes of each ``/dev/shm`` file ``pid`` maps, by path."""
    out, path = {}, None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and len(head) >= 6 and head[5].startswith("/dev/shm/"):
                    path = head[5]
                elif "-" in head[0]:
                    path = None
                elif path is not None and head[0] == "Rss:":
                    out[path] = out.get(path, 0) + int(head[1]) * 1024
    except OSError:
        pass
    return out


def _memory(pids) -> int:
    """The processes' memory with each shared-memory file counted once: their
    PSS less its shared-memory part, plus each ``/dev/shm`` file's resident
    size (the most any of them has mapped). Summing PSS alone over-counts
    while the workers touch pages of the data for the first time (a page's
    1/k share changes between two processes' reads)."""
    segments: dict[str, int] = {}
    total = 0
    for p in pids:
        total += _rollup(p, "Pss") - _rollup(p, "Pss_Shmem")
        for path, rss in _shm_rss(p).items():
            segments[path] = max(segments.get(path, 0), rss)
    return total + sum(segments.values())


def child(nbytes: int) -> None:
    import numpy as np
    import torch

    import monsoon
    from monsoon.problems import TorchProblem

    rows = max(nbytes // (64 * 4), 1024)

    def problem():  # the caller keeps no reference to the arrays
        X = np.random.default_rng(0).standard_normal((rows, 64), dtype=np.float32)
        y = X[:, :1] * 0.5
        return TorchProblem(torch.nn.Linear(64, 1), torch.nn.MSELoss(), X, y)

    monsoon.train(problem(), "sync", 2, lr=0.05, steps=300, batch_size=256, seed=0, evals=0,
                  backend="processes", progress=False)


def measure(nbytes: int) -> dict:
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(nbytes)])
    peak = training = 0
    while proc.poll() is None:
        depth = _tree(proc.pid)
        total = _memory(depth)
        peak = max(peak, total)
        # the workers are the fork server's children; the run's own children
        # (the fork server, the resource tracker) start before the data moves
        if sum(d >= 2 for d in depth.values()) >= 2:
            training = max(training, total)
        time.sleep(0.02)
    if proc.returncode:
        raise SystemExit(f"the run over {nbytes} bytes failed (exit code {proc.returncode})")
    return {"peak": peak, "training": training}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", type=int, default=None)
    args = ap.parse_args()
    if args.child is not None:
        return child(args.child)
    diffs = {"training": [], "peak": []}
    for _ in range(args.repeats):
        big, small = measure(int(args.gib * 1024 * MIB)), measure(MIB)
        for name, values in diffs.items():
            values.append((big[name] - small[name]) / (1024 * MIB))
            print(f"{name:>8}: {args.gib:g} GiB data {big[name] / MIB:8.0f} MiB, 1 MiB data "
                  f"{small[name] / MIB:8.0f} MiB, difference {values[-1]:.2f} GiB", flush=True)
    for name, values in diffs.items():
        print(f"{name:>8}: median difference {median(values):.2f} GiB (runs "
              f"{min(values):.2f}-{max(values):.2f}; target < {1.2 * args.gib:.2f} GiB)")
    per_gib = {k: [v / args.gib for v in values] for k, values in diffs.items()}
    ratio = median(per_gib["training"])
    write_record("dataset_memory", vars(args), [
        row("while the workers train", ratio=ratio, ratio_runs=per_gib["training"],
            target="< 1.2", met=ratio < 1.2, unit="GiB per GiB of data"),
        row("peak over the whole run", ratio=median(per_gib["peak"]),
            ratio_runs=per_gib["peak"], unit="GiB per GiB of data")],
        {"ratio": ratio, "ratio_runs": per_gib["training"], "target": "< 1.2",
         "met": ratio < 1.2,
         "line": f"a sync x2 run over {args.gib:g} GiB of data holds {ratio:.2f} GiB more per GiB "
                 f"than over 1 MiB while it trains (target < 1.2: one shared copy; peak "
                 f"{median(per_gib['peak']):.2f})"})


if __name__ == "__main__":
    main()

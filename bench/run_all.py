"""Run every benchmark, one at a time on a quiet machine, then render the results.

    python bench/run_all.py [--quick] [--only NAME ...] [--allow-load]
                            [--max-minutes 60] [--dry-run] [--hold S] [--wait-minutes M]

The benchmarks are those of ``bench/render.py``'s BENCHMARKS, in its order.
Each runs as its own process (``python bench/<name>.py ARGS``) with the
arguments of PLAN below: the full set sized so that the whole run, with its
waits, takes under an hour on a 2-core machine; ``--quick`` a smaller one
(fewer repeats and steps, a quarter of an hour), for a look at the direction,
not for figures to publish. Neither tunes anything: every benchmark measures
monsoon at its defaults, as a user gets it. Then ``bench/render.py`` renders
README.md and docs/benchmarks.md from the newest records.

Before each benchmark it takes the benchmarks' lock (LOCK, as ``flock`` does
on a shared machine) and waits for a quiet machine: the 1-minute load average
below QUIET for ``--hold`` seconds in a row (30; 10 with ``--quick``), at most
``--wait-minutes`` (10). A wait that times out skips the benchmark, and a load
above REFUSE when it would start refuses it (one line each); ``--allow-load``
runs it anyway. The load at its launch is handed to the record
(``MONSOON_BENCH_LOAD_BEFORE``, read by bench/records.py).

A benchmark that exits non-zero, writes no record, or runs past its time limit
(TIMEOUT_FACTOR x its estimate; then its process group, and only that, is
killed) is reported in one line, and the others go on; the exit status is 1 if
any failed. A benchmark that needs hardware this machine lacks (the GPU's) is
skipped with a line that says so, as is one that would end past
``--max-minutes``. ``--dry-run`` prints the plan, its commands and the
estimated total, and runs nothing.
"""
from __future__ import annotations

import argparse
import fcntl
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from records import RESULTS  # noqa: E402
from render import BENCHMARKS, NEEDS  # noqa: E402

QUIET, REFUSE = 1.5, 2.0  # 1-minute load averages: wait below QUIET, refuse above REFUSE
WAIT_S = 600.0            # the longest wait for a quiet machine before one benchmark
# what benchmarks on a shared machine run under (docs/benchmarks.md): held from
# the wait before each benchmark to its end
LOCK = Path("/tmp/monsoon-bench.lock")
TIMEOUT_FACTOR = 3.0      # a benchmark's time limit, over its estimate
MIN_TIMEOUT_MIN = 3.0
# The wait before a benchmark, nothing else running, is the decay of the
# previous one's load to below QUIET, then the hold. A benchmark that keeps
# BUSY tasks runnable for T minutes, started at LOAD0, leaves the 1-minute
# average at BUSY - (BUSY - LOAD0) e^-T, which decays as e^(-t / 60 s).
BUSY, LOAD0 = 2.2, 1.45

# name -> (full arguments, their estimated minutes, --quick arguments, their minutes).
# The estimates of the first five are their records' ``elapsed_s`` (scaled to
# the repeats given here); the rest come from each script's sizes (repeats x
# runs x steps) and the figures in its records, and ran about 2x short where
# checked, so run_all prints each benchmark's minutes beside its estimate:
# correct them from the records' ``elapsed_s`` (the ones measured on
# 2026-11-27 are). Repeats are 2 where the hour allows, 1 where it does not
# (the two slowest torch and Spark peers, checkpoint_cost, serial_vs_torch on 4
# of its 6 shapes); before_after runs
# the larger sync_sweep shape its record judges.
PLAN: dict[str, tuple[list[str], float, list[str], float]] = {
    "quick_start": (["--repeats", "2"], 1.7, ["--repeats", "1", "--turns", "1"], 0.5),
    "seed_overhead": (["--repeats", "2", "--steps", "2000"], 1.3,
                      ["--repeats", "1", "--steps", "1000"], 0.3),
    "sync_vs_ddp": (["--repeats", "2"], 0.7, ["--repeats", "1"], 0.4),
    "sync_sweep": (["--repeats", "2"], 7.4,
                   ["--quick", "--shapes", "mlp64-b32,cnn-b128"], 0.4),
    "serial_vs_torch": (["--repeats", "1", "--shapes",
                         "mlp64-b32,mlp256-b128,mlp1024-b512,cnn-b128"], 0.6,
                        ["--quick", "--shapes", "mlp64-b32,cnn-b128"], 0.2),
    "torch_engine_vs_ddp": (["--repeats", "1", "--scale", "0.25"], 1.8,
                            ["--repeats", "1", "--scale", "0.25", "--shapes",
                             "mlp64-b32,cnn-b128"], 0.5),
    # a quarter of each shape's epochs (0.5 s runs, noisy): the hour has no room for
    # its default 2 s runs, which its own command records
    "hogwild_vs_torch": (["--repeats", "1", "--scale", "0.25"], 0.4,
                         ["--repeats", "1", "--scale", "0.25", "--shapes", "mlp256"], 0.3),
    "hogwild_vs_sklearn": (["--repeats", "2"], 0.3, ["--repeats", "1", "--rows", "50000"], 0.3),
    "hogwild_sweep": (["--repeats", "2", "--min-seconds", "1.5"], 1.9,
                      ["--quick", "--only", "f100k"], 0.6),
    "spark_vs_mllib": (["--repeats", "1", "--strategies", "sync,async"], 4.5,
                       ["--quick", "--strategies", "sync,async"], 1.0),
    "spark_vs_torchdistributor": (["--repeats", "1"], 1.4, ["--repeats", "1", "--rows", "16384"],
                                  0.5),
    "hogwild_average": (["--fits", "6"], 0.5, ["--quick"], 0.4),
    "async_local_vs_ray": (["--repeats", "3"], 1.2, ["--repeats", "1"], 0.5),
    "ray_overhead": (["--repeats", "2"], 0.8, ["--repeats", "1"], 0.6),
    "spark_overhead": (["--repeats", "2", "--steps", "4"], 1.1,
                       ["--repeats", "1", "--rows", "200000", "--features", "20000"], 0.6),
    "checkpoint_cost": (["--repeats", "1"], 1.1, ["--repeats", "1", "--steps", "1000"], 0.3),
    "live_overhead": (["--repeats", "2", "--shapes", "quick-start,mlp64-b32,cnn-b128"], 1.5,
                      ["--repeats", "1", "--shapes", "quick-start,cnn-b128"], 0.3),
    "dataset_memory": (["--repeats", "2"], 1.0, ["--repeats", "1", "--gib", "0.25"], 0.3),
    "pipeline": ([], 0.6, ["--steps", "6"], 0.4),
    "sim_scale": (["--repeats", "1"], 0.8, ["--repeats", "1", "--updates", "20000"], 0.2),
    "delay_tolerance": (["--seeds", "3"], 0.7, ["--seeds", "1"], 0.3),
    "sim_effects": (["--steps-a", "30000"], 1.6, ["--steps-a", "10000"], 0.5),
    "hogwild_vs_vw": (["--repeats", "1"], 1.4, ["--quick"], 0.5),
    "compression": (["--steps", "40"], 2.1, ["--steps", "30", "--compress", "topk:0.01"], 0.4),
    "compression_vs_ddp_powersgd": (["--repeats", "2", "--steps", "300"], 1.4,
                                    ["--repeats", "1", "--steps", "100"], 0.5),
    "ssp_sweep": (["--bounds", "0,1,4,16", "--workers", "32,128"], 0.6,
                  ["--problems", "digits", "--bounds", "0,4", "--workers", "32"], 0.6),
    # this round's device-array change (#45) against the main before it
    # (940f801), on the CPU benchmarks it must not slow: the sync sweep and the
    # quick start
    "before_after": (["--before", "940f801", "--rounds", "1",
                      "--bench", "sync_sweep --quick --shapes mlp1024-b512",
                      "--bench", "quick_start --repeats 1 --turns 1"], 1.4,
                     ["--before", "940f801", "--rounds", "1",
                      "--bench", "sync_sweep --quick --shapes cnn-b128"], 0.5),
    "gpu": ([], 5.0, ["--quick"], 2.5),
}


def command(name: str, quick: bool) -> list[str]:
    full, _, short, _ = PLAN[name]
    return [sys.executable, str(HERE / f"{name}.py"), *(short if quick else full)]


def estimate(name: str, quick: bool) -> float:
    return PLAN[name][3 if quick else 1]


def wait_estimate(hold: float, previous: float) -> float:
    """Minutes of waiting for a quiet machine after a benchmark of ``previous``
    minutes (0: none), nothing else running."""
    left = BUSY - (BUSY - LOAD0) * math.exp(-previous) if previous else 0.0
    return (60 * math.log(left / QUIET) if left > QUIET else 0.0) / 60 + hold / 60


def cuda_here(probe_torch: bool) -> bool:
    """Whether a CUDA device is here: the driver's files (cheap), then, with
    ``probe_torch``, torch's own answer in a child process (torch is heavy)."""
    if not (Path("/proc/driver/nvidia").exists() or Path("/dev/nvidia0").exists()):
        return False
    if not probe_torch:
        return True
    try:
        return subprocess.run([sys.executable, "-c", "import sys, torch; "
                               "sys.exit(0 if torch.cuda.is_available() else 1)"],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def wait_for_quiet(hold: float, timeout: float = WAIT_S, below: float = QUIET,
                   load=lambda: os.getloadavg()[0], clock=time.monotonic,
                   sleep=time.sleep, poll: float = 2.0) -> tuple[bool, float]:
    """Wait until the load stays below ``below`` for ``hold`` seconds in a row;
    ``(True, load)`` then, ``(False, load)`` after ``timeout`` seconds."""
    start = clock()
    quiet_since = None
    while True:
        now, value = clock(), load()
        if value < below:
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= hold:
                return True, value
        else:
            quiet_since = None
        if now - start >= timeout:
            return False, value
        sleep(poll)


def _newest_record(name: str) -> str | None:
    folder = RESULTS / name
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return files[-1].name if files else None


def run_one(name: str, cmd: list[str], limit_s: float) -> str:
    """Run one benchmark in its own process group; '' if it wrote a record, else why not."""
    before = _newest_record(name)
    env = {**os.environ, "MONSOON_BENCH_LOAD_BEFORE": ",".join(
        f"{x:.2f}" for x in os.getloadavg())}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return f"timed out after {limit_s / 60:.1f} min (its limit); its process group was killed"
    except KeyboardInterrupt:
        _kill_group(proc)
        raise
    if code != 0:
        return f"failed (exit status {code})"
    if _newest_record(name) == before:
        return "exited 0 but wrote no record"
    return ""


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the benchmark's process group (the one it was started in), 15 s
    for the benchmark to end, then SIGKILL to what is left of the group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass


def plan(names: list[str], quick: bool, hold: float, cuda: bool) -> tuple[list, float, float]:
    """The benchmarks to run, each ``(name, command, estimate, skip reason)``, and
    the estimated minutes of them all and of the waits before them."""
    rows, running, waits, previous = [], 0.0, 0.0, 0.0
    for name in names:
        skip = f"needs {NEEDS[name]}; none here" if name in NEEDS and not cuda else ""
        est = estimate(name, quick)
        rows.append((name, command(name, quick), est, skip))
        if not skip:
            running += est
            waits += wait_estimate(hold, previous)
            previous = est
    return rows, running, waits


def _shown(cmd: list[str]) -> str:
    return shlex.join(["python", str(Path(cmd[1]).relative_to(ROOT)), *cmd[2:]])


def main(argv=None) -> int:
    names = [name for name, *_ in BENCHMARKS]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the smaller argument sets")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="these benchmarks only")
    ap.add_argument("--allow-load", action="store_true",
                    help="run on a loaded machine (after the wait) rather than skip")
    ap.add_argument("--max-minutes", type=float, default=60.0,
                    help="skip a benchmark that would end past this (default 60)")
    ap.add_argument("--hold", type=float, default=None,
                    help="seconds the load must stay below 1.5 (default 30; 10 with --quick)")
    ap.add_argument("--wait-minutes", type=float, default=WAIT_S / 60,
                    help="the longest wait for a quiet machine before each (default 10)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; run nothing")
    args = ap.parse_args(argv)
    unknown = [n for n in args.only or [] if n not in names]
    if unknown:
        ap.error(f"no benchmark named {', '.join(unknown)}; choose from: {', '.join(names)}")
    hold = args.hold if args.hold is not None else (10.0 if args.quick else 30.0)
    chosen = [n for n in names if not args.only or n in args.only]
    rows, running, waits = plan(chosen, args.quick, hold, cuda_here(probe_torch=not args.dry_run))
    if args.dry_run:
        for name, cmd, est, skip in rows:
            limit = max(MIN_TIMEOUT_MIN, TIMEOUT_FACTOR * est)
            print(f"{name:<28} {est:4.1f} min (limit {limit:.1f})  "
                  + (f"skipped: {skip}" if skip else _shown(cmd)))
        print(f"estimated total: {running + waits:.1f} min ({running:.1f} running, "
              f"{waits:.1f} waiting for a quiet machine; budget --max-minutes "
              f"{args.max_minutes:.0f})")
        return 0
    return run(rows, args, hold)


def take_lock(timeout_s: float, path: Path = LOCK):
    """The benchmark lock (an open file holding ``flock``), or None if another
    process keeps it ``timeout_s`` seconds."""
    f = open(path, "a")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() >= deadline:
                f.close()
                return None
            time.sleep(2)


def _not_quiet(args, hold: float) -> str:
    """'' once the machine is quiet enough to record on, else why not."""
    quiet, load = wait_for_quiet(hold, 60 * args.wait_minutes)
    if args.allow_load:
        return ""
    if not quiet:
        return (f"the load stayed at {load:.1f} (not below {QUIET} for {hold:g} s within "
                f"{args.wait_minutes:g} min); --allow-load runs it anyway")
    if os.getloadavg()[0] > REFUSE:
        return (f"refused to record at load {os.getloadavg()[0]:.1f} (> {REFUSE}); "
                f"--allow-load runs it anyway")
    return ""


def run(rows: list, args, hold: float) -> int:
    start, outcomes, failed = time.monotonic(), [], False
    for name, cmd, est, skip in rows:
        elapsed, lock = (time.monotonic() - start) / 60, None
        if not skip and elapsed + est > args.max_minutes:
            skip = f"would end past --max-minutes {args.max_minutes:g} ({elapsed:.0f} min gone)"
        if not skip:
            lock = take_lock(60 * args.wait_minutes)
            skip = "" if lock else f"another process held {LOCK} for {args.wait_minutes:g} min"
        skip = skip or _not_quiet(args, hold)
        if skip:
            if lock:
                lock.close()
            print(f"run_all: {name}: skipped: {skip}", flush=True)
            outcomes.append((name, f"skipped: {skip}", est, None))
            continue
        print(f"run_all: {name}: {_shown(cmd)} (load {os.getloadavg()[0]:.1f}, "
              f"estimate {est:.1f} min)", flush=True)
        t0 = time.monotonic()
        try:
            why = run_one(name, cmd, 60 * max(MIN_TIMEOUT_MIN, TIMEOUT_FACTOR * est))
        finally:
            lock.close()
        took = (time.monotonic() - t0) / 60
        failed |= bool(why)
        print(f"run_all: {name}: {why or 'recorded'} ({took:.1f} min, estimate {est:.1f})",
              flush=True)
        outcomes.append((name, "FAILED: " + why if why else "recorded", est, took))
    render = subprocess.run([sys.executable, str(HERE / "render.py")], cwd=ROOT, timeout=300)
    failed |= render.returncode != 0
    print(f"\nrun_all: {(time.monotonic() - start) / 60:.0f} min in all")
    for name, status, est, took in outcomes:
        print(f"  {name:<28} {status}" + (f" ({took:.1f} min, estimate {est:.1f})"
                                           if took is not None else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark records: every benchmark writes what it measured as one JSON file.

A record is ``bench/results/<benchmark>/<UTC time>-<commit>.json``::

    {"benchmark": "sync_sweep",            # the script's name, without .py
     "command": "python bench/sync_sweep.py --repeats 3",
     "params": {...},                       # the benchmark's arguments
     "commit": "abc1234", "dirty": false,   # what was measured
     "date": "2026-11-25T13:40:00Z",
     "machine": {"cores": 2, "cpu": "AMD EPYC ...", "gpu": null,
                 "load_before": [..], "load_after": [..], "loadavg": [..],
                 "python": "3.11.7", "platform": "..."},
     "peers": {"torch": "2.13.0", "scikit-learn": "1.6.1", ...},  # installed versions
     "elapsed_s": 312.4,                    # from this module's import to the record
     "rows": [                              # one per shape / data set / setting
        {"name": "mlp64-b32",
         "ours": {"median": 1.2e5, "runs": [...]},     # each figure with its spread
         "peer": {"median": 9.9e4, "runs": [...]},
         "ratio": 1.21, "ratio_runs": [...], "unit": "examples/s",
         "target": ">= 1.1", "met": true, ...}],
     "summary": {"ratio": 1.07, "target": ">= 1.1 on every shape", "met": false,
                 "line": "sync x2 vs DDP: worst shape 1.07x (target >= 1.1)"}}

``load_before`` is the load average when the benchmark started: run_all.py
passes it in ``MONSOON_BENCH_LOAD_BEFORE`` (taken just before it launched the
script), else it is taken when this module is imported (the script's start).
``load_after`` (and ``loadavg``, its older name) is taken when the record is
written. Older records lack the newer keys; readers treat them as optional.

``bench/render.py`` turns the newest record of each benchmark into
docs/benchmarks.md and the README's summary lines. History lives in the
records and in git, never in prose.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata as _metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

# MONSOON_BENCH_RESULTS redirects the records (the tests write theirs elsewhere).
RESULTS = Path(os.environ.get("MONSOON_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")

# The load when the benchmark started. The variable is removed here, so that a
# benchmark that starts other benchmarks (before_after.py) does not hand run_all's
# figure on to them: each of those takes its own at import.
_STARTED = time.monotonic()  # for the record's elapsed_s: the script's run, near enough
_given = os.environ.pop("MONSOON_BENCH_LOAD_BEFORE", None)
try:
    LOAD_BEFORE = [float(x) for x in _given.split(",")] if _given else list(os.getloadavg())
except ValueError:
    LOAD_BEFORE = list(os.getloadavg())

# peers whose versions a record names (distribution names; read from the installed
# metadata, so none of them is imported for it)
PEERS = ("torch", "numpy", "scikit-learn", "pyspark", "ray", "vowpalwabbit")


def _git(*args) -> str:
    try:
        return subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_model() -> str:
    """The CPU's ``model name`` from /proc/cpuinfo (else what platform says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu() -> str | None:
    """The CUDA device's name if the benchmark imported torch and has one; else None
    (torch is never imported here for it)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # a broken CUDA set-up is "no GPU" for the record
        return None
    return None


def peers() -> dict:
    """The installed version of each peer library that is installed."""
    found = {}
    for name in PEERS:
        try:
            found[name] = _metadata.version(name)
        except _metadata.PackageNotFoundError:
            continue
    return found


# What makes a record "dirty": uncommitted changes to tracked files other than
# what benchmarks themselves write (records and figures, the rendered pages).
CODE_CHANGES = ("status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                ":(top,exclude)bench/results", ":(top,exclude)docs", ":(top,exclude)README.md")


def machine() -> dict:
    after = list(os.getloadavg())
    return {"cores": os.cpu_count(), "cpu": cpu_model(), "gpu": gpu(),
            "load_before": LOAD_BEFORE, "load_after": after, "loadavg": after,
            "python": platform.python_version(), "platform": platform.platform()}


def figure(runs) -> dict:
    """A figure with its spread: the median and every run."""
    runs = [float(v) for v in runs]
    return {"median": statistics.median(runs), "min": min(runs), "max": max(runs),
            "runs": runs}


def write_record(benchmark: str, params: dict, rows: list[dict], summary: dict,
                 command: str | None = None, directory: Path | None = None,
                 partial: str | None = None) -> Path:
    """Write one record and return its path. ``summary`` needs ``line`` (one
    sentence: the headline ratio and its target), ``ratio``, ``target`` and
    ``met``. ``partial``: why this run covers less than the benchmark does
    (a subset of its cases): kept, but never rendered in place of a whole one."""
    for key in ("line", "ratio", "target", "met"):
        if key not in summary:
            raise ValueError(f"a benchmark summary needs {key!r}")
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    record = {
        "benchmark": benchmark,
        "command": command or "python " + shlex.join([f"bench/{Path(sys.argv[0]).name}",
                                                     *sys.argv[1:]]),
        "params": params, "commit": commit, "dirty": bool(_git(*CODE_CHANGES)),
        "date": now.isoformat().replace("+00:00", "Z"), "machine": machine(), "peers": peers(),
        "elapsed_s": round(time.monotonic() - _STARTED, 1),
        "rows": rows, "summary": summary,
    }
    if partial:
        record["partial"] = partial
    folder = (directory or RESULTS) / benchmark
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{now.strftime('%Y%m%dT%H%M%SZ')}-{commit}.json"
    path.write_text(json.dumps(record, indent=1, default=float) + "\n")
    print(f"record: {path}", file=sys.stderr)
    return path


def newest(benchmark: str, directory: Path | None = None) -> dict | None:
    """The newest whole record of ``benchmark`` (a partial run's is passed over)."""
    folder = (directory or RESULTS) / benchmark
    for path in sorted(folder.glob("*.json"), reverse=True) if folder.is_dir() else []:
        record = json.loads(path.read_text())
        if not record.get("partial"):
            return record
    return None


def row(name: str, ours=None, peer=None, ratio=None, target: str | None = None,
        met: bool | None = None, unit: str | None = None, ratio_runs=None, **extra) -> dict:
    """One row of a record: ``ours`` and ``peer`` are lists of runs (or None),
    each kept as a figure with its spread."""
    out = {"name": name, "ours": figure(ours) if ours else None,
           "peer": figure(peer) if peer else None, "ratio": ratio, "unit": unit,
           "target": target, "met": met, **extra}
    if ratio_runs:
        out["ratio_runs"] = [float(v) for v in ratio_runs]
    return out

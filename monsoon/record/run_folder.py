"""The run folder: config.json, metrics.csv, summary.json, loss.png, and
staleness.png where updates were stale (async, Hogwild!).

Files are written to a temporary name and renamed, so a folder never holds a
half-written file.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import numpy as np

from .recorder import COLUMNS


def atomic_write(path: Path, data: str | bytes) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None if np.isnan(value) else str(value)
    return value


def to_json(obj) -> str:
    return json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n"


def metrics_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: repr(row[k]) if isinstance(row[k], float) else row[k] for k in COLUMNS})
    return buf.getvalue()


def read_metrics(path) -> list[dict]:
    with open(path) as f:
        return [{k: (float(v) if k in ("time_s", "epoch", "loss") else int(v))
                 for k, v in row.items()} for row in csv.DictReader(f)]


def write_run_folder(out: Path, config: dict, summary: dict, rows: list[dict]) -> Path:
    from .plots import plot_loss

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "config.json", to_json(config))
    atomic_write(out / "metrics.csv", metrics_csv(rows))
    atomic_write(out / "summary.json", to_json(summary))
    title = f"{summary.get('problem')}: {summary.get('strategy')} x{summary.get('workers')}"
    plot_loss(out / "loss.png", {summary.get("strategy", "run"): rows}, title=title)
    counts = summary.get("staleness_counts") or {}
    if any(int(tau) > 0 for tau in counts):
        from .plots import plot_staleness

        plot_staleness(out / "staleness.png", counts, title=title)
    return out

"""The run folder: config.json, metrics.csv, summary.json, loss.png, and
staleness.png where updates were stale (async, Hogwild!); the trained
model: ``model.pt`` for torch problems (a ``state_dict``, buffers included,
that ``torch.load(path, weights_only=True)`` reads without unpickling code),
``params.npy`` (the flat parameters) for the others.

Files are written to a temporary name and renamed, so a folder never holds a
half-written file.

A folder holds one run: a new run in a used folder removes the previous
run's results first (``clear_results``), so that a failed run's summary
never sits beside another run's model; a resumed run keeps its TensorBoard
files, which it carries on. The checkpoints are ``checkpoints.py``'s
(``remove_others``).
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np

from .atomic import atomic_write
from .recorder import COLUMNS, OPTIONAL_COLUMNS


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
    present = {k for row in rows for k in row}
    columns = COLUMNS + tuple(k for k in OPTIONAL_COLUMNS if k in present)
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: repr(row[k]) if isinstance(row.get(k), float) else row.get(k, "")
                         for k in columns})
    return buf.getvalue()


def read_metrics(path) -> list[dict]:
    with open(path) as f:
        return [{k: (int(v) if k in ("updates", "examples", "bytes_sent") else float(v))
                 for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def save_model(out: Path, problem, params) -> Path:
    """The trained model in ``out``: ``model.pt`` (a weights-only state_dict)
    for a problem with a torch model, else ``params.npy``."""
    out = Path(out)
    if problem.model_at is not None:
        import torch

        buf = io.BytesIO()
        torch.save(problem.model_at(params).state_dict(), buf)
        path = out / "model.pt"
        atomic_write(path, buf.getvalue())
        return path
    buf = io.BytesIO()
    np.save(buf, np.asarray(params))
    path = out / "params.npy"
    atomic_write(path, buf.getvalue())
    return path


# What a finished (or failed) run writes into its folder, besides checkpoints/.
RESULT_FILES = ("config.json", "metrics.csv", "summary.json", "loss.png", "staleness.png",
                "model.pt", "params.npy")


def clear_results(out: Path, resuming: bool) -> None:
    """Remove a previous run's results from ``out`` before a run starts
    there (``RESULT_FILES``; and its TensorBoard event files under tb/,
    unless this run resumes it and carries its live series on)."""
    out = Path(out)
    for name in RESULT_FILES:
        try:
            (out / name).unlink()
        except FileNotFoundError:
            pass
    if not resuming and (out / "tb").is_dir():
        for path in (out / "tb").glob("events.out.tfevents.*"):
            path.unlink(missing_ok=True)


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

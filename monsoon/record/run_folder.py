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
(``remove_others``). A run that starts sets those files aside
(``SetAside``) rather than deleting them: a run refused once started (bad
input found only then) gives them back, and the folder is as it was.
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
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


class SetAside:
    """A previous run's files moved out of the way of a starting run, into a
    hidden folder under ``out`` (the same file system: each move is a
    rename), until the run ends: ``restore`` puts them back where the run
    was refused, and removes the TensorBoard files it began; ``discard``
    deletes them once the run stands on its own (finished, failed or
    interrupted: its folder is its own then)."""

    def __init__(self, out: Path):
        self.out = Path(out)
        # a run killed before its end (SIGKILL) left its previous files aside
        for stale in self.out.glob(".previous-*") if self.out.is_dir() else ():
            shutil.rmtree(stale, ignore_errors=True)
        self.folder: Path | None = None
        self.moved: list[tuple[Path, Path]] = []  # (where it was, where it is)
        self.tb_before = self._tb_files()

    def _tb_files(self) -> set:
        tb = self.out / "tb"
        return set(tb.glob("events.out.tfevents.*")) if tb.is_dir() else set()

    def keep(self, path: Path) -> None:
        """Move ``path`` aside (a file under ``out``), if it exists."""
        path = Path(path)
        if not path.exists():
            return
        if self.folder is None:
            self.out.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix=".previous-", dir=self.out))
        there = self.folder / str(len(self.moved))
        os.replace(path, there)
        self.moved.append((path, there))
        self.tb_before.discard(path)

    def restore(self) -> None:
        for path in self._tb_files() - self.tb_before:  # the refused run's own
            path.unlink(missing_ok=True)
        for path, there in self.moved:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(there, path)
        self.moved = []
        self.discard()

    def discard(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def clear_results(out: Path, resuming: bool, aside: SetAside | None = None) -> None:
    """Remove a previous run's results from ``out`` before a run starts
    there (``RESULT_FILES``; and its TensorBoard event files under tb/,
    unless this run resumes it and carries its live series on), or move
    them ``aside``."""
    out = Path(out)
    remove = aside.keep if aside is not None else (lambda p: p.unlink(missing_ok=True))
    for name in RESULT_FILES:
        remove(out / name)
    if not resuming and (out / "tb").is_dir():
        for path in sorted((out / "tb").glob("events.out.tfevents.*")):
            remove(path)


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

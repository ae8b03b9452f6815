"""The run folder: config.json, metrics.csv, summary.json, loss.png, and
staleness.png where updates were stale (async, Hogwild!); the trained
model: ``model.pt`` for torch problems (a ``state_dict``, buffers included,
that ``torch.load(path, weights_only=True)`` reads without unpickling code),
``params.npy`` (the flat parameters) for the others, with a rating file's
``user_ids.txt`` and ``item_ids.txt`` (each factor row's id).

Files are written to a temporary name and renamed, so a folder never holds a
half-written file.

A folder holds one run: a new run in a used folder removes the previous
run's results first (``clear_results``), so that a failed run's summary
never sits beside another run's model; a resumed run keeps its TensorBoard
files, which it carries on. The checkpoints are ``checkpoints.py``'s
(``remove_others``). A run that starts sets those files aside
(``SetAside``) rather than deleting them until it ends: a run refused once
started (bad input found only then) gives them back, and the folder is as
it was. Only one run at a time does any of this: a run holds its folder
(``folder_lock.py``), so the files it sets aside, or finds set aside by a
killed run, are never another live run's. Nor the user's: before anything is
written, a run (or compare) is refused where it would write over a file in a
folder monsoon did not write (``monsoon_folder``), or over the problem's own
data file (``refuse_writing_over``).
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .atomic import atomic_write
from .events import OWN_PATTERN, is_own
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


NON_FINITE = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


def read_summary(folder) -> dict:
    """A run folder's summary.json as the run had it: ``_jsonable`` wrote a
    non-finite number as "inf" or "-inf" (a diverged run's loss) and NaN as
    null, which read back as the floats they were (a null final loss is
    NaN but in a failed run, which has none); OSError or ValueError where
    there is none to read."""
    summary = json.loads((Path(folder) / "summary.json").read_text())
    if not isinstance(summary, dict):
        raise ValueError("summary.json holds no summary")
    summary = _finite_back(summary)
    if summary.get("final_loss", 0) is None and summary.get("status") != "failed":
        summary["final_loss"] = float("nan")
    return summary


def _finite_back(value):
    if isinstance(value, dict):
        return {k: _finite_back(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_back(v) for v in value]
    return NON_FINITE.get(value, value) if isinstance(value, str) else value


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
    for a problem with a torch model, else ``params.npy``, and beside it the
    data's ids of the model's rows where the problem has them (``row_ids``:
    a rating file's user_ids.txt and item_ids.txt, one id a line)."""
    for name, ids in (problem.row_ids() if problem.row_ids is not None else {}).items():
        atomic_write(Path(out) / name, "".join(f"{i}\n" for i in ids).encode())
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
                "model.pt", "params.npy", "user_ids.txt", "item_ids.txt")
# What a compare writes in its own folder (``compare.py``), the table of the
# run folders it wrote included
COMPARE_RUNS = ".compare-runs.json"
COMPARE_FILES = ("comparison.csv", "comparison.png", "report.md", "staleness.png", COMPARE_RUNS)
RUN_KEYS = ("problem", "strategy", "workers")  # a run's config.json and summary.json hold them


def monsoon_folder(out: Path) -> bool:
    """Whether ``out`` is a folder monsoon wrote: a run's (its config.json
    or summary.json holds ``RUN_KEYS``, checkpoints/ a monsoon checkpoint,
    or a run there holds its lock, or left it when killed), or a compare's
    (its table of run folders, or a comparison.csv with the compare's
    columns: ``report.CSV_COLUMNS``)."""
    from .checkpoints import checkpoint_files, read_meta
    from .folder_lock import LOCK_NAME

    out = Path(out)
    for name in ("config.json", "summary.json"):
        try:
            doc = json.loads((out / name).read_text())
        except (OSError, ValueError):  # none, or not JSON (UnicodeDecodeError too)
            continue
        if isinstance(doc, dict) and all(key in doc for key in RUN_KEYS):
            return True
    if (out / LOCK_NAME).is_file() or (out / COMPARE_RUNS).is_file():
        return True
    if any(read_meta(p) is not None for p in checkpoint_files(out / "checkpoints")):
        return True
    try:
        with open(out / "comparison.csv") as f:
            return f.readline().startswith("strategy,workers,final_loss")
    except (OSError, ValueError):
        return False


def refuse_writing_over(out: Path, names, data_file: str | None, given: str,
                        who: str = "a run") -> None:
    """Refuse, in one line (``ConfigError``) and before anything is
    written, ``who`` in ``out`` (``given``: how the caller named it, --out
    or out=) that would write over or remove a file not monsoon's:
    ``data_file`` (the problem's own input, never) among ``names`` (in
    ``out``), or any of them where ``out`` is not a folder monsoon wrote
    (``monsoon_folder``). A new or empty folder, or one monsoon wrote,
    passes. TensorBoard's event files under tb/ are not asked about: each
    has a name of its own, and under torchrun the other ranks' may be there
    before rank 0 looks."""
    out = Path(out)
    if not out.is_dir():
        return
    found = [out / name for name in names if (out / name).is_file()]
    for path in found:
        if data_file is not None and os.path.samefile(path, data_file):
            raise ConfigError(f"{given}: {path.relative_to(out)} there is the problem's data "
                              f"file, which {who} there would write over; give another folder")
    if found and not monsoon_folder(out):
        shown = ", ".join(str(p.relative_to(out)) for p in found[:3])
        shown += f" and {len(found) - 3} more" if len(found) > 3 else ""
        raise ConfigError(f"{given} holds {shown}, not written by monsoon (no run or compare of "
                          f"its is there), which {who} there would write over; give a new or "
                          "empty folder, or one monsoon wrote")


ASIDE = ".aside-"  # the prefix of a file set aside in its own folder


class SetAside:
    """A previous run's files moved out of the way of a starting run until
    it ends: each is renamed in its own folder to ``.aside-NAME`` (a rename
    on the same file system, whatever disk a folder such as ``checkpoints``
    is on; no reader takes such a name for a result, a checkpoint or an
    event file). ``restore`` gives them back where the run was refused,
    after removing the result, TensorBoard and checkpoint files the refused
    run wrote, and ``give_back`` where a run that started left no results
    of its own (no summary); ``discard`` deletes them once the run stands on its own
    (finished, failed or interrupted, its results written). They take their disk space until
    then. Files set aside by a run that was killed go with the next run."""

    def __init__(self, out: Path, folders=("tb", "checkpoints")):
        self.out = Path(out)
        self.folders = [self.out, *(self.out / f for f in folders)]
        for stale in self._files(ASIDE + "*"):  # a killed run's
            stale.unlink(missing_ok=True)
        self.moved: list[tuple[Path, Path]] = []  # (where it was, where it is)
        self.before: set | None = None  # the files when the run began (``begins``)

    def _files(self, pattern: str) -> list[Path]:
        return [p for folder in self.folders if folder.is_dir()
                for p in folder.glob(pattern) if p.is_file()]

    def keep(self, path: Path) -> None:
        """Set ``path`` (a file in one of the folders) aside, if it exists."""
        path = Path(path)
        if path.is_file():
            there = path.with_name(ASIDE + path.name)
            os.replace(path, there)
            self.moved.append((path, there))

    def holds_results(self) -> bool:
        """Whether a previous run's results (``RESULT_FILES``) are set aside."""
        return any(path.parent == self.out and path.name in RESULT_FILES
                   for path, _ in self.moved)

    def begins(self) -> None:
        """The folder is set up (what goes is aside, a damaged checkpoint
        moved to ``.damaged``): what appears from now on is the run's."""
        self.before = set(self._files("*"))

    def _written_since(self) -> set:
        """The files that appeared since ``begins``: the run's, but under
        tb/ only monsoon's event files (``events.is_own``: a user's own
        writer may add its files there meanwhile)."""
        tb = self.out / "tb"
        return {p for p in set(self._files("*")) - (self.before or set())
                if p.parent != tb or is_own(p.name)}

    def restore(self) -> None:
        if self.before is not None:
            for path in self._written_since():  # the refused run's own
                path.unlink(missing_ok=True)
        for path, there in self.moved:
            os.replace(there, path)
        self.moved = []

    def give_back(self) -> None:
        """A run that started but left no results of its own (a resumed run
        that failed, a new one whose summary could not be written) gives the
        previous run's back, in place of any result file (``RESULT_FILES``)
        it began to write, and of its TensorBoard files where the previous
        run's were set aside (a new run's series, not carried on); the rest
        of what it wrote stays (its checkpoints: the line names the newest
        to carry on from), and a file set aside whose place one of them
        took (another run's checkpoint of the same step) goes."""
        tb = self.out / "tb"
        new_series = any(path.parent == tb for path, _ in self.moved)
        for path in self._written_since():
            if (path.parent == self.out and path.name in RESULT_FILES
                    or new_series and path.parent == tb):
                path.unlink(missing_ok=True)
        for path, there in self.moved:
            if path.exists():
                there.unlink(missing_ok=True)
            else:
                os.replace(there, path)
        self.moved = []

    def discard(self) -> None:
        for _, there in self.moved:
            there.unlink(missing_ok=True)
        self.moved = []


def clear_results(out: Path, resuming: bool, aside: SetAside | None = None) -> None:
    """Remove a previous run's results from ``out`` before a run starts
    there (``RESULT_FILES``; and its TensorBoard event files under tb/,
    unless this run resumes it and carries its live series on), or move
    them ``aside``. Only monsoon's own event files go (``events.is_own``:
    told by name, not by which process wrote them, since under torchrun
    each rank names its own); other files in tb/, a user's own writer's,
    stay, as does any file in ``out`` that monsoon does not write."""
    out = Path(out)
    remove = aside.keep if aside is not None else (lambda p: p.unlink(missing_ok=True))
    for name in RESULT_FILES:
        remove(out / name)
    if not resuming and (out / "tb").is_dir():
        for path in sorted((out / "tb").glob(OWN_PATTERN)):
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

"""Loss curves as PNG (matplotlib, no screen needed)."""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_loss(path: Path, curves: dict[str, list[dict]], title: str = "") -> None:
    """Two panels: loss against wall time and against epochs, one curve per
    entry of ``curves`` (strategy name -> metrics rows)."""
    from .run_folder import atomic_write

    fig, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 4.2))
    positive = all(r["loss"] > 0 for rows in curves.values() for r in rows
                   if r["loss"] == r["loss"])
    for name, rows in curves.items():
        if not rows:
            continue
        by_time.plot([r["time_s"] for r in rows], [r["loss"] for r in rows], label=name)
        by_epoch.plot([r["epoch"] for r in rows], [r["loss"] for r in rows], label=name)
    for ax, xlabel in ((by_time, "wall time (s)"), (by_epoch, "epochs (examples / training set)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training loss (full data)")
        if positive:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, buf.getvalue())

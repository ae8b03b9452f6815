"""Loss curves as PNG (matplotlib, no screen needed)."""
from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .atomic import atomic_write  # noqa: E402


def _save_png(fig, path: Path) -> None:
    """Render, then write atomically (a temp file renamed into place)."""
    if fig.get_layout_engine() is None:  # a figure laid out as it is drawn keeps its own
        fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


LOG_SPAN = 10.0  # losses spanning less than this factor read better on a linear axis


def _log_scale(losses: list) -> bool:
    """Whether the loss axis is logarithmic: every loss positive (a NaN
    aside) and the finite ones spanning at least ``LOG_SPAN``; a narrower
    range on a log axis is labelled in powers of ten (1.08 x 10^0)."""
    if not all(v > 0 for v in losses if v == v):
        return False
    finite = [v for v in losses if math.isfinite(v)]
    return bool(finite) and max(finite) >= LOG_SPAN * min(finite)


def plot_loss(path: Path, curves: dict[str, list[dict]], title: str = "") -> int:
    """Two panels: loss against wall time and against epochs, one curve per
    entry of ``curves`` (strategy name -> metrics rows), and a dashed
    validation curve beside it where the rows have ``val_loss``. Returns the
    number of validation curves drawn. One legend serves both panels, below
    them, where it hides no curve however many strategies there are."""
    fig, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    log = _log_scale([r[k] for rows in curves.values() for r in rows
                      for k in ("loss", "val_loss") if r.get(k) is not None])
    for i, (name, rows) in enumerate(curves.items()):
        if not rows:
            continue
        color = f"C{i % 10}"
        by_time.plot([r["time_s"] for r in rows], [r["loss"] for r in rows], label=name,
                     color=color)
        by_epoch.plot([r["epoch"] for r in rows], [r["loss"] for r in rows], label=name,
                      color=color)
        val = [r for r in rows if r.get("val_loss") is not None]
        if val:  # validation curves: dashed, in the training curve's colour
            by_time.plot([r["time_s"] for r in val], [r["val_loss"] for r in val],
                         linestyle="--", color=color, label=f"{name} (validation)")
            by_epoch.plot([r["epoch"] for r in val], [r["val_loss"] for r in val],
                          linestyle="--", color=color, label=f"{name} (validation)")
    validated = sum(any(r.get("val_loss") is not None for r in rows) for rows in curves.values())
    for ax, xlabel in ((by_time, "wall time (s)"), (by_epoch, "epochs (examples / training set)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("loss (full training set" + ("; dashed: validation)" if validated else ")"))
        if log:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    handles, labels = by_time.get_legend_handles_labels()
    if handles:  # a failed run's folder may have no curve
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4),
                   frameon=False)
    if title:
        fig.suptitle(title)
    _save_png(fig, path)
    return validated


def plot_staleness(path: Path, counts: dict, title: str = "") -> None:
    """Histogram of update staleness: how many updates other workers applied
    between a worker's read of the parameters and its own update."""
    taus = sorted(int(t) for t in counts)
    values = [int(counts[t] if t in counts else counts[str(t)]) for t in taus]
    total = sum(values)
    mean = sum(t * v for t, v in zip(taus, values)) / total
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.bar(taus, values, width=0.9, color="tab:blue")
    ax.axvline(mean, color="tab:red", linestyle="--", label=f"mean {mean:.2f}")
    ax.set_xlabel("staleness (updates applied between read and update)")
    ax.set_ylabel("updates")
    if max(values) > 50 * max(1, min(values)):
        ax.set_yscale("log")
    ax.legend()
    ax.set_title(title)
    _save_png(fig, path)


def staleness_shares(counts: dict) -> tuple[list[int], list[float]]:
    """Every staleness from the least to the most seen, and the share of
    updates at each: 0 where none was, so that a step line does not draw
    the level of one staleness across values no update had (on the log
    axis a 0 is a gap in the line)."""
    values = {int(t): int(v) for t, v in counts.items()}
    total = sum(values.values())
    taus = list(range(min(values), max(values) + 1))
    return taus, [values.get(t, 0) / total for t in taus]


def plot_staleness_by_strategy(path: Path, rows: list[dict], title: str = "") -> None:
    """Side by side, one curve per strategy: the share of updates by their
    staleness in updates (left) and, for strategies with a clock (ssp), the
    share of gradients by their staleness in clocks, with the bound (right)."""
    fig, (by_updates, by_clocks) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, r in enumerate(rows):
        color = f"C{i % 10}"
        label = r["strategy"] + (f" (S={r['staleness_bound']})"
                                 if r.get("staleness_bound") is not None else "")
        for ax, counts in ((by_updates, r["staleness_counts"]),
                           (by_clocks, r["clock_staleness_counts"])):
            if not counts:
                continue
            taus, shares = staleness_shares(counts)
            ax.plot(taus, shares, drawstyle="steps-mid", marker="o", markersize=3,
                    color=color, label=label)
        if r["clock_staleness_counts"] and r.get("staleness_bound") is not None:
            by_clocks.axvline(r["staleness_bound"], color=color, linestyle=":", alpha=0.7)
    by_updates.set_xlabel("staleness in updates (applied between read and push)")
    by_updates.set_ylabel("share of updates")
    by_clocks.set_xlabel("staleness in clocks (dotted: the bound)")
    by_clocks.set_ylabel("share of gradients")
    from matplotlib.ticker import MaxNLocator

    for ax in (by_updates, by_clocks):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.set_yscale("log", nonpositive="mask")
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no strategy with a clock", ha="center", va="center",
                    transform=ax.transAxes)
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    _save_png(fig, path)

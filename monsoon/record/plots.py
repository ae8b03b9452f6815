"""Loss curves and staleness histograms as PNG files, drawn headless.

Figures are built with matplotlib's object API: a ``Figure`` on its own Agg
canvas, never through pyplot, so a user's backend, open figures and pyplot
state stay as they were (``matplotlib.use("Agg")`` would switch a
notebook's backend). matplotlib takes a good part of a second to import:
only this module imports it, and only the code that writes a run folder or
a comparison imports this module, when it draws; ``import monsoon`` and
every worker process go without it.

Margins are fixed, in inches, sized for the labels these plots carry (a
y label of up to 3 inches, tick labels such as ``4 x 10^-1``, an offset
text such as ``1e-6+2.6285e-1`` above a panel, the title): matplotlib's
constrained layout would measure every text at each draw, the larger part
of drawing a loss plot. The loss plot's figure grows by its legend's rows,
so the panels keep their size however many curves the legend names.
"""
from __future__ import annotations

import io
import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .atomic import atomic_write

DPI = 110
WIDE = 11.0          # inches: the two-panel figures' width
PANEL_HEIGHT = 3.0   # inches: fits the longest y label (2.9 in at 10 pt)
TOP = 0.5            # inches above the panels: the title, and an axis' offset text
BOTTOM = 0.6         # inches below the panels: x tick labels and the x label
LEFT = 1.0           # inches left of each panel: tick labels (4 x 10^-1) and the y label
RIGHT = 0.2          # inches right of the last panel: half its last x tick label
LEGEND_ROW = 0.21    # inches a legend row takes at 10 pt
LEGEND_PAD = 0.08    # inches between the legend and the figure's bottom edge


def _figure(width: float, height: float) -> Figure:
    """A figure drawn by Agg, unknown to pyplot; no layout engine, whatever
    the user's matplotlibrc says (the margins are ``_place_panels``')."""
    fig = Figure(figsize=(width, height), layout="none")
    FigureCanvasAgg(fig)
    return fig


def _place_panels(fig: Figure, *, bottom: float, top: float = TOP) -> None:
    """Fixed margins, in inches: ``LEFT`` left of every panel (the gap
    between panels holds the right panel's y labels), ``RIGHT``, and
    ``bottom`` and ``top``."""
    width, height = fig.get_size_inches()
    n = len(fig.axes)
    panel = (width - n * LEFT - RIGHT) / n
    fig.subplots_adjust(left=LEFT / width, right=1 - RIGHT / width, bottom=bottom / height,
                        top=1 - top / height, wspace=LEFT / panel)


def _save_png(fig: Figure, path: Path) -> None:
    """Render, then write atomically (a temp file renamed into place)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
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
    fig = _figure(WIDE, TOP + PANEL_HEIGHT + BOTTOM)
    by_time, by_epoch = fig.subplots(1, 2)
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
    _legend_below(fig, *by_time.get_legend_handles_labels())
    if title:
        fig.suptitle(title)
    _save_png(fig, path)
    return validated


def _legend_below(fig: Figure, handles: list, labels: list, columns: int = 4) -> None:
    """One legend for every panel, below them: the figure grows by its rows,
    so it covers no panel. A failed run's folder may have no curve, and
    then no legend."""
    rows = math.ceil(len(labels) / columns)
    legend = rows * LEGEND_ROW + 2 * LEGEND_PAD if labels else 0.0
    height = TOP + PANEL_HEIGHT + BOTTOM + legend
    fig.set_size_inches(WIDE, height)
    _place_panels(fig, bottom=BOTTOM + legend)
    if labels:
        fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, LEGEND_PAD / height),
                   ncol=min(len(labels), columns), frameon=False, borderaxespad=0.0)


def plot_staleness(path: Path, counts: dict, title: str = "") -> None:
    """Histogram of update staleness: how many updates other workers applied
    between a worker's read of the parameters and its own update."""
    taus = sorted(int(t) for t in counts)
    values = [int(counts[t] if t in counts else counts[str(t)]) for t in taus]
    total = sum(values)
    mean = sum(t * v for t, v in zip(taus, values)) / total
    fig = _figure(6.5, 4.0)
    ax = fig.subplots()
    ax.bar(taus, values, width=0.9, color="tab:blue")
    ax.axvline(mean, color="tab:red", linestyle="--", label=f"mean {mean:.2f}")
    ax.set_xlabel("staleness (updates applied between read and update)")
    ax.set_ylabel("updates")
    if max(values) > 50 * max(1, min(values)):
        ax.set_yscale("log")
    ax.legend()
    ax.set_title(title)
    _place_panels(fig, bottom=BOTTOM, top=0.4)
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
    fig = _figure(WIDE, TOP + PANEL_HEIGHT + BOTTOM)
    by_updates, by_clocks = fig.subplots(1, 2)
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
    for ax in (by_updates, by_clocks):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.set_yscale("log", nonpositive="mask")
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no strategy with a clock", ha="center", va="center",
                    transform=ax.transAxes)
        ax.grid(True, alpha=0.3)
    _place_panels(fig, bottom=BOTTOM)
    if title:
        fig.suptitle(title)
    _save_png(fig, path)

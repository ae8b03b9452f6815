"""The comparison's plots draw what was counted: a staleness no update had
is a share of 0 (a gap on the log axis), not the level of its neighbour
carried across by the step line; a loss axis is logarithmic only where the
losses span a decade, and labelled with what it shows; the loss plot's
legend, below its panels, hides no curve; with margins fixed in inches
(whatever layout a user's matplotlibrc asks for), every label, title and
legend entry lies whole inside its figure, clear of every other."""
from matplotlib.text import Text

from monsoon.record import plots


def test_a_staleness_no_update_had_is_drawn_as_none(tmp_path, monkeypatch):
    taus, shares = plots.staleness_shares({"0": 6, "1": 2, "5": 2})
    assert taus == [0, 1, 2, 3, 4, 5]
    assert shares == [0.6, 0.2, 0.0, 0.0, 0.0, 0.2]

    drawn = []
    monkeypatch.setattr(plots, "_save_png", lambda fig, path: drawn.append(fig))
    rows = [{"strategy": "async", "staleness_counts": {"0": 6, "1": 2, "5": 2},
             "clock_staleness_counts": {}}]
    plots.plot_staleness_by_strategy(tmp_path / "staleness.png", rows)
    line = drawn[0].axes[0].lines[0]
    assert list(line.get_xdata()) == taus
    assert list(line.get_ydata()) == shares  # 0 at 2, 3 and 4: masked on the log axis
    assert drawn[0].axes[0].get_yscale() == "log"


def _drawn_loss_plot(tmp_path, monkeypatch, curves):
    drawn = []
    monkeypatch.setattr(plots, "_save_png", lambda fig, path: drawn.append(fig))
    plots.plot_loss(tmp_path / "comparison.png", curves)
    drawn[0].canvas.draw()
    return drawn[0].axes


def test_a_narrow_loss_range_is_drawn_on_a_linear_axis_labelled_in_plain_numbers(
        tmp_path, monkeypatch):
    """A user's model whose losses went 1.117 -> 1.079 (3 epochs) was drawn on
    a log axis labelled "1.08 x 10^0", "1.13 x 10^0"; a loss curve over
    decades (exp: 1.6 -> 0.0005) stays logarithmic. The y label names the
    dashed validation curves only where one is drawn."""
    rows = [{"time_s": t, "epoch": t, "loss": v} for t, v in
            enumerate((1.117, 1.098, 1.088, 1.079))]
    axes = _drawn_loss_plot(tmp_path, monkeypatch, {"serial": rows, "sync": rows})
    for ax in axes:
        assert ax.get_yscale() == "linear"
        labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)]
        assert labels and not any("times" in t or "^" in t for t in labels), labels
        assert ax.get_ylabel() == "loss (full training set)"
    wide = [{"time_s": t, "epoch": t, "loss": v, "val_loss": v * 1.1}
            for t, v in enumerate((1.6, 0.04, 0.003, 0.0005))]
    axes = _drawn_loss_plot(tmp_path, monkeypatch, {"serial": wide})
    assert [ax.get_yscale() for ax in axes] == ["log", "log"]
    assert axes[0].get_ylabel() == "loss (full training set; dashed: validation)"


def test_the_loss_plots_legend_hides_no_curve_with_eight_entries(tmp_path, monkeypatch):
    """Four strategies, each with a validation curve: eight legend entries.
    One legend serves both panels, below them: it covers neither panel, so
    no curve hides behind it (inside a panel it covered the curves' ends)."""
    curves = {f"s{k}": [{"time_s": t / 10, "epoch": t / 10, "loss": 1 / (1 + t) + k / 100,
                         "val_loss": 1.1 / (1 + t)} for t in range(30)] for k in range(4)}
    axes = _drawn_loss_plot(tmp_path, monkeypatch, curves)
    fig = axes[0].figure
    legends = list(fig.legends) + [ax.get_legend() for ax in axes if ax.get_legend()]
    assert len(legends) == 1 and len(legends[0].get_texts()) == 8
    box = legends[0].get_window_extent()
    for ax in axes:
        assert not box.overlaps(ax.get_window_extent()), (box, ax.get_window_extent())
    assert box.y1 <= min(ax.get_window_extent().y0 for ax in axes)  # below the panels
    assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1)


def _drawn_texts(fig):
    """Every text the figure draws: titles, axis labels, offset texts, legend
    entries, and the tick labels within their axis' view (matplotlib keeps
    labels for ticks beyond it, and does not draw them)."""
    ticks, drawn = set(), []
    for ax in fig.axes:
        for axis, coordinate in ((ax.xaxis, 0), (ax.yaxis, 1)):
            low, high = sorted(axis.get_view_interval())
            slack = 1e-9 * (high - low)
            for label in axis.get_majorticklabels() + axis.get_minorticklabels():
                ticks.add(id(label))
                if low - slack <= label.get_position()[coordinate] <= high + slack:
                    drawn.append(label)
    drawn += [t for t in fig.findobj(Text) if id(t) not in ticks]
    return [t for t in drawn if t.get_visible() and t.get_text().strip()]


def _texts_fit_apart(fig):
    """Every drawn text's box lies inside the figure and overlaps no other's."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _drawn_texts(fig)]
    for text, box in boxes:
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, (text, box, fig.bbox)
        assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, (text, box, fig.bbox)
    for i, (text, box) in enumerate(boxes):
        for other, other_box in boxes[i + 1:]:
            assert not box.overlaps(other_box), (text, other, box, other_box)
    return [text for text, _ in boxes]


def test_every_label_fits_in_the_figure_clear_of_the_others(tmp_path, monkeypatch):
    """The longest y label (with validation curves), power-of-ten tick labels
    (10^-18 .. 10^-3, and 2 x 10^-1 between two decades), an offset text
    above a panel (losses 0.26285 +- 1e-6), a title, eight strategies with
    validation curves (sixteen legend entries, four rows) and a failed run's
    empty panels, in the loss plot and the staleness plots."""
    names = ["serial", "sync", "async", "hogwild", "local-sgd", "easgd", "ssp", "pipeline"]
    cases = [
        {s: [{"time_s": t / 10, "epoch": t / 3, "loss": 1 / (1 + t) + k / 100,
              "val_loss": 1.2 / (1 + t)} for t in range(30)] for k, s in enumerate(names)},
        {"serial": [{"time_s": t / 10, "epoch": t / 3, "loss": 1e-3 * 0.3 ** t}
                    for t in range(30)]},
        {"serial": [{"time_s": t / 10, "epoch": t / 3, "loss": 0.5 * 0.9 ** t}
                    for t in range(30)]},
        {"serial": [{"time_s": t / 1000, "epoch": t / 3, "loss": 0.26285 + 1e-7 * (30 - t)}
                    for t in range(30)]},
        {"sync": []},
    ]
    drawn = []
    monkeypatch.setattr(plots, "_save_png", lambda fig, path: drawn.append(fig))
    for curves in cases:
        plots.plot_loss(tmp_path / "loss.png", curves, title="rcv1-like: loss by strategy")
    assert "pipeline (validation)" in _texts_fit_apart(drawn[0])
    for fig in drawn[1:]:
        _texts_fit_apart(fig)
    plots.plot_staleness(tmp_path / "staleness.png", {str(k): 10000 // (1 + k * k)
                                                      for k in range(60)}, title="exp: async x8")
    rows = [{"strategy": "async", "staleness_counts": {"0": 6, "1": 2, "5": 2},
             "clock_staleness_counts": {}},
            {"strategy": "ssp", "staleness_bound": 3, "staleness_counts": {"0": 9, "1": 4},
             "clock_staleness_counts": {"0": 5, "1": 3, "2": 2, "3": 1}}]
    plots.plot_staleness_by_strategy(tmp_path / "staleness.png", rows, title="exp: by strategy")
    plots.plot_staleness_by_strategy(tmp_path / "staleness.png", rows[:1], title="exp")
    for fig in drawn[len(cases):]:
        _texts_fit_apart(fig)


def test_a_users_matplotlibrc_layout_leaves_the_margins_fixed(tmp_path, monkeypatch):
    """A matplotlibrc asking for constrained layout would set the figures'
    layout engine, which refuses the fixed margins (with a warning) and
    moves every panel."""
    import matplotlib

    rows = {"serial": [{"time_s": t, "epoch": t, "loss": 1 / (1 + t)} for t in range(5)]}
    plain = _drawn_loss_plot(tmp_path, monkeypatch, rows)
    monkeypatch.setitem(matplotlib.rcParams, "figure.constrained_layout.use", True)
    users = _drawn_loss_plot(tmp_path, monkeypatch, rows)
    assert users[0].figure.get_layout_engine() is None
    assert [ax.get_position().bounds for ax in users] == [ax.get_position().bounds for ax in plain]

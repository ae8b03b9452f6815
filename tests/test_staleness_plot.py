"""The comparison's staleness plot draws what was counted: a staleness no
update had is a share of 0 (a gap on the log axis), not the level of its
neighbour carried across by the step line."""
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

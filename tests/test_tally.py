"""``monitor/tally.py``: the workers' end reports summed into a run's result."""
from collections import Counter

import numpy as np

from monsoon.compressors.messages import Compression
from monsoon.monitor.tally import RunTally, failed_list, run_folder_extra


def _traffic(sent):
    return {"sent": sent, "raw": 2 * sent, "received": 1, "messages": 1, "residual_norm": 0.0}


def test_reports_are_summed_and_a_lost_worker_is_listed_by_its_first_line():
    tally = RunTally(3, Compression())
    tally.add(2, {"staleness": {"1": 2}, "examples": 5, "dropped": 1, "late": 1,
                  "params": np.ones(2), "state": {}, "traffic": _traffic(10)})
    tally.add(0, {"staleness": {0: 3, 1: 1}, "examples": 7, "params": None,
                  "state": {"mean": 1.0}, "traffic": _traffic(30)})
    tally.failed[1] = "ValueError: boom\nTraceback ..."
    res = tally.result(np.zeros(2), 0.5, 2.0, 12, 4, 1, tally.extra(4), stopped=None)
    assert res.staleness == Counter({0: 3, 1: 3}) and res.late_gradients == 1
    assert (tally.examples, tally.dropped) == (12, 1)
    assert list(res.worker_params) == [2] and list(res.worker_states) == [0]
    assert res.failed_workers == [{"worker": 1, "error": "ValueError: boom",
                                   "traceback": "ValueError: boom\nTraceback ..."}]
    assert res.extra["bytes_sent_per_worker"] == [30, 10]  # by rank
    assert "clocks" not in res.extra  # no SSP


def test_ssp_fields_come_from_the_clock_reports_or_are_zero_when_the_run_has_a_clock():
    tally = RunTally(2, Compression())
    tally.add(1, {"clocks": {"staleness": {"2": 4}, "wait_s": 0.25, "clocks": 6}})
    extra = tally.extra(0)
    assert extra["clock_staleness_counts"] == {2: 4}
    assert extra["clock_wait_s"] == [0.0, 0.25] and extra["clocks"] == [0, 6]
    assert RunTally(2, Compression(), ssp=True).extra(0)["clocks"] == [0, 0]


def test_run_folder_extra_names_what_there_is():
    assert run_folder_extra(None, None) == {}
    assert run_folder_extra("a/ckpt.npz", "b") == {"checkpoint": "a/ckpt.npz",
                                                  "resumed_from": "b"}
    assert failed_list({}) == []


def test_the_reported_late_gradients_travel_in_the_totals_and_older_totals_count_from_zero():
    """A checkpoint's totals carry the late gradients the workers reported
    (Ray's backup workers), so a resumed run's tally counts the earlier
    attempt's too; totals written before they held them count from zero."""
    first = RunTally(2, Compression())
    first.add(0, {"late": 3, "staleness": {0: 5}})
    resumed = RunTally.resumed(2, Compression(), first.totals(), {1: {"late": 2}})
    assert resumed.late == 5 and resumed.staleness == Counter({0: 5})
    older = {k: v for k, v in first.totals().items() if k != "late"}
    assert RunTally.resumed(2, Compression(), older, {1: {"late": 2}}).late == 2

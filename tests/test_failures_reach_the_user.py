"""No raw traceback, ever: when an engine fails mid-run, the user gets one
line that names the reason, the run folder (written, status "failed") and
how to carry on; the folder keeps the curve so far and the checkpoint.

The failure is injected into each engine's monitor loop (the recorder it
calls as rows fall due raises an error of no monsoon type, as a library's
own exception would), or, for the torch engine, whose monitor is rank 0 in
a child process, into a rank's gradient.
"""
import json
import re

import pytest

import monsoon
from monsoon.cli import main
from monsoon.errors import WorkerError
from monsoon.record import recorder as recorder_module

from spark_env import spark  # noqa: F401  (a fixture)


@pytest.fixture
def monitor_fault(monkeypatch):
    """The monitor's second recorded row raises."""
    real = recorder_module.Recorder.record
    calls = {"n": 0}

    def record(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected monitor fault\n  with a second line a traceback has")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(recorder_module.Recorder, "record", record)
    return calls


# The ray engine's actors start without torch on a NumPy problem (the failure
# is the monitor's, whatever the problem)
PROBLEM = {"ray": "logistic"}
ENGINES = [
    ("local", []),
    ("sim", []),
    pytest.param("ray", ["--timeout", "60", "--shards", "1"],
                 marks=[pytest.mark.ray, pytest.mark.slow]),
    pytest.param("spark", ["--timeout", "60"], marks=[pytest.mark.spark, pytest.mark.slow]),
]


@pytest.mark.parametrize("engine, extra", ENGINES)
def test_a_failing_monitor_gives_one_line_and_a_failed_run_folder(engine, extra, tmp_path,
                                                                 monitor_fault, capsys,
                                                                 request):
    if engine in ("ray", "spark"):  # the suite's server, as the other tests of the engine
        request.getfixturevalue({"ray": "local_ray", "spark": "spark"}[engine])
    out = tmp_path / "run"
    code = main(["train", "--problem", PROBLEM.get(engine, "digits"), "--strategy", "sync",
                 "--workers", "2", "--engine", engine, "--steps", "60", "--batch-size", "32",
                 "--evals", "30", "--checkpoint-every", "5", "--out", str(out), "--quiet",
                 *extra])
    # Ray's own start-up log lines (timestamped) are not monsoon's output
    err = "\n".join(line for line in capsys.readouterr().err.strip().splitlines()
                    if not re.match(r"\d{4}-\d\d-\d\d \d\d:", line))
    assert code == 1
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"monsoon: error: the {engine} engine failed: RuntimeError: injected "
                          "monitor fault (run folder ")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "injected monitor fault" in summary["error"]
    assert (out / "config.json").is_file() and (out / "metrics.csv").is_file()
    if summary["checkpoint"]:  # the line says how to carry on from it
        assert err.endswith(f"run the same command with --resume {out}")


@pytest.mark.torchrun
@pytest.mark.slow
def test_a_failing_torch_rank_gives_one_line_and_a_failed_run_folder(tmp_path):
    from faulty import FaultyProblem
    from monsoon.problems import make_problem

    problem = FaultyProblem(make_problem("exp", "float64"), "raise", rank=1, after=3)
    with pytest.raises(WorkerError) as caught:
        monsoon.train(problem, "sync", 2, engine="torch", steps=20, timeout=30,
                      out=tmp_path / "run")
    line = str(caught.value)
    assert "\n" not in line and f"(run folder {tmp_path / 'run'})" in line
    assert "rank 1 failed (exit code 1): RuntimeError: injected failure on worker 1" in line
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["engine"] == "torch"

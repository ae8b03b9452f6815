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

import numpy as np
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


def test_a_failed_run_in_a_used_folder_leaves_no_trace_of_the_previous_run(tmp_path, capsys,
                                                                          monkeypatch):
    """Before: the failed run's summary.json sat beside the previous run's
    model.pt, and its advice named the previous run's checkpoint
    (ckpt-...010.npz, seed 0), which --resume with this command (seed 1)
    refuses. Now the folder is cleared of the previous run's results and of
    checkpoints of another run before any work starts, and the advice names
    only a checkpoint this command resumes."""
    out = tmp_path / "run"
    args = ["train", "--problem", "exp", "--strategy", "serial", "--epochs", "2",
            "--checkpoint-every", "10", "--out", str(out), "--quiet"]
    assert main(args) == 0
    assert (out / "model.pt").is_file() and list((out / "checkpoints").glob("ckpt-*.npz"))
    for old in (out / "tb").glob("events.out.tfevents.*"):  # marked as the previous run's
        with open(old, "ab") as f:
            f.write(b"previous run")
    capsys.readouterr()
    real, calls = recorder_module.Recorder.record, {"n": 0}

    def record(self, *a, **k):  # the new run fails once it has started
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected monitor fault")
        return real(self, *a, **k)

    monkeypatch.setattr(recorder_module.Recorder, "record", record)
    assert main(args + ["--seed", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "injected monitor fault" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["seed"] == 1
    assert not (out / "model.pt").exists()
    assert not any(b"previous run" in p.read_bytes()
                   for p in (out / "tb").glob("events.out.tfevents.*"))
    from monsoon.record.checkpoints import checkpoint_files, read

    assert all(read(p).meta["seed"] == 1 for p in checkpoint_files(out / "checkpoints"))
    if summary["checkpoint"]:
        assert read(summary["checkpoint"]).meta["seed"] == 1
        assert err.endswith(f"run the same command with --resume {out}")
    else:
        assert "--resume" not in err


def test_a_rerun_into_its_own_folder_resumes_from_its_checkpoints(tmp_path):
    """A run's own checkpoints (same problem, settings, seed) stay when the
    folder is reused: --resume and a torchrun restart read them."""
    out = tmp_path / "run"
    monsoon.train("exp", "serial", epochs=2, checkpoint_every=10, out=out, progress=False)
    saved = sorted((out / "checkpoints").glob("ckpt-*.npz"))
    run = monsoon.train("exp", "serial", epochs=3, checkpoint_every=10, out=out,
                        resume=str(out), progress=False)
    assert run.summary["resumed_from"] == str(saved[-1])


@pytest.mark.parametrize("strategy", ["async", "ssp", "easgd"])
def test_a_failing_evaluation_after_the_run_gives_one_line_and_a_failed_run_folder(
        strategy, tmp_path):
    """A label out of range fails one worker; the others carry on, and the
    curve's evaluation after the run meets it again over the whole set.
    Before: a bare IndexError and a folder without summary.json. Now: one
    line naming both, and the folder holds the run's counts and model."""
    import torch

    from monsoon.errors import RunFailed

    torch.manual_seed(0)
    X, y = torch.randn(400, 4), torch.randint(0, 3, (400,))
    y[300] = 9
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    out = tmp_path / "run"
    with pytest.raises(RunFailed) as caught:
        monsoon.train(monsoon.TorchProblem(model, torch.nn.CrossEntropyLoss(), X, y),
                      strategy, 2, epochs=3, backend="threads", out=out, progress=False)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(
        "evaluating the trained model failed: IndexError: Target 9 is out of bounds.")
    assert "had failed: IndexError" in line and line.endswith(f"(run folder {out})")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["updates"] > 0
    assert len(summary["failed_workers"]) == 1
    assert (out / "model.pt").is_file() and (out / "metrics.csv").is_file()


def test_buffers_that_cannot_be_loaded_leave_the_parameters_saved(tmp_path):
    """The evaluation failed on the workers' buffers: the failed run's folder
    still gets the trained parameters (without those buffers, unchanged),
    and the line says what was left out."""
    from types import SimpleNamespace

    import torch

    from monsoon import api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    problem = monsoon.TorchProblem(model, torch.nn.MSELoss(), torch.randn(32, 4),
                                   torch.randn(32, 3))
    params = problem.initial_params(0) + 1.0
    res = SimpleNamespace(params=params, worker_states=[{"9.running_mean": np.ones(3)}])
    resolved = SimpleNamespace(problem=problem, strategy=SimpleNamespace(buffers="rank0"))
    said = api._save_trained(tmp_path, resolved, res)
    assert said.startswith("; its model saved without the workers' buffers"), said
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    assert torch.equal(saved["0.bias"], torch.as_tensor(params[12:15]))
    assert torch.equal(saved["1.running_mean"], torch.zeros(3))

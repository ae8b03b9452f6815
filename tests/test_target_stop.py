"""``--target-loss`` stops a local run where its loss reaches the target, as
it stops a Spark run: the curve's rows are evaluated as they are taken
(``Recorder.check_target``, cost-bounded), the first at the target aborts
the workers as a divergence does, and the summary says ``reached target``
with ``stopped_at_target``; the run returns the parameters the check found
(``target_params``). A run whose target is never met runs its whole
budget; a run given no target evaluates nothing while it goes. ``--tol``
stops a local run the same way once an epoch gains less than tol."""
import json

import pytest

import monsoon
from monsoon.record import checkpoints
from monsoon.record.recorder import Recorder

from test_record_cli import run_cli

EPOCHS = 30  # "exp" falls from 1.56 to about 0.025 over them
EASY = 0.2  # met within the first epochs on every path
NEVER = 1e-4  # below what the budget reaches

PATHS = [("serial", 1, {}),  # inline, in the calling thread
         ("async", 2, {"backend": "threads"}),
         ("sync", 2, {"backend": "processes"})]


@pytest.mark.parametrize("strategy, workers, engine", PATHS, ids=[p[0] for p in PATHS])
def test_a_local_run_stops_at_its_target_before_its_budget(strategy, workers, engine):
    run = monsoon.train("exp", strategy, workers, epochs=EPOCHS, target_loss=EASY,
                        progress=False, **engine)
    s = run.summary
    assert s["status"] == "reached target" and "stopped" not in s, s
    assert s["stopped_at_target"].startswith(f"reached the target loss {EASY:g}"), s
    assert s["epochs"] < EPOCHS, s["epochs"]
    assert s["final_loss"] <= EASY and s["time_to_target_s"] is not None, s
    assert run.history[-1]["loss"] == s["final_loss"] <= EASY
    # the parameters returned are those the check found at the target
    assert run.problem.loss(run.params) == pytest.approx(s["final_loss"], rel=1e-5)


@pytest.mark.parametrize("strategy, workers, engine", PATHS[:2], ids=[p[0] for p in PATHS[:2]])
def test_a_target_never_met_runs_the_whole_budget(strategy, workers, engine):
    run = monsoon.train("exp", strategy, workers, epochs=3, target_loss=NEVER,
                        progress=False, **engine)
    s = run.summary
    assert s["status"] == "finished" and "stopped_at_target" not in s, s
    assert s["epochs"] == pytest.approx(3) and s["time_to_target_s"] is None, s


def test_only_a_run_given_a_target_evaluates_while_it_goes(monkeypatch):
    """No slowdown for runs without --target-loss: their snapshots are
    evaluated after the run only."""
    checks = []
    check = Recorder._check_target
    monkeypatch.setattr(Recorder, "_check_target",
                        lambda self, *a: (checks.append(a[1]), check(self, *a)))
    for strategy, workers, engine in PATHS[:2]:
        monsoon.train("exp", strategy, workers, epochs=2, progress=False, **engine)
        assert checks == [], strategy
        monsoon.train("exp", strategy, workers, epochs=2, target_loss=NEVER, progress=False,
                      **engine)
        assert checks, strategy
        checks.clear()


def test_a_run_stopped_at_its_target_is_finished_not_interrupted(tmp_path):
    """With checkpoints written, the stop at the target is a run's end: the
    command exits 0 and offers no --resume, and summary.json says why it
    ended early."""
    out = tmp_path / "run"
    done = run_cli("train", "--problem", "exp", "--strategy", "sync", "--workers", "2",
                   "--backend", "threads", "--epochs", str(EPOCHS), "--target-loss", str(EASY),
                   "--checkpoint-every", "1", "--out", str(out))
    assert checkpoints.checkpoint_files(out / "checkpoints")
    assert done.returncode == 0, done.stderr
    assert "--resume" not in done.stdout + done.stderr, done
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == f"run folder: {out}"
    assert lines[-2].startswith(f"stopped early: reached the target loss {EASY:g}"), lines
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "reached target" and summary["epochs"] < EPOCHS, summary


TOL = 0.3  # "exp" gains less than 30% an epoch within its first ten epochs
# A budget long past that: a monitor short of a core (a loaded machine) takes
# its curve rows late, and the check needs two rows an epoch apart
TOL_EPOCHS = 100


@pytest.mark.parametrize("strategy, workers, engine", PATHS, ids=[p[0] for p in PATHS])
def test_a_local_run_given_tol_stops_once_an_epoch_gains_less(strategy, workers, engine):
    """--tol stops local runs as it stops Spark's: once the best loss checked
    so far is below the best of an epoch earlier by less than tol of itself."""
    run = monsoon.train("exp", strategy, workers, epochs=TOL_EPOCHS, tol=TOL, progress=False,
                        **engine)
    s = run.summary
    assert s["status"] == "converged" and "stopped" not in s, s
    assert s["stopped_converged"].startswith(f"converged: the loss fell by less than {TOL:g}")
    assert 1 < s["epochs"] < TOL_EPOCHS, s["epochs"]
    assert s["final_loss"] < 0.5 * run.history[0]["loss"], s  # it trained before it stopped


def test_the_sim_refuses_tol_in_one_line():
    """The sim runs its whole budget on its virtual clock: --tol is refused
    before the run, as Spark's barrier stage refuses it."""
    with pytest.raises(monsoon.ConfigError, match="sim engine does not do for async: drop --tol"):
        monsoon.train("exp", "async", 2, engine="sim", epochs=2, tol=TOL, progress=False)


def test_a_run_stopped_by_tol_says_so_and_exits_0(tmp_path):
    out = tmp_path / "run"
    done = run_cli("train", "--problem", "exp", "--strategy", "async", "--workers", "2",
                   "--backend", "threads", "--epochs", str(TOL_EPOCHS), "--tol", str(TOL),
                   "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "--resume" not in done.stdout + done.stderr, done
    lines = done.stdout.strip().splitlines()
    assert lines[-2].startswith(f"stopped early: converged: the loss fell by less than {TOL:g}")
    assert json.loads((out / "summary.json").read_text())["status"] == "converged"


EVALS_0 = ("is checked on the loss curve's rows and --evals 0 records none: give --evals 1 or "
           "more, or drop ")


@pytest.mark.parametrize("args", [
    ["train", "--target-loss", "0.2"],
    ["simulate", "--target-loss", "0.2"],
    ["compare", "--strategies", "serial,sync", "--target-loss", "0.2"],
    ["train", "--engine", "spark", "--problem", "logistic", "--strategy", "async",
     "--workers", "2", "--tol", "0.01"],
], ids=["train", "simulate", "compare", "spark-tol"])
def test_evals_0_with_a_target_or_tol_is_refused_in_one_line(tmp_path, args):
    """Only the curve's rows are checked for --target-loss and --tol, and
    --evals 0 records none: the run went its whole budget, never stopping
    and never reporting a time to the target. Refused, from the command in
    its own process, before anything is written."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "monsoon", *args, "--evals", "0", "--epochs",
                           "1", "--quiet", "--out", str(out)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})
    flag = "--tol" if "--tol" in args else "--target-loss"
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"monsoon: error: {flag} {EVALS_0}{flag}"]
    assert not out.exists()


def test_evals_0_is_refused_from_python_in_its_keywords_but_not_where_steps_stop():
    """From Python the line names the keywords. Spark's sync L-BFGS checks
    each full-batch step's own loss, not the curve's rows: it still stops at
    the target with --evals 0 (docs/engines/spark.md), and is taken."""
    from monsoon.config import resolve

    with pytest.raises(monsoon.ConfigError, match=r"^target_loss is checked on the loss "
                       r"curve's rows and evals=0 records none: give evals=1 or more, or "
                       r"drop target_loss$"):
        monsoon.train("exp", evals=0, target_loss=EASY, epochs=1, progress=False)
    lbfgs = {"rule": "lbfgs", "evals": 0, "target_loss": 0.5}
    with pytest.raises(monsoon.ConfigError, match="evals=0 records none"):
        resolve("logistic", "serial", 1, lbfgs, cli=False)  # local: the curve's rows only
    taken = resolve("logistic", "sync", 2, {**lbfgs, "engine": "spark"}, cli=False)
    assert taken.run["evals"] == 0 and taken.run["target_loss"] == 0.5

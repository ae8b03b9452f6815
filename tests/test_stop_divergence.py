"""A run that diverged is reported as diverged, and no checkpoint holds its
non-finite parameters, also where a stop signal or a periodic checkpoint
comes before its curve shows the divergence: ``Due.look(stops=True)``
records a row due at the signal first, and ``Checkpointer.save`` writes
no checkpoint of parameters that are not finite (a resume would start
from a NaN model)."""
import signal
from collections import namedtuple

import numpy as np
import pytest

import monsoon
from monsoon.errors import TrainingDiverged
from monsoon.monitor import due as due_module
from monsoon.monitor.due import Due
from monsoon.record import checkpoints


class FakeRecorder:
    """A row due at every look; ``record`` returns ``reason`` (a divergence)."""

    def __init__(self, reason, due=True):
        self.reason, self.is_due, self.rows = reason, due, []

    def due(self, at, examples):
        return self.is_due

    def record(self, at, updates, examples, params, dropped, **kw):
        self.rows.append((at, updates, np.array(params)))
        return self.reason


NO_STATE = namedtuple("NoState", [])()  # a stateless rule's


def snapshot():
    return np.array([np.nan, 1.0]), 3, 0


@pytest.fixture
def sigterm(monkeypatch):
    monkeypatch.setattr(due_module, "stop_requested", lambda: signal.SIGTERM)


def test_a_divergence_due_with_a_stop_signal_is_the_reason(sigterm):
    recorder = FakeRecorder("diverged: the loss became nan")
    due = Due(recorder, stops=True)
    assert due.look(1.0, 10, snapshot) == "diverged: the loss became nan"
    assert len(recorder.rows) == 1 and recorder.rows[0][1] == 3


def test_a_row_due_at_a_stop_signal_is_recorded_then_the_signal_stops(sigterm):
    recorder = FakeRecorder(None)
    due = Due(recorder, stops=True)
    assert due.look(1.0, 10, snapshot) == "interrupted by SIGTERM"
    assert len(recorder.rows) == 1 and due.interrupted == signal.SIGTERM
    # no row due: the signal alone, kept
    recorder.is_due = False
    assert due.look(2.0, 20, snapshot) == "interrupted by SIGTERM"
    assert len(recorder.rows) == 1


def test_no_checkpoint_holds_parameters_not_finite(tmp_path, capsys):
    keeper = checkpoints.Checkpointer(tmp_path, 1, None, {"problem": "p"})
    first = keeper.save(1, 0.1, np.ones(3), NO_STATE, {"dropped": 0})
    assert first is not None and first.is_file()
    for bad in (np.nan, np.inf):
        assert keeper.save(2, 0.2, np.array([1.0, bad, 1.0]), NO_STATE, {"dropped": 0}) is None
    assert checkpoints.checkpoint_files(tmp_path) == [first]
    assert keeper.last_path == first  # what the summary names: the last finite one
    err = capsys.readouterr().err
    assert err.count("not finite") == 1 and str(first) in err


@pytest.mark.parametrize("engine", ["local", "sim"])
def test_a_run_diverged_between_rows_leaves_no_nan_checkpoint(tmp_path, engine):
    """Periodic checkpoints every update, the curve's first row after the
    divergence: before, each update's checkpoint held the NaN model."""
    out = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match="lower the learning rate"):
        monsoon.train("exp", "sync", 2, lr=1e305, epochs=50, evals=2, seed=0, out=out,
                      checkpoint_every=1, engine=engine)
    for path in checkpoints.checkpoint_files(out / "checkpoints"):
        assert np.isfinite(checkpoints.read(path).arrays["params"]).all(), path


@pytest.mark.spark
@pytest.mark.slow
def test_spark_rounds_report_a_divergence_seen_at_a_stop_signal(monkeypatch):
    """local-sgd's rounds on Spark (``Due(stops=True)``): SIGTERM arrives
    during the round whose row shows the divergence (every average dropped;
    the tolerated drops lowered to 2: the third round's). Before, the run
    was reported interrupted, its divergence unrecorded."""
    from monsoon.engines.spark import rounds
    from monsoon.record import recorder
    from spark_env import spark_session

    averaged = []
    apply_mean = rounds.apply_mean

    def counted(*args, **kw):  # a round's average, before its look
        averaged.append(1)
        return apply_mean(*args, **kw)

    monkeypatch.setattr(rounds, "apply_mean", counted)
    monkeypatch.setattr(due_module, "stop_requested",
                        lambda: signal.SIGTERM if len(averaged) >= 3 else None)
    monkeypatch.setattr(recorder, "DROPS_TOLERATED", 2)
    with spark_session("local[2]"):
        with pytest.raises(TrainingDiverged, match="3 updates had non-finite gradients"):
            monsoon.train("exp", "local-sgd", 2, engine="spark", lr=1e305, epochs=20,
                          seed=0, evals=1000, local_steps=2)
    assert len(averaged) == 3


@pytest.fixture
def stop_at_a_refused_checkpoint(monkeypatch):
    """SIGTERM as soon as a checkpoint was refused for parameters not
    finite, with no curve row due after the first (a long run's rows are
    far apart): the divergence is not yet in the curve when the stop comes."""
    from monsoon.record import recorder as recorder_module

    refused = []
    real_save, real_due = checkpoints.Checkpointer.save, recorder_module.Recorder.due

    def save(self, *args, **kwargs):
        path = real_save(self, *args, **kwargs)
        if self.refused:
            refused.append(args[0])
        return path

    monkeypatch.setattr(checkpoints.Checkpointer, "save", save)
    monkeypatch.setattr(recorder_module.Recorder, "due",
                        lambda self, now, examples: not self.rows and real_due(self, now,
                                                                               examples))
    monkeypatch.setattr(due_module, "stop_requested",
                        lambda: signal.SIGTERM if refused else None)
    return refused


def stopped_line(capsys, out, problem, lr, *extra):
    from monsoon.cli import main

    code = main(["train", "--problem", problem, "--strategy", "sync", "--workers", "2",
                 "--backend", "threads", "--lr", lr, "--epochs", "200", "--evals", "2",
                 "--checkpoint-every", "1", "--out", str(out), "--quiet", *extra])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 128 + signal.SIGTERM, lines
    assert lines[-1].startswith("monsoon: interrupted by SIGTERM"), lines
    return lines[-1]


def test_a_run_stopped_after_it_diverged_with_no_checkpoint_offers_no_resume(
        tmp_path, capsys, stop_at_a_refused_checkpoint):
    """Its first update makes the parameters infinite, so no checkpoint is
    written, and the stop comes before a row shows the divergence. Before,
    the line told nothing of it, and --resume was then refused ("no
    checkpoints folder there"); now it offers none, says why and what to do."""
    out = tmp_path / "run"
    line = stopped_line(capsys, out, "exp", "1e305")
    assert stop_at_a_refused_checkpoint and not checkpoints.checkpoint_files(out / "checkpoints")
    assert "--resume" not in line, line
    assert line.endswith("it cannot be carried on: it diverged (its parameters are not finite) "
                         "before it wrote any checkpoint; lower the learning rate (--lr) and "
                         "run it again from the start"), line


def test_a_run_stopped_after_it_diverged_past_a_checkpoint_offers_its_resume(
        tmp_path, capsys, stop_at_a_refused_checkpoint):
    """Least squares at a learning rate that grows the parameters tenfold
    and more an update: finite checkpoints come first, then one is refused
    and the run stopped. The last finite one is there to carry on from,
    and the line offers it, as --resume takes it."""
    import monsoon.api

    out = tmp_path / "run"
    line = stopped_line(capsys, out, "linear", "100")
    assert line.endswith(f"to carry on, run the same command with --resume {out}"), line
    found = monsoon.api.check_resume_of("linear", "sync", 2, out=out, backend="threads",
                                        lr=100, epochs=200, evals=2, checkpoint_every=1)
    assert found is not None and np.isfinite(found.arrays["params"]).all()


def test_a_resumed_run_stopped_after_it_diverged_offers_the_checkpoint_it_resumed_from(
        tmp_path, capsys, stop_at_a_refused_checkpoint):
    """The run above, resumed from its last finite checkpoint: its first
    update makes the parameters infinite, so it writes no checkpoint of its
    own, and is stopped. The checkpoint it resumed from is still there, and
    the line offers it (before, it said to run again from the start)."""
    out = tmp_path / "run"
    stopped_line(capsys, out, "linear", "100")
    written = checkpoints.checkpoint_files(out / "checkpoints")
    assert written
    stop_at_a_refused_checkpoint.clear()
    line = stopped_line(capsys, out, "linear", "100", "--resume", str(out))
    assert stop_at_a_refused_checkpoint, "the resumed run's first checkpoint was not refused"
    assert checkpoints.checkpoint_files(out / "checkpoints") == written
    assert line.endswith(f"to carry on, run the same command with --resume {out}"), line

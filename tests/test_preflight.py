"""Checks before any worker starts: bad data and a bad run folder are refused
in one line (exit 2, no traceback, nothing started); too many worker
processes get advice up front and a start-up timeout to match."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from monsoon.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def cli(*args):
    """``monsoon train --quiet ARGS`` in this process (what the shell shows,
    without a process start): its exit code and stderr, and how long it took."""
    import contextlib
    import io

    from monsoon.cli import main

    t0, err = time.monotonic(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(["train", "--quiet", *args])
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code
    proc = subprocess.CompletedProcess(args, code, "", err.getvalue())
    return proc, time.monotonic() - t0


def refused(proc, *words):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("monsoon: error: "), proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_svmlight_value_is_refused_with_its_line(tmp_path, value):
    data = tmp_path / "d.svm"
    data.write_text("1 1:0.5 2:1\n0 1:0.25\n" f"1 1:{value} 3:2\n")
    proc, _ = cli("--problem", f"libsvm:{data}", "--strategy", "serial",
                  "--out", str(tmp_path / "run"))
    refused(proc, f"{data}:3", "feature 1", "NaN and Inf")
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_non_finite_label_is_refused(tmp_path):
    data = tmp_path / "d.svm"
    data.write_text("1 1:0.5\nnan 1:0.25\n")
    proc, _ = cli("--problem", f"libsvm:{data}", "--strategy", "serial", "--out",
                  str(tmp_path / "run"))
    refused(proc, f"{data}:2", "the label")


def test_a_huge_feature_index_is_refused_with_its_line_and_index(tmp_path):
    data = tmp_path / "d.svm"
    data.write_text("1 1:0.5\n0 4294967299:1\n")
    proc, elapsed = cli("--problem", f"libsvm:{data}", "--strategy", "serial", "--out",
                        str(tmp_path / "run"))
    refused(proc, f"{data}:2", "feature index 4294967299 is too large")
    assert elapsed < 30


def test_an_out_folder_that_cannot_be_written_is_refused_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc, _ = cli("--problem", "exp", "--strategy", "sync", "--out", str(blocker / "run"))
    refused(proc, "cannot write the run folder", str(blocker / "run"), "--out")


def test_arrays_with_nan_are_refused_with_their_row():
    X = np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32)
    X[7, 1] = np.nan
    y = np.zeros(20, dtype=np.float32)
    from monsoon.problems.torch_problem import TorchProblem

    with pytest.raises(ConfigError, match="X row 7 holds nan"):
        TorchProblem(torch.nn.Linear(3, 1), torch.nn.functional.mse_loss, X, y)
    from monsoon.problems.sparse_linear import SparseLinear

    y[4] = np.inf
    with pytest.raises(ConfigError, match="y row 4 holds inf"):
        SparseLinear(np.ones((20, 3)), y, loss="squared")


def test_many_worker_processes_get_advice_and_time_to_start(capsys):
    from monsoon.engines.local.engine import LocalEngine

    engine = LocalEngine(backend="processes", start_timeout=120.0)
    cores = os.cpu_count() or 1
    assert engine._start_timeout(cores) == 120.0
    assert engine._start_timeout(16 * cores) == pytest.approx(120.0 * 8)
    assert "--backend threads" in capsys.readouterr().err
    advice = engine._start_advice(64, 960)
    assert "fewer --workers" in advice and "--backend threads" in advice
    assert LocalEngine(backend="threads")._start_timeout(64 * cores) == 120.0


def _train_in_a_pool_worker(backend):
    """Train in this daemonic process (a Pool worker): the backend the run
    used, or the error's type and line."""
    import monsoon

    try:
        result = monsoon.train("exp", "sync", 2, steps=10, lr=0.05, progress=False,
                               backend=backend)
    except Exception as e:  # what a user of the Pool would get back
        return type(e).__name__, str(e)
    return "ok", result.summary["backend"]


def test_a_run_in_a_pool_worker_uses_threads_and_refuses_processes():
    """A multiprocessing.Pool worker is daemonic and may start no process:
    "auto" trains on threads there, and backend="processes" is refused in
    one line that says what to use (it failed with "daemonic processes are
    not allowed to have children", its data left in /dev/shm)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        auto, processes = pool.map(_train_in_a_pool_worker, ["auto", "processes"])
    assert auto == ("ok", "threads")
    kind, line = processes
    assert kind == "ConfigError" and "\n" not in line, processes
    assert "daemonic process" in line and "backend='threads'" in line, line


@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused_and_the_current_directory_is_left_alone(tmp_path,
                                                                         monkeypatch, out):
    """out="" was the current directory: train wrote its run there, over the
    user's own config.json and metrics.csv, and the command line's --out ""
    was taken for the default folder. Now train, compare and both commands
    refuse an empty (or blank) out in one line, and nothing there changes."""
    import contextlib
    import io

    import monsoon
    from monsoon.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text("mine")
    (tmp_path / "metrics.csv").write_text("mine")
    for call in (lambda: monsoon.train("exp", "serial", steps=5, progress=False, out=out),
                 lambda: monsoon.compare("exp", "serial,sync", 2, steps=5, out=out)):
        with pytest.raises(ConfigError, match="names no folder") as info:
            call()
        assert "\n" not in str(info.value)
    for command in ("train", "compare"):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main([command, "--quiet", "--steps", "5", "--out", out])
        refused(subprocess.CompletedProcess([], code, "", err.getvalue()), "names no folder",
                "--out runs/mine")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "metrics.csv"]
    assert {(tmp_path / n).read_text() for n in ("config.json", "metrics.csv")} == {"mine"}


@pytest.mark.parametrize("resume", ["", "  "])
def test_an_empty_resume_is_refused_and_the_earlier_run_is_left_alone(tmp_path, resume):
    """resume="" named no folder, so train took it for no --resume at all:
    a new run, the earlier run's results in its folder discarded. Now train,
    compare and the command line refuse an empty (or blank) resume in one
    line naming resume= (--resume), and the folder keeps what it held."""
    import monsoon

    out = tmp_path / "run"
    first = monsoon.train("exp", "serial", steps=5, progress=False, out=out, seed=1)
    kept = (out / "summary.json").read_text()
    for call in (lambda: monsoon.train("exp", "serial", steps=5, progress=False, out=out,
                                       resume=resume),
                 lambda: monsoon.compare("exp", "serial", steps=5, out=tmp_path / "c",
                                         resume=resume)):
        with pytest.raises(ConfigError, match="fix resume=") as info:
            call()
        assert "\n" not in str(info.value) and "not empty" in str(info.value)
    refused(cli("--steps", "5", "--out", str(out), "--resume", resume)[0], "fix --resume")
    assert (out / "summary.json").read_text() == kept
    assert json.loads(kept)["seed"] == first.summary["seed"] == 1
    assert not (tmp_path / "c").exists()


def test_a_folder_monsoon_did_not_write_is_refused_where_a_run_would_write_over_its_files(
        tmp_path, monkeypatch):
    """--out . in a folder of the user's own config.json and data wrote the
    run over their config.json; --out w with the data saved as
    w/metrics.csv wrote the run's metrics over the data. Now a run (or a
    compare) that would write over a file in a folder monsoon did not
    write is refused in one line, nothing touched, and the problem's data
    file is never written over; a folder with other files only, and an
    earlier run's, take runs as before."""
    import monsoon

    monkeypatch.chdir(tmp_path)
    data = "1 1:0.5 2:1\n0 1:0.25\n1 2:2 3:1\n0 3:0.5\n"
    (tmp_path / "d.svm").write_text(data)
    (tmp_path / "config.json").write_text('{"mine": 1}')
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "metrics.csv").write_text(data)
    train = ("--problem", "libsvm:d.svm", "--strategy", "serial", "--steps", "5")
    refused(cli(*train, "--out", ".")[0], "--out . holds config.json, not written by monsoon")
    refused(cli("--problem", "libsvm:w/metrics.csv", "--strategy", "serial", "--steps", "5",
                "--out", "w")[0], "--out w: metrics.csv there is the problem's data file")
    with pytest.raises(ConfigError, match=r"^out='\.' holds config.json") as info:
        monsoon.train("libsvm:d.svm", "serial", steps=5, progress=False, out=".")
    assert "--out" not in str(info.value)
    with pytest.raises(ConfigError, match=r"^out='\.': its run folder sync holds "):
        (tmp_path / "sync").mkdir()
        (tmp_path / "sync" / "loss.png").write_text("mine")
        monsoon.compare("libsvm:d.svm", "serial,sync", 2, steps=5, out=".")
    assert (tmp_path / "config.json").read_text() == '{"mine": 1}'
    assert (tmp_path / "w" / "metrics.csv").read_text() == data
    assert (tmp_path / "sync" / "loss.png").read_text() == "mine"
    assert not list(tmp_path.rglob(".monsoon*"))
    # other files only, then the run's own folder again: as before
    (tmp_path / "config.json").unlink()
    for _ in range(2):
        assert cli(*train, "--out", ".")[0].returncode == 0
    assert json.loads((tmp_path / "config.json").read_text())["problem"] == "libsvm:d.svm"
    # the data file in a run folder, under a name the run writes: still refused
    (tmp_path / "metrics.csv").write_text(data)
    refused(cli("--problem", "libsvm:metrics.csv", "--strategy", "serial", "--steps", "5",
                "--out", ".")[0], "metrics.csv there is the problem's data file")
    assert (tmp_path / "metrics.csv").read_text() == data


def test_ranks_that_share_a_run_folder_check_it_at_once(tmp_path):
    """Every torchrun rank checks --out before it starts (on one machine or a
    shared file system, the same folder): one rank's probe is not another's
    to remove (a shared probe name failed node b's rank in the lost-node test)."""
    from concurrent.futures import ThreadPoolExecutor

    from monsoon.api import check_writable

    def check_many(_):
        for _ in range(300):
            check_writable(tmp_path / "run")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(check_many, range(4)))
    assert list((tmp_path / "run").iterdir()) == []


# -- options refused up front, in one line, with nothing written (review of a new user) --

def refused_before_anything(proc, out, *words):
    """``refused``, and no run folder (nor any file in it) was written."""
    line = refused(proc, *words)
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    return line


@pytest.mark.parametrize("command", ["train", "simulate"])
@pytest.mark.parametrize("seed", ["-1", "18446744073709551617", "4294967296"])
def test_a_seed_out_of_every_generators_range_is_refused(tmp_path, command, seed):
    """NumPy's default_rng refuses a negative seed and torch.manual_seed one
    past 2**64 - 1, each from inside a started run (a failed run folder, or
    a raw traceback); the seed's own check says the range every one takes."""
    import contextlib
    import io

    from monsoon.cli import main

    out, err = tmp_path / "run", io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([command, "--quiet", "--problem", "exp", "--steps", "2", "--seed", seed,
                     "--out", str(out)])
    proc = subprocess.CompletedProcess([], code, "", err.getvalue())
    line = refused_before_anything(proc, out, "seed must be in [0, 4294967295]", "--seed")
    assert f"got {seed}" in line


def test_the_largest_seed_runs():
    import monsoon

    run = monsoon.train("linear", "serial", steps=2, seed=2**32 - 1, progress=False)
    assert run.summary["seed"] == 2**32 - 1


@pytest.mark.parametrize("strategy", ["serial", "hogwild", "pipeline"])
def test_compress_is_refused_for_a_strategy_that_sends_no_messages(tmp_path, strategy):
    """serial and hogwild apply to shared parameters and pipeline's stages pass
    activations: --compress would run uncompressed (0 bytes sent) while the
    summary recorded topk:0.1. The strategies named are those whose ops
    carry a message (``messages.sends_messages``), not a list."""
    out = tmp_path / "run"
    proc, _ = cli("--problem", "exp", "--strategy", strategy, "--workers", "2", "--steps", "2",
                  "--compress", "topk:0.1", "--out", str(out))
    line = refused_before_anything(proc, out, "--compress topk:0.1",
                                   f"strategy {strategy} sends no messages to compress",
                                   "drop --compress")
    from monsoon.compressors.messages import sends_messages
    from monsoon.strategies import STRATEGIES

    takers = [n for n, c in STRATEGIES.all().items() if sends_messages(c)]
    assert line.endswith(f"use --strategy {', '.join(takers)}")
    assert {"sync", "async", "ssp", "local-sgd", "easgd"} <= set(takers)
    assert not {"serial", "hogwild", "pipeline"} & set(takers)


def test_compare_compresses_only_the_strategies_that_send_messages(tmp_path):
    import monsoon

    c = monsoon.compare("linear", "serial,sync", 2, out=tmp_path / "c", steps=4,
                        compress="topk:0.5", progress=False, backend="threads")
    assert c.results["sync"].summary["compress"] == "topk:0.5"
    assert c.results["serial"].summary["compress"] == "none"
    with pytest.raises(ConfigError, match="strategy serial sends no messages to compress"):
        monsoon.compare("linear", "serial,hogwild", 2, out=tmp_path / "d", steps=4,
                        compress="topk:0.5")
    with pytest.raises(ConfigError, match="strategy hogwild sends no messages to compress"):
        monsoon.compare("linear", "sync,hogwild", 2, out=tmp_path / "e", steps=4,
                        compress="hogwild=sign")
    assert not (tmp_path / "d").exists() and not (tmp_path / "e").exists()


NO_FEEDBACK_FIX = ("--no-error-feedback applies to compressed runs only; add --compress "
                   "(e.g. --compress topk:0.01), or drop --no-error-feedback")
# from Python the line names the keywords (it named the flags)
NO_FEEDBACK_FIX_API = ('no_error_feedback= applies to compressed runs only; add compress= (e.g. '
                       'compress="topk:0.01"), or drop no_error_feedback=')


@pytest.mark.parametrize("command", ["train", "simulate"])
def test_no_error_feedback_without_compress_is_refused(tmp_path, command, monkeypatch):
    """--no-error-feedback only changes how compressed messages are sent:
    alone, it ran uncompressed and config.json recorded a setting that did
    nothing. Refused in one line that names the fix, with nothing written
    (neither --out nor the default run folder under the working directory)."""
    import contextlib
    import io

    from monsoon.cli import main

    monkeypatch.chdir(tmp_path)
    out, err = tmp_path / "run", io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([command, "--quiet", "--problem", "exp", "--strategy", "sync", "--workers",
                     "2", "--steps", "2", "--no-error-feedback", "--out", str(out)])
    proc = subprocess.CompletedProcess([], code, "", err.getvalue())
    line = refused_before_anything(proc, out, NO_FEEDBACK_FIX)
    assert line == f"monsoon: error: {NO_FEEDBACK_FIX}"
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        code = main([command, "--quiet", "--problem", "exp", "--steps", "2",
                     "--no-error-feedback"])  # the default folder, runs/exp-serial
    assert code == 2 and list(tmp_path.iterdir()) == []


def test_no_error_feedback_without_compress_is_refused_by_the_api(tmp_path):
    import monsoon

    for run in (lambda: monsoon.train("exp", "sync", 2, steps=2, no_error_feedback=True,
                                      out=tmp_path / "t"),
                lambda: monsoon.compare("exp", "serial,sync", 2, steps=2, out=tmp_path / "c",
                                        no_error_feedback=True),
                lambda: monsoon.compare("exp", "serial,sync", 2, steps=2, out=tmp_path / "n",
                                        compress="sync=none", no_error_feedback=True)):
        with pytest.raises(ConfigError) as info:
            run()
        assert str(info.value) == NO_FEEDBACK_FIX_API
    assert list(tmp_path.iterdir()) == []
    # with a compressor it is taken, by the strategies that send messages
    c = monsoon.compare("linear", "serial,sync", 2, out=tmp_path / "ok", steps=4,
                        compress="topk:0.5", no_error_feedback=True, progress=False,
                        backend="threads")
    assert c.results["sync"].summary["error_feedback"] is False
    assert c.results["serial"].summary["compress"] == "none"


@pytest.mark.parametrize("spec,message", [
    ("bogus", "compress must be one of none, topk:FRACTION, randk:FRACTION, qsgd:LEVELS, "
              "sign, powersgd:RANK"),
    ("topk:2", "compress must be topk:FRACTION with a fraction in (0, 1], e.g. topk:0.01, "
               "got 'topk:2'; fix --compress"),
    ("sign:3", "compress must be just sign (sign takes no argument), got 'sign:3'; "
               "fix --compress"),
])
def test_a_bad_compressor_reads_as_one_sentence(tmp_path, spec, message):
    out = tmp_path / "run"
    proc, _ = cli("--strategy", "sync", "--steps", "2", "--compress", spec, "--out", str(out))
    line = refused_before_anything(proc, out, message)
    assert "must be unknown" not in line and "must be topk needs" not in line


@pytest.mark.parametrize("args,message", [
    (["--steps", "3", "--epochs", "2"], "argument --epochs: not allowed with argument --steps"),
    (["--epochs", "0.5"], "argument --epochs: invalid int value: '0.5'"),
    # refused by the command's own parser, whose help lists its flags (the
    # top parser's line said "monsoon: error: ...; see monsoon --help")
    (["--n-pushes", "4"], "unrecognized arguments: --n-pushes 4"),
])
def test_argparse_refusals_are_one_line_not_the_usage(tmp_path, args, message):
    """argparse's own refusals printed the whole usage (38 lines) before."""
    out = tmp_path / "run"
    proc, _ = cli(*args, "--out", str(out))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"monsoon train: error: {message}; see monsoon train --help"]
    assert not out.exists()


@pytest.mark.parametrize("problem,message", [
    ("rcv1-like:rows=0", "rcv1-like's rows must be a whole number of at least 1, got 0; "
                         "fix --problem rcv1-like:rows=N"),
    ("rcv1-like:noise=2", "rcv1-like's noise must be in [0, 1], got 2"),
    ("rcv1-like:features=2.5", "rcv1-like's features must be a whole number, got 2.5"),
    ("mf-synthetic:rank=0", "mf-synthetic's rank must be a whole number of at least 1"),
    ("mf-synthetic:seed=-1", "mf-synthetic's seed must be in [0, 4294967295]"),
])
def test_a_generator_parameter_out_of_range_is_refused(tmp_path, problem, message, recwarn):
    """rows=0 warned twice (NumPy's empty mean) then said "use at most 0
    workers"."""
    out = tmp_path / "run"
    proc, _ = cli("--problem", problem, "--steps", "2", "--out", str(out))
    refused_before_anything(proc, out, message)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("kind", ["libsvm", "ratings"])
def test_a_data_file_that_is_a_directory_is_called_one(tmp_path, kind):
    out = tmp_path / "run"
    proc, _ = cli("--problem", f"{kind}:{tmp_path}", "--steps", "2", "--out", str(out))
    refused_before_anything(proc, out, f"{tmp_path} is a directory; give the data file in it")


def test_a_model_that_does_not_fit_its_data_is_refused_when_built():
    """It failed inside a worker, after the run had started (RunFailed, "mat1
    and mat2 shapes cannot be multiplied (8x7 and 5x1)")."""
    from monsoon.problems.torch_problem import TorchProblem

    X, y = torch.randn(64, 7), torch.randn(64, 1)
    with pytest.raises(ConfigError) as info:
        TorchProblem(torch.nn.Linear(5, 1), torch.nn.MSELoss(), X, y)
    line = str(info.value)
    assert "\n" not in line and "(2, 7)" in line and "2x7 and 5x1" in line
    assert "rows of shape (7,)" in line
    with pytest.raises(ConfigError, match=r"loss_fn does not take the module's output of "
                                          r"shape \(2, 3\) with targets y of shape \(2, 1\)"):
        TorchProblem(torch.nn.Linear(7, 3), torch.nn.CrossEntropyLoss(), X, y)
    with pytest.raises(ConfigError, match="loss_fn must return one number"):
        TorchProblem(torch.nn.Linear(7, 1), torch.nn.MSELoss(reduction="none"), X, y)
    # one number, but N times the mean: it trained with steps N times too large
    with pytest.raises(ConfigError, match="the mean over the batch .* its reduction is 'sum'"):
        TorchProblem(torch.nn.Linear(7, 1), torch.nn.MSELoss(reduction="sum"), X, y)
    TorchProblem(torch.nn.Linear(7, 1), torch.nn.KLDivLoss(reduction="batchmean"), X, y)
    with pytest.raises(ConfigError, match="the validation set's X"):
        TorchProblem(torch.nn.Linear(7, 1), torch.nn.MSELoss(), X, y,
                     val=(torch.randn(8, 5), torch.randn(8, 1)))


def test_the_fit_probe_leaves_the_model_as_it_was():
    """The probe runs in eval mode under no_grad: BatchNorm's statistics and
    the module's mode are untouched."""
    from monsoon.problems.torch_problem import TorchProblem

    module = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4),
                                 torch.nn.Linear(4, 1))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    problem = TorchProblem(module, torch.nn.MSELoss(), torch.randn(64, 5), torch.randn(64, 1))
    assert problem.module.training
    for k, v in problem.module.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("problem,strategy,engine", [
    ("linear", "serial", "local"), ("rcv1-like:rows=200,features=50", "serial", "local"),
    ("logistic", "async", "sim"), ("exp", "pipeline", "local")])
@pytest.mark.slow
def test_a_diverging_run_says_so_once_without_numpy_warnings(tmp_path, problem, strategy,
                                                              engine):
    """NumPy's RuntimeWarnings (overflow in matmul, invalid value in
    logaddexp, in reduce) leaked to stderr from the workers, the loss and the
    finiteness checks; the run's own line says it diverged."""
    cmd = [sys.executable, "-m", "monsoon", "train", "--quiet", "--problem", problem,
           "--strategy", strategy, "--workers", "1" if strategy == "serial" else "2",
           "--engine", engine, "--lr", "1e30",
           "--epochs", "3", "--evals", "10", "--out", str(tmp_path / "run")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "RuntimeWarning" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ("diverged" in lines[0] or "did not converge" in lines[0]), \
        proc.stderr


@pytest.mark.parametrize("strategy", ["async", "hogwild", "easgd"])
def test_a_batch_larger_than_a_workers_part_is_refused_and_a_default_one_fits(tmp_path,
                                                                            strategy):
    """Workers that draw from their own part of the data (shards, epoch
    slices) cannot take a batch larger than it: asked for, it is refused in
    one line naming the part; by default the batch is cut to it, and the
    summary says what ran."""
    proc, _ = cli("--problem", "parabola", "--strategy", strategy, "--workers", "4",
                  "--batch-size", "50", "--steps", "8", "--out", str(tmp_path / "asked"))
    refused(proc, "batch size 50", "own 12 of the 50 examples", "--batch-size 12")
    assert not (tmp_path / "asked").exists()
    import json

    proc, _ = cli("--problem", "parabola", "--strategy", strategy, "--workers", "4",
                  "--steps", "8", "--out", str(tmp_path / "default"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "default" / "summary.json").read_text())
    assert summary["batch_size"] <= 12

"""Checks before any worker starts: bad data and a bad run folder are refused
in one line (exit 2, no traceback, nothing started); too many worker
processes get advice up front and a start-up timeout to match."""
import os
import subprocess
import time

import numpy as np
import pytest
import torch

from monsoon.errors import ConfigError


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

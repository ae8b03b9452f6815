"""What a run leaves behind, and the command line a user meets first."""
import csv
import json
import re
import statistics
import subprocess
import sys

import numpy as np
import pytest

import monsoon

SUMMARY_FIELDS = {"problem", "strategy", "engine", "rule", "workers", "seed", "final_loss",
                  "wall_time_s", "startup_s", "updates", "examples", "examples_per_s", "epochs",
                  "staleness", "dropped_updates", "failed_workers", "time_to_target_s"}


def run_cli(*args):
    """``monsoon ARGS`` in this process: its exit code, stdout and stderr
    (what a user's shell would show; a separate process only costs the imports)."""
    import contextlib
    import io

    from monsoon.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.mark.png
def test_run_folder_has_the_contract_files(tmp_path):
    result = monsoon.train("exp", "async", 2, epochs=3, target_loss=10.0, out=tmp_path / "r")
    folder = tmp_path / "r"
    assert result.run_dir == folder
    summary = json.loads((folder / "summary.json").read_text())
    assert SUMMARY_FIELDS <= set(summary)
    assert set(summary["staleness"]) == {"mean", "p50", "p99", "max"}
    assert summary["final_loss"] == result.summary["final_loss"]
    assert summary["workers"] == 2 and summary["strategy"] == "async"
    assert summary["time_to_target_s"] is not None  # the initial loss is below 10
    with open(folder / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert {"time_s", "updates", "examples", "epoch", "loss"} <= set(rows[0])
    assert len(rows) >= 2 and float(rows[-1]["loss"]) == pytest.approx(summary["final_loss"])
    # the loss is below 10 from the start: the run stops at its first checked row
    assert int(rows[-1]["examples"]) == summary["examples"] <= 3 * 256
    assert summary["status"] == "reached target"
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times)
    config = json.loads((folder / "config.json").read_text())
    assert config["strategy"] == "async" and config["workers"] == 2 and config["rule"] == "sgd"
    assert (folder / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(folder.glob("*.tmp"))


def test_history_and_final_loss_use_the_same_objective():
    result = monsoon.train("digits", "serial", epochs=1)
    assert result.history[0]["loss"] == pytest.approx(
        result.problem.loss(result.problem.initial_params(0)))
    assert result.history[-1]["loss"] == result.summary["final_loss"]
    assert result.summary["final_loss"] == pytest.approx(result.problem.loss(result.params))


@pytest.mark.png
def test_compare_writes_report_plot_and_one_folder_per_strategy(tmp_path):
    comparison = monsoon.compare("exp", "serial,sync,hogwild", workers=2, out=tmp_path,
                                 epochs=2, target_loss=1.0, backend="threads")
    for s in ("serial", "sync", "hogwild"):
        assert (tmp_path / s / "summary.json").exists()
    with open(tmp_path / "comparison.csv") as f:
        rows = {r["strategy"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"serial", "sync", "hogwild"}
    assert float(rows["serial"]["speedup_vs_serial"]) == pytest.approx(1.0)
    assert rows["serial"]["workers"] == "1" and rows["sync"]["workers"] == "2"
    report = (tmp_path / "report.md").read_text()
    assert "| sync | 2 |" in report and "comparison.png" in report
    assert (tmp_path / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    assert comparison.results["sync"].summary["strategy"] == "sync"


def test_compare_with_repeats_reports_median_speeds_and_their_ranges(tmp_path):
    comparison = monsoon.compare("exp", "serial,hogwild", workers=2, out=tmp_path, epochs=2,
                                 repeats=np.int64(3), backend="threads")
    folders = {s: [tmp_path / s, tmp_path / "repeats" / f"{s}-2", tmp_path / "repeats" / f"{s}-3"]
               for s in ("serial", "hogwild")}
    speeds = {s: [json.loads((f / "summary.json").read_text())["examples_per_s"] for f in fs]
              for s, fs in folders.items()}
    with open(tmp_path / "comparison.csv") as f:
        rows = {r["strategy"]: r for r in csv.DictReader(f)}
    for s, v in speeds.items():
        assert rows[s]["repeats"] == "3"
        assert float(rows[s]["examples_per_s"]) == pytest.approx(statistics.median(v))
        assert float(rows[s]["examples_per_s_min"]) == pytest.approx(min(v))
        assert float(rows[s]["examples_per_s_max"]) == pytest.approx(max(v))
    ratios = [h / s for h, s in zip(speeds["hogwild"], speeds["serial"])]  # turn by turn
    assert float(rows["hogwild"]["speedup_vs_serial"]) == pytest.approx(statistics.median(ratios))
    assert float(rows["hogwild"]["speedup_min"]) == pytest.approx(min(ratios))
    assert float(rows["hogwild"]["speedup_max"]) == pytest.approx(max(ratios))
    assert float(rows["serial"]["speedup_min"]) == float(rows["serial"]["speedup_max"]) == 1.0
    # the first turn's folder is the strategy's own; its curves are the ones plotted
    assert comparison.results["hogwild"].run_dir == tmp_path / "hogwild"
    report = (tmp_path / "report.md").read_text()
    assert "medians over 3 turns" in report
    assert f"({float(rows['hogwild']['speedup_min']):.3g}–" in report


def _summary(strategy, examples_per_s):
    return {"strategy": strategy, "workers": 1 if strategy == "serial" else 2,
            "final_loss": 0.5, "wall_time_s": 1.0, "startup_s": 0.0, "examples": 1000,
            "examples_per_s": examples_per_s, "updates": 100,
            "staleness": {"mean": 0.0, "max": 0}, "dropped_updates": 0, "failed_workers": [],
            "time_to_target_s": None}  # a local run: no simulated_time_s


def test_the_report_calls_a_speedup_a_tie_only_when_its_range_holds_one():
    from monsoon.record.report import comparison_rows, explain

    serial = [_summary("serial", 100.0)] * 3
    rows = comparison_rows([serial, [_summary("sync", v) for v in (90.0, 105.0, 95.0)],
                            [_summary("async", v) for v in (80.0, 85.0, 90.0)]])
    text = "\n".join(explain(rows))
    assert "- sync: as fast as serial within the range of 3 turns" in text
    assert "- async ran slower than serial" in text
    single = "\n".join(explain(comparison_rows([serial[:1], [_summary("sync", 70.0)]])))
    assert "sync ran slower than serial" in single and "--repeats 3" in single
    # no advice to repeat where one run says enough: a long run, or simulated time
    long_run = dict(serial[0], wall_time_s=60.0)
    simulated = dict(serial[0], simulated_time_s=1.0)
    for base in (long_run, simulated):
        text = "\n".join(explain(comparison_rows([[base], [_summary("sync", 95.0)]])))
        assert "sync ran slower than serial" in text and "--repeats" not in text


def test_one_short_runs_speed_within_its_noise_of_serials_is_no_slowdown():
    """A real exp compare, one run each: hogwild at 0.992x serial on a 0.16 s
    run was "slower than serial" with a cause (coordination costs), beside
    the report's own note that such runs vary 20-30%. Within 20% of serial
    it is now neither faster nor slower by that run; past it, still slower."""
    from monsoon.record.report import comparison_rows, explain

    serial = dict(_summary("serial", 65670.0), wall_time_s=0.156, updates=640)
    rows = comparison_rows([[serial], [_summary("hogwild", 65130.0)],
                            [_summary("sync", 18290.0)]])
    text = "\n".join(explain(rows))
    assert "hogwild: within 20% of serial's speed" in text, text
    assert "- sync ran slower than serial." in text and "hogwild ran slower" not in text, text
    long_run = dict(serial, wall_time_s=60.0)  # a long run's speed is read as measured
    text = "\n".join(explain(comparison_rows([[long_run], [_summary("hogwild", 65130.0)]])))
    assert "- hogwild ran slower than serial." in text and "within 20%" not in text, text


def test_the_report_explains_a_simulated_slowdown_by_the_delay_model():
    """The docs' sim compare (64 workers, batch 256, --straggler-p 0.05) said
    "sync ran slower than serial. One serial update costs 1.47 ms here, too
    little work to share: coordinating workers (barriers, locks, contention
    for memory and cores)...": the sim has no locks or cores. A simulated
    run is now explained by its delay model, as its summary records it."""
    from monsoon.record.report import comparison_rows, explain

    delays = {"compute_s": 1e-3, "compute_sigma": 0.0, "straggler_p": 0.05,
              "straggler_factor": 10.0, "slow_fraction": 0.0, "latency_s": 2e-4,
              "bandwidth_Bps": 0.0, "service_s": 0.0, "stage_compute_s": None}
    sim = dict(simulated_time_s=0.147, wall_time_s=0.147, batch_size=256, delays=delays)
    rows = comparison_rows([[dict(_summary("serial", 100.0), **sim)],
                            [dict(_summary("sync", 68.0), workers=64, **sim)]])
    text = "\n".join(explain(rows))
    assert "- sync ran slower than serial in this simulation" in text
    assert "one serial update costs 1.47 ms of simulated time" in text
    for figure in ("whole batch of 256 examples takes 1 ms (--compute-s)",
                   "0.05 of steps are 10x slower (--straggler-p)", "all of 64 workers",
                   "96% of steps", "every message takes 200 us (--latency-s)"):
        assert figure in text, figure
    for word in ("locks", "cores", "barriers", "--service-s", "--bandwidth"):
        assert word not in text, word


def test_the_local_slowdown_names_no_threshold_below_the_cost_it_names():
    """A 1.22 ms serial update was "too little work to share", and the next
    sentence said parallel strategies "pay off when an update costs
    milliseconds": the threshold is now said against the cost named."""
    from monsoon.record.report import comparison_rows, explain

    serial = dict(_summary("serial", 100.0), wall_time_s=0.122)
    text = "\n".join(explain(comparison_rows([[serial], [_summary("sync", 70.0)]])))
    assert "One serial update costs 1.22 ms here, too little work to share" in text
    assert "pay off when an update costs many times that" in text
    assert "costs milliseconds" not in text


def test_the_report_says_when_a_speedup_over_serial_on_spark_is_its_jobs_saved():
    """On Spark, serial runs one Spark job a step and sync one barrier stage:
    a speedup beyond the workers is then the jobs saved, and the report
    says so; a speedup the workers can give, or one where serial ran no
    more jobs, gets no such line."""
    from monsoon.record.report import comparison_rows, explain

    serial = dict(_summary("serial", 100.0), spark_jobs=200)
    rows = comparison_rows([[serial], [dict(_summary("sync", 3870.0), spark_jobs=1)],
                            [dict(_summary("async", 150.0), spark_jobs=2)]])
    text = "\n".join(explain(rows))
    assert ("- sync (38.7x, 2 workers) outran serial by more than their workers can" in text
            and "serial ran 200 Spark jobs (one a step" in text and "and sync 1, so" in text)
    assert "async (" not in text  # 1.5x: within what two workers give
    for base in (_summary("serial", 100.0), dict(serial, spark_jobs=1)):
        assert "Spark jobs" not in "\n".join(explain(comparison_rows(
            [[base], [dict(_summary("sync", 3870.0), spark_jobs=1)]])))


def test_the_report_reads_staleness_from_the_figures_not_the_strategys_name():
    """Every strategy whose updates came stale gets the staleness reading
    (ssp, a plug-in's), and one whose updates never did gets none."""
    from monsoon.record.report import comparison_rows, explain

    stale = {"mean": 1.5, "max": 4}
    rows = comparison_rows([[_summary("serial", 100.0)],
                            [dict(_summary("ssp", 150.0), staleness=stale)],
                            [dict(_summary("my-async", 150.0), staleness=stale)],
                            [_summary("async", 150.0)]])  # no update came stale
    text = "\n".join(explain(rows))
    for name in ("ssp", "my-async"):
        assert f"- {name}: updates were computed on parameters 1.5 updates old" in text
    assert "- async: updates were" not in text


def test_the_report_names_each_strategys_rule_where_they_differ():
    """Spark's linear data: sync's default is lbfgs, async's AdaGrad; the
    report and comparison.csv say which rule each row ran."""
    from monsoon.record.report import comparison_rows, report_markdown

    mixed = comparison_rows([[dict(_summary("sync", 90.0), rule="lbfgs")],
                             [dict(_summary("async", 80.0), rule="adagrad")]])
    assert [r["rule"] for r in mixed] == ["lbfgs", "adagrad"]
    text = report_markdown("spark:clicks.libsvm", mixed, None)
    assert "| sync (lbfgs) |" in text and "| async (adagrad) |" in text
    same = comparison_rows([[dict(_summary("sync", 90.0), rule="sgd")],
                            [dict(_summary("async", 80.0), rule="sgd")]])
    assert "| sync |" in report_markdown("exp", same, None)


def test_the_report_says_which_runs_stopped_before_their_budget():
    """A run that stopped at its target or by --tol is named with its reason,
    and the report no longer says every strategy processed the same budget."""
    from monsoon.record.report import comparison_rows, report_markdown

    reason = "converged: the loss fell by less than 0.001 of itself over the last epoch"
    rows = comparison_rows([[dict(_summary("sync", 90.0), stopped_at_target="reached the "
                                  "target loss 0.5 (loss 0.49 after 9 updates)")],
                            [dict(_summary("async", 80.0), stopped_converged=reason)]])
    text = report_markdown("spark:clicks.libsvm", rows, 0.5)
    assert "- sync stopped before its budget: reached the target loss 0.5" in text
    assert f"- async stopped before its budget: {reason}." in text
    assert "processed the same budget" not in text
    whole = comparison_rows([[_summary("sync", 90.0)], [_summary("async", 80.0)]])
    text = report_markdown("exp", whole, None)
    assert "Every strategy processed the same budget" in text and "stopped before" not in text


@pytest.mark.parametrize("repeats", [0, -1, 1.5, True])
def test_compare_refuses_a_bad_number_of_repeats(tmp_path, repeats):
    with pytest.raises(monsoon.MonsoonError, match="repeats must be a whole number >= 1"):
        monsoon.compare("exp", "serial,sync", workers=2, out=tmp_path, epochs=1,
                        repeats=repeats)
    assert not (tmp_path / "serial").exists()  # refused before any run


def test_cli_train_writes_run_folder(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("train", "--problem", "parabola", "--strategy", "sync", "--workers", "2",
                   "--lr", "0.01", "--steps", "300", "--seed", "0", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "final_loss" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "sync" and summary["workers"] == 2 and summary["updates"] == 300


@pytest.mark.parametrize("args,message", [
    (["--problem", "nope"], "unknown problem 'nope'; choose one of: digits, exp, linear, logistic, parabola"),
    (["--strategy", "nope"], "choose one of: serial, sync, async, hogwild, local-sgd, easgd"),
    (["--rule", "nope"], "choose one of: adagrad, adam, adarevision, dcasgd, dcasgd-a, lbfgs, momentum"),
    (["--strategy", "sync", "--workers", "0"], "workers must be a whole number of at least 1"),
    (["--lr", "0"], "learning rate must be positive"),
    (["--lr", "-0.5"], "learning rate must be positive"),
    (["--problem", "parabola", "--strategy", "async", "--workers", "51"],
     "51 workers but only 50 training examples"),
    (["--engine", "nope"], "unknown engine 'nope'"),
    # as monsoon.train refuses it (it ran 1 worker, silently); not given, serial runs 1
    (["--strategy", "serial", "--workers", "3"],
     "serial runs exactly 1 worker, not 3; drop --workers or pick another strategy"),
])
def test_cli_refuses_bad_input_in_one_line(tmp_path, args, message):
    proc = run_cli("train", *args, "--out", str(tmp_path / "x"))
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()  # refused before any work started


def test_simulate_refuses_another_engine_in_one_line(tmp_path):
    """``monsoon simulate --engine local`` ran on the sim, saying nothing."""
    proc = run_cli("simulate", "--engine", "local", "--problem", "parabola", "--steps", "10",
                   "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("monsoon: error: monsoon simulate runs on the sim engine, "
                                   "not --engine local: drop --engine, or run "
                                   "'monsoon train --engine local'")
    assert not (tmp_path / "x").exists()


def test_a_refused_resume_leaves_no_folder_it_made(tmp_path):
    """``--resume`` of a folder with no checkpoint is refused in one line,
    and the new ``--out`` (and a parent it made) is not left behind empty."""
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    out = tmp_path / "new" / "run"
    proc = run_cli("train", "--problem", "parabola", "--strategy", "sync", "--workers", "2",
                   "--steps", "20", "--out", str(out), "--resume", str(tmp_path / "empty"))
    assert proc.returncode == 2 and "nothing to resume from" in proc.stderr, proc.stderr
    assert not (tmp_path / "new").exists()


def test_a_sim_run_that_takes_no_time_prints_its_line(tmp_path):
    """``--compute-s 0``: no simulated time, no examples/s (None), and the
    line printed without a traceback (it formatted None)."""
    out = tmp_path / "run"
    proc = run_cli("train", "--engine", "sim", "--problem", "parabola", "--strategy", "hogwild",
                   "--workers", "2", "--steps", "20", "--compute-s", "0", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "- examples/s" in proc.stdout
    assert json.loads((out / "summary.json").read_text())["examples_per_s"] is None


@pytest.mark.parametrize("where", ["dd/d.svm", "{tmp}/dd/d.svm"])
def test_a_problem_naming_a_file_gets_one_default_run_folder(tmp_path, monkeypatch, where):
    """It was runs/libsvm_dd/d.svm-serial, and for an absolute path
    runs/libsvm_/tmp/.../d.svm-serial: folders nested along the path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "d.svm").write_text("".join(f"{1 - 2 * (i % 2):+d} {i % 5 + 1}:0.5\n"
                                                   for i in range(20)))
    proc = run_cli("train", "--problem", "libsvm:" + where.format(tmp=tmp_path), "--epochs", "1",
                   "--evals", "2", "--quiet")
    assert proc.returncode == 0, proc.stderr
    (folder,) = (tmp_path / "runs").iterdir()
    assert (folder / "summary.json").is_file()
    assert re.fullmatch(r"libsvm_d\.svm-[0-9a-f]{6}-serial", folder.name), folder.name


def test_default_run_folders_of_two_files_never_meet():
    """Flattening the path alone gave dd/d.svm and dd_d.svm, or /data/d.svm
    and data/d.svm, one folder: the second run replaced the first's."""
    from monsoon.cli import _folder

    specs = ["libsvm:dd/d.svm", "libsvm:dd_d.svm", "libsvm:/data/d.svm", "libsvm:data/d.svm",
             "ratings:a/b.csv", "ratings:a_b.csv", "exp", "libsvm:d.svm"]
    names = [_folder(spec) for spec in specs]
    assert len(set(names)) == len(names) and not any("/" in n or ":" in n for n in names)
    assert names[-2:] == ["exp", "libsvm_d.svm"]


def test_api_refuses_unknown_options():
    with pytest.raises(monsoon.ConfigError, match="unknown option"):
        monsoon.train("exp", "serial", learning_rate=0.1)


@pytest.mark.parametrize("given,meant", [("quiet", "progress=False"), ("learning_rate", "lr"),
                                         ("beta", "hogwild_beta"), ("epoch", "epochs"),
                                         ("num_workers", "workers")])
def test_an_unknown_option_names_what_it_may_have_meant(given, meant):
    """One short line with the likely spelling (the command line's --quiet
    is progress=False here), not the list of every option; the list where
    nothing is close."""
    with pytest.raises(monsoon.ConfigError) as info:
        monsoon.train("exp", "serial", **{given: 1})
    assert f"{given} (did you mean {meant}?)" in str(info.value), info.value
    assert len(str(info.value)) < 120, info.value
    with pytest.raises(monsoon.ConfigError, match="valid options: address, "):
        monsoon.train("exp", "serial", zzz=1)


@pytest.mark.slow
def test_script_without_main_guard_can_use_processes(tmp_path):
    """Spawned workers must not re-run a user's unguarded script."""
    script = tmp_path / "train_exp.py"
    script.write_text("import monsoon\n"
                      "r = monsoon.train('exp', 'sync', 2, epochs=1)\n"
                      "print('loss', r.summary['final_loss'])\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("loss") == 1


def test_the_report_says_sync_overlays_serial_only_where_both_took_the_same_steps():
    """Serial's compiled per-example loop (sparse problems) and a batch size
    of its own are other steps than sync's: no overlay claimed there."""
    from monsoon.record.report import comparison_rows, explain

    claim = "sync computes the same gradient per step as serial"
    serial, sync = _summary("serial", 100.0), _summary("sync", 90.0)
    for base, step in [({}, {}), ({"batch_size": 64}, {"batch_size": 64})]:
        rows = comparison_rows([[dict(serial, **base)], [dict(sync, **step)]])
        assert claim in "\n".join(explain(rows))
    for base in ({"batch_size": 1, "per_example_loop": True}, {"batch_size": 32}):
        rows = comparison_rows([[dict(serial, **base)], [dict(sync, batch_size=64)]])
        assert claim not in "\n".join(explain(rows))


def test_the_report_claims_sync_overlays_serial_only_where_its_model_computes_alike():
    """A model with buffers (BatchNorm: each worker's batch statistics) or
    random draws (Dropout: each worker's masks) gives sync other gradients
    than serial's on the same batches (serial 0.2451, sync 0.2532), which
    the report called an overlay differing only in speed. The claim now
    holds where the model declares neither, or the final losses agree to
    the digits shown; otherwise the report says why they differ."""
    from monsoon.record.report import comparison_rows, explain

    claim = "sync computes the same gradient per step as serial"
    for model in ({"buffers": 3, "random_draws": True}, {"random_draws": True}):
        serial = dict(_summary("serial", 100.0), final_loss=0.2451, **model)
        sync = dict(_summary("sync", 90.0), final_loss=0.2532, **model)
        text = "\n".join(explain(comparison_rows([[serial], [sync]])))
        assert claim not in text and "overlays" not in text, text
        assert "its final loss (0.2532) is not serial's (0.2451)" in text, text
        assert ("BatchNorm" in text) == ("buffers" in model) and "Dropout" in text, text
        same = dict(sync, final_loss=0.24510004)  # equal to the digits shown
        text = "\n".join(explain(comparison_rows([[serial], [same]])))
        assert claim not in text and "agrees with serial's to the digits shown" in text, text
    plain = dict(_summary("sync", 90.0), final_loss=0.51)  # declares neither
    assert claim in "\n".join(explain(comparison_rows([[_summary("serial", 100.0)], [plain]])))


def test_a_dropout_models_sync_is_never_said_to_compute_serials_gradients():
    """A Dropout model's sync and serial runs whose final losses agree to the
    four digits the table shows (serial 1.0793427, sync 1.0789366: both
    "1.079", a real compare of a user's Linear-ReLU-Dropout-Linear) got
    "sync computes the same gradient per step as serial ... overlays
    serial's", false where each worker draws its own masks. The report now
    says the losses agree and why the gradients may still differ."""
    from monsoon.record.report import comparison_rows, explain

    serial = dict(_summary("serial", 100.0), final_loss=1.0793427228927612, random_draws=True)
    sync = dict(_summary("sync", 90.0), final_loss=1.0789365768432617, random_draws=True)
    text = "\n".join(explain(comparison_rows([[serial], [sync]])))
    assert "same gradient" not in text and "overlays serial's" not in text, text
    assert "agrees with serial's to the digits shown (1.079)" in text, text
    assert "Dropout" in text and "own masks" in text, text


def test_a_summary_declares_the_models_buffers_and_random_draws():
    """What the report reads: a torch model's buffers, and its random draws
    where its training passes draw any (Dropout); none of either for a
    NumPy problem. random_draws was true for every torch model (each
    problem seeds its workers' draws), so the report gave Dropout as a
    reason sync's curve left serial's for a model with none."""
    from test_resume_matrix import _torch_problem

    opts = dict(steps=2, batch_size=16, evals=0, progress=False)
    summary = monsoon.train(_torch_problem(batchnorm=True), "serial", **opts).summary
    assert summary["buffers"] == 3 and "random_draws" not in summary
    summary = monsoon.train(_torch_problem(batchnorm=True, dropout=True), "serial",
                            **opts).summary
    assert summary["buffers"] == 3 and summary["random_draws"] is True
    summary = monsoon.train("exp", "serial", **opts).summary
    assert "buffers" not in summary and "random_draws" not in summary
    summary = monsoon.train("linear", "serial", **opts).summary
    assert "buffers" not in summary and "random_draws" not in summary


def test_the_report_claims_no_overlay_where_backup_workers_left_gradients_out():
    """sync with backup workers leaves each step's late gradients out: its
    steps are not serial's, and the report must not say they are."""
    from monsoon.record.report import comparison_rows, explain

    claim = "sync computes the same gradient per step as serial"
    serial = _summary("serial", 100.0)
    backup = dict(_summary("sync", 90.0), backup_workers=1, late_gradients=99,
                  final_loss=0.6)
    assert claim not in "\n".join(explain(comparison_rows([[serial], [backup]])))
    for other in ({"late_gradients": 3}, {"dropped_updates": 2}, {"updates": 90},
                  {"stopped": "diverged: the loss became nan"}):
        rows = comparison_rows([[serial], [dict(_summary("sync", 90.0), **other)]])
        assert claim not in "\n".join(explain(rows)), other


def test_the_report_of_diverged_runs_names_no_winner_and_no_harmless_staleness():
    """Every run stopped diverged (inf/NaN losses): nothing is "lowest",
    a NaN ratio never reads "did not hurt", each says it stopped and why,
    and the same-budget claim is not made."""
    from monsoon.record.report import comparison_rows, report_markdown

    why = "diverged: 103 updates had non-finite gradients and were dropped"
    runs = [[dict(_summary("serial", 100.0), final_loss=float("inf"), stopped=why,
                  status="diverged", examples=400)],
            [dict(_summary("sync", 90.0), final_loss=float("inf"), stopped=why,
                  status="diverged", examples=300)],
            [dict(_summary("async", 80.0), final_loss=float("nan"), stopped=why,
                  status="diverged", staleness={"mean": 0.8, "max": 11}, examples=350)]]
    text = report_markdown("exp", comparison_rows(runs), None)
    assert "Lowest final loss" not in text and "Highest throughput" not in text
    assert "No strategy ran to the end of its budget with a finite loss" in text
    assert "did not hurt" not in text and "nanx" not in text and "infx" not in text
    assert "ran slower than serial" not in text  # speeds of runs that stopped explain nothing
    for name in ("serial", "sync", "async"):
        assert f"**{name} stopped before its budget: {why}**" in text
    assert "processed the same budget" not in text
    # one finite run beside a diverged one: the finite one wins, the diverged one is named
    runs[1] = [_summary("sync", 90.0)]
    text = report_markdown("exp", comparison_rows(runs), None)
    assert "- Lowest final loss: **sync** (0.5)." in text
    assert "- Highest throughput: **sync**" in text


def test_final_losses_equal_to_the_digits_shown_are_a_tie_not_a_win():
    """A real exp compare: serial 0.0005406454, sync 0.0005406471, both
    "0.0005406" in the table, and the report crowned serial the lowest; a
    Dropout model's 1.0789 and 1.0793 (both "1.079") crowned sync. A
    difference the table does not show is a tie, naming both."""
    from monsoon.record.report import comparison_rows, report_markdown

    runs = [[dict(_summary("serial", 100.0), final_loss=0.0005406454438343644)],
            [dict(_summary("sync", 90.0), final_loss=0.00054064707364887)],
            [dict(_summary("async", 80.0), final_loss=0.000547825125977397)]]
    text = report_markdown("exp", comparison_rows(runs), None)
    assert ("- Lowest final loss: a tie to the digits shown, **serial**, **sync** "
            "(0.0005406;") in text, text
    assert "**async**" not in text.split("Lowest final loss")[1].split("\n")[0]
    runs[1] = [dict(_summary("sync", 90.0), final_loss=0.0004)]  # one lowest: as before
    text = report_markdown("exp", comparison_rows(runs), None)
    assert "- Lowest final loss: **sync** (0.0004)." in text, text


def test_a_strategy_slower_than_serial_is_said_to_pay_more_than_it_saves():
    """sync at a third of serial's speed (a real exp compare: 0.337x) was
    explained as coordination costing "about as much as it saves"; a run
    slower than serial paid more for coordinating than sharing saved."""
    from monsoon.record.report import comparison_rows, explain

    rows = comparison_rows([[dict(_summary("serial", 12582.0), wall_time_s=4.07,
                                  updates=3200)], [_summary("sync", 4133.0)]])
    text = "\n".join(explain(rows))
    assert "- sync ran slower than serial." in text, text
    assert "costs more than it saves" in text and "about as much as" not in text, text


def test_the_report_gives_a_tiny_serial_update_a_unit_that_shows_it():
    """Sparse serial's per-example loop: 200,000 updates in 0.04 s is 200 ns
    an update, not "0 us"."""
    from monsoon.record.report import comparison_rows, explain

    serial = dict(_summary("serial", 100.0), wall_time_s=0.04, updates=200_000,
                  per_example_loop=True, batch_size=1)
    text = "\n".join(explain(comparison_rows([[serial], [_summary("hogwild", 50.0)]])))
    assert "costs 200 ns here" in text and "0 us" not in text
    assert "one example" in text


def test_a_new_compare_clears_what_an_earlier_compare_wrote_and_nothing_else(tmp_path):
    """A 2-strategy compare over a 4-strategy one with repeats: the old
    strategies' folders, repeats/ and staleness.png go; a user's files stay
    (a folder that holds one is kept with it alone)."""
    monsoon.compare("exp", "serial,sync,async,hogwild", workers=2, out=tmp_path, epochs=2,
                    repeats=2, backend="threads")
    assert (tmp_path / "staleness.png").exists() and (tmp_path / "repeats" / "async-2").is_dir()
    (tmp_path / "mine.txt").write_text("keep")
    (tmp_path / "hogwild" / "notes.txt").write_text("keep")
    with pytest.raises(monsoon.ConfigError):  # refused: the earlier compare stays whole
        monsoon.compare("exp", "serial,sync", workers=2, out=tmp_path, epochs=2, lr=-1.0)
    assert (tmp_path / "report.md").exists() and (tmp_path / "async" / "summary.json").exists()
    monsoon.compare("exp", "serial,sync", workers=2, out=tmp_path, epochs=2, backend="threads")
    assert not (tmp_path / "async").exists() and not (tmp_path / "repeats").exists()
    assert not (tmp_path / "staleness.png").exists()
    assert [p.name for p in (tmp_path / "hogwild").iterdir()] == ["notes.txt"]
    assert (tmp_path / "mine.txt").read_text() == "keep"
    assert (tmp_path / "sync" / "summary.json").exists()
    with open(tmp_path / "comparison.csv") as f:
        assert [r["strategy"] for r in csv.DictReader(f)] == ["serial", "sync"]


def test_a_failed_strategy_is_reported_the_others_run_and_resume_carries_it_on(tmp_path):
    """sync fails (worker 1 raises): the compare still runs serial after it,
    writes report.md and comparison.csv with sync marked failed and its
    reason, then fails naming sync and the compare's own folder to resume;
    ``--resume OUT`` keeps serial's run and resumes sync from the
    checkpoint its failure named."""
    from faulty import FaultyProblem
    from monsoon.errors import RunFailed
    from monsoon.problems import make_problem

    out = tmp_path / "my cmp"  # a space: the call it names quotes the folder
    opts = dict(workers=2, epochs=5, seed=0, timeout=20, progress=False, checkpoint_every=10)
    faulty = FaultyProblem(make_problem("exp"), "raise", rank=1, after=40)  # of 80 steps
    faulty.defaults = faulty.inner.defaults  # it trains as exp does: serial's run is exp's
    with pytest.raises(RunFailed) as info:
        monsoon.compare(faulty, "sync,serial", out=out, **opts)
    message = str(info.value)
    assert message.startswith("sync failed: worker 1") and "injected failure" in message
    assert f"resume=\"{out}\" (the runs" in message and f"{out / 'sync'}\"" not in message
    assert "sync resumes from its checkpoint" in message
    assert json.loads((out / "serial" / "summary.json").read_text())["status"] == "finished"
    with open(out / "comparison.csv") as f:
        rows = {r["strategy"]: r for r in csv.DictReader(f)}
    assert rows["sync"]["status"] == "failed" and rows["serial"]["status"] == "finished"
    assert rows["sync"]["examples_per_s"] == ""  # a failed run's speed counts nowhere
    report = (out / "report.md").read_text()
    assert "| sync | 2 | — |" in report and "- **sync failed, after" in report
    assert "injected failure on worker 1" in report
    assert "Lowest final loss: **serial**" in report
    assert info.value.comparison.results["serial"].summary["status"] == "finished"
    serial = (out / "serial" / "summary.json").read_text()

    done = monsoon.compare("exp", "sync,serial", out=out, resume=str(out), **opts)
    assert (out / "serial" / "summary.json").read_text() == serial  # kept, not run again
    resumed = done.results["sync"].summary
    assert resumed["status"] == "finished" and resumed["resumed_from"]
    assert resumed["updates"] == 80
    assert "failed" not in (out / "report.md").read_text()


def test_the_report_counts_only_the_turns_that_ran_to_their_end():
    """An interrupted or failed turn counts in no median or range and is
    named; a failed run's row says why; a report whose only run was
    interrupted with a finite loss says it did not run to its end."""
    from monsoon.record.report import comparison_rows, report_markdown

    serial = [_summary("serial", 100.0)] * 3
    sync = [_summary("sync", 90.0), dict(_summary("sync", 10.0), status="interrupted"),
            _summary("sync", 110.0)]
    failed = {"strategy": "async", "workers": 2, "status": "failed", "final_loss": None,
              "updates": 4, "error": "worker 1 failed: RuntimeError: boom"}
    rows = comparison_rows([serial, sync, [failed]])
    assert rows[1]["examples_per_s"] == 100.0  # the median of 90 and 110, not of 10 too
    assert (rows[1]["examples_per_s_min"], rows[1]["examples_per_s_max"]) == (90.0, 110.0)
    assert (rows[1]["speedup_min"], rows[1]["speedup_max"]) == (0.9, 1.1)
    assert rows[2]["examples_per_s"] is None and rows[2]["staleness_mean"] is None
    text = report_markdown("exp", rows, None)
    assert "- **sync: turn 2 interrupted (of 3)**: its speeds are of the other 2." in text
    assert "- **async failed, after 4 updates**: worker 1 failed: RuntimeError: boom." in text
    assert "processed the same budget" not in text
    twice = comparison_rows([serial[:2], [failed, dict(failed, updates=2)]])
    assert "- **async: turn 1 failed, turn 2 failed (of 2)**: no turn ran to its end, so it " \
        "has no speed." in report_markdown("exp", twice, None)
    alone = comparison_rows([[dict(_summary("serial", 100.0), final_loss=0.6931,
                                   status="interrupted")]])
    text = report_markdown("exp", alone, None)
    assert "No strategy ran to the end of its budget with a finite loss" in text
    assert "**serial was interrupted before its budget, after 100 updates**" in text


def test_compare_resume_keeps_a_diverged_run_and_writes_the_same_report(tmp_path):
    """A diverged run's summary.json says "inf" (NaN: null): ``--resume``
    reads it back as the float it was, keeps the run, and writes the report
    the compare wrote, where it raised TypeError in the report."""
    from monsoon.record.run_folder import read_summary, to_json

    opts = dict(workers=2, lr=5.0, steps=400, out=tmp_path, backend="threads")
    monsoon.compare("exp", "serial,sync", **opts)
    assert json.loads((tmp_path / "serial" / "summary.json").read_text())["final_loss"] == "inf"
    report = (tmp_path / "report.md").read_text()
    kept = (tmp_path / "serial" / "summary.json").read_text()
    done = monsoon.compare("exp", "serial,sync", resume=str(tmp_path), **opts)
    assert (tmp_path / "serial" / "summary.json").read_text() == kept  # not run again
    assert done.results["serial"].summary["final_loss"] == float("inf")
    assert (tmp_path / "report.md").read_text() == report
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "summary.json").write_text(to_json(
        {"status": "diverged", "final_loss": float("nan"), "staleness": {"mean": float("-inf")},
         "checkpoint": None}))
    back = read_summary(tmp_path / "n")
    assert np.isnan(back["final_loss"]) and back["staleness"]["mean"] == float("-inf")
    assert back["checkpoint"] is None
    (tmp_path / "n" / "summary.json").write_text(to_json({"status": "failed", "final_loss": None}))
    assert read_summary(tmp_path / "n")["final_loss"] is None  # a failed run has none


def _unwritable(folder):
    """``folder`` made unwritable, also for root (chattr +i); the call that
    makes it writable again. Skips where neither works."""
    import os
    import shutil

    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("root, and chattr +i does not work here: no folder root cannot write")
    return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_compare_over_one_whose_run_folder_cannot_be_written_removes_nothing(tmp_path):
    """An earlier compare's sync folder cannot be written: the new compare
    is refused in one line naming it, before serial's folder (cleared
    first before) or anything else of the earlier compare is removed."""
    monsoon.compare("exp", "serial,sync", workers=2, out=tmp_path, steps=20, backend="threads")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    writable = _unwritable(tmp_path / "sync")
    try:
        proc = run_cli("compare", "--problem", "exp", "--strategies", "serial,sync",
                       "--steps", "20", "--out", str(tmp_path))
    finally:
        writable()
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"monsoon: error: cannot write the run folder {tmp_path / 'sync'}: ")
    assert line.endswith("; choose another --out")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_compare_resume_refuses_a_checkpoint_of_other_settings_before_any_run(tmp_path):
    """sync's run was interrupted with checkpoints at lr 0.05; ``--resume``
    at lr 0.02 is refused in one line naming the lr, before serial (ended
    under other settings) runs again: serial's folder and the report stay
    as they were."""
    opts = dict(workers=2, steps=40, checkpoint_every=10, backend="threads", progress=False)
    monsoon.compare("exp", "serial,sync", out=tmp_path, lr=0.05, **opts)
    summary = json.loads((tmp_path / "sync" / "summary.json").read_text())
    (tmp_path / "sync" / "summary.json").write_text(json.dumps(dict(summary,
                                                                    status="interrupted")))
    kept = {p: p.read_bytes() for p in (tmp_path / "serial" / "summary.json",
                                        tmp_path / "report.md")}
    with pytest.raises(monsoon.ConfigError) as info:
        monsoon.compare("exp", "serial,sync", out=tmp_path, lr=0.02, resume=str(tmp_path),
                        **opts)
    assert "is from another run: its lr is 0.05, this run's is 0.02" in str(info.value)
    assert "\n" not in str(info.value)
    assert {p: p.read_bytes() for p in kept} == kept


def test_compare_refuses_a_strategy_named_twice_in_compress(tmp_path):
    """``--compress sync=topk:0.1,sync=sign`` is refused in one line, as
    ``--strategies sync,sync`` is, before anything is written (the last
    spec was taken silently)."""
    proc = run_cli("compare", "--problem", "linear", "--strategies", "sync,async", "--compress",
                   "sync=topk:0.1,sync=sign", "--steps", "2", "--out", str(tmp_path / "c"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "monsoon: error: --compress names sync twice (sync=topk:0.1,sync=sign); give each "
        "strategy one spec, e.g. --compress sync=topk:0.01,async=sign"]
    assert not (tmp_path / "c").exists()


def test_the_command_that_carries_a_run_on_quotes_its_folder():
    """A stopped run's "run the same command with --resume OUT" pastes
    whole into a shell where OUT has spaces or quotes."""
    from monsoon.api import _resume_hint, check

    for out in ("runs/x", "my runs/x", "it's"):
        hint = _resume_hint(check("exp", "serial", 1, cli=True), out)
        assert hint.startswith("; to carry on, run the same command with --resume ")
        pasted = subprocess.run(["sh", "-c", "printf '%s|' " + hint.rpartition("--resume ")[2]],
                                capture_output=True, text=True).stdout
        assert pasted == out + "|"  # one word, the folder


def test_a_strategy_a_resume_left_out_is_cleared_by_the_next_compare(tmp_path):
    """serial,sync,hogwild, then ``--resume`` with serial,sync (comparison.csv
    then names those two): a later compare there still clears hogwild's
    folder, which the first compare wrote; a folder no compare wrote stays."""
    opts = dict(workers=2, steps=20, backend="threads", progress=False)
    monsoon.compare("exp", "serial,sync,hogwild", out=tmp_path, **opts)
    monsoon.compare("exp", "serial,sync", out=tmp_path, resume=str(tmp_path), **opts)
    with open(tmp_path / "comparison.csv") as f:
        assert [r["strategy"] for r in csv.DictReader(f)] == ["serial", "sync"]
    assert (tmp_path / "hogwild" / "summary.json").exists()
    monsoon.train("exp", "async", 2, steps=20, backend="threads", out=tmp_path / "async")
    monsoon.compare("exp", "serial", out=tmp_path, **opts)
    assert not (tmp_path / "hogwild").exists() and not (tmp_path / "sync").exists()
    assert (tmp_path / "async" / "summary.json").exists()  # a train of the user's own
    assert (tmp_path / "serial" / "summary.json").exists()


def test_the_report_without_serial_keeps_the_notes_that_do_not_need_it():
    """A compare of sync and async with repeats: the report still says its
    speeds are medians and how stale async's updates were (it said
    neither without a serial row), and nothing against serial; with
    serial, the throughput line says it is a median of examples/s and the
    medians note that a speedup is the median of each turn's ratio."""
    from monsoon.record.report import comparison_rows, explain, report_markdown

    sync = [_summary("sync", v) for v in (90.0, 110.0)]
    stale = {"mean": 0.8, "max": 11}
    async_ = [dict(_summary("async", v), staleness=stale) for v in (80.0, 120.0)]
    text = "\n".join(explain(comparison_rows([sync, async_])))
    assert "- Speeds are medians over 2 turns of every strategy" in text
    assert "- async: updates were computed on parameters 0.8 updates old on average (max " \
        "11)." in text
    assert "serial" not in text
    one = "\n".join(explain(comparison_rows([sync[:1], async_[:1]])))
    assert "Speeds come from one short run of each strategy" in one and "serial" not in one
    # hogwild's median speed is serial's times 1.1, its speedup the median of
    # its turns' ratios (1.1, 0.917, 0.875): both said, each for what it is
    serial = [_summary("serial", v) for v in (100.0, 120.0, 80.0)]
    hogwild = [_summary("hogwild", v) for v in (110.0, 110.0, 70.0)]
    rows = comparison_rows([serial, hogwild])
    assert rows[1]["examples_per_s"] == 110.0 and rows[1]["speedup_vs_serial"] < 1
    report = report_markdown("exp", rows, None)
    assert "- Highest throughput: **hogwild** (median over 3 turns: 110 examples/s)." in report
    assert "Each speedup is the median of its turns' ratios to serial's run of the same " \
        "turn" in report

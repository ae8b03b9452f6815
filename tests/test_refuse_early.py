"""Bad input is refused before anything starts (a new user's review): one
line that says what to change, exit 2, nothing written, and a previous
run's folder left exactly as it was. Each of these was refused only from
inside the run, after the folder had been cleared (and a TensorBoard file
written), or after other runs had finished, or with a traceback."""
import contextlib
import io
import subprocess

import pytest

from monsoon.errors import ConfigError
from monsoon.record.run_folder import RESULT_FILES
from monsoon.shared_memory import NEEDS_FENCE


def cli(command, *args):
    """``monsoon COMMAND --quiet ARGS`` in this process: exit code and stderr."""
    from monsoon.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([command, "--quiet", *args])
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code
    return subprocess.CompletedProcess([command, *args], code, "", err.getvalue())


def refused(proc, *words):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("monsoon: error: "), proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def previous_run(folder):
    """A previous run's results in ``folder`` (each file clear_results
    removes, and a TensorBoard file; its config.json names a run, as
    monsoon's does); returns every file's content."""
    (folder / "tb").mkdir(parents=True)
    for name in RESULT_FILES:
        (folder / name).write_text(f"previous {name}")
    (folder / "config.json").write_text('{"problem": "previous", "strategy": "serial", '
                                        '"workers": 1}')
    (folder / "tb" / "events.out.tfevents.1.previous.monsoon").write_text("previous events")
    return snapshot(folder)


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("command,args,words", [
    ("train", ["--strategy", "pipeline", "--workers", "2", "--cuts", "99"], ["--cuts 99"]),
    ("train", ["--strategy", "pipeline", "--workers", "2", "--problem", "digits",
               "--backend", "threads"], ["drop --backend threads"]),
    ("train", ["--strategy", "pipeline", "--workers", "2", "--problem", "digits",
               "--checkpoint-every", "5"], ["drop --checkpoint-every"]),
    ("train", ["--strategy", "pipeline", "--workers", "2", "--problem", "linear"],
     ["nn.Sequential"]),
    ("simulate", ["--strategy", "async", "--stage-compute-s", "0.1"], ["use --compute-s"]),
    ("simulate", ["--strategy", "pipeline", "--problem", "digits"],
     ["pipeline stages but the model has only", "--pipeline-stages"]),
])
def test_a_refusal_of_the_run_leaves_the_previous_folder_as_it_was(tmp_path, command, args,
                                                                   words):
    out = tmp_path / "run"
    before = previous_run(out)
    refused(cli(command, *args, "--epochs", "1", "--out", str(out)), *words)
    assert snapshot(out) == before


def test_nccl_without_cuda_is_refused_before_any_rank_starts(tmp_path):
    """Every rank refused it once started: the previous run's folder
    wiped, and the run failed as "rank 0 failed" (restarted too)."""
    from monsoon.devices import cuda_count

    if cuda_count():
        pytest.skip("CUDA is available here: nccl runs")
    out = tmp_path / "run"
    before = previous_run(out)
    refused(cli("train", "--engine", "torch", "--strategy", "sync", "--workers", "2",
                "--dist-backend", "nccl", "--max-restarts", "1", "--steps", "5",
                "--out", str(out)), "--dist-backend nccl needs CUDA", "use gloo")
    assert snapshot(out) == before


@pytest.mark.parametrize("engine", ["torch", "ray", "spark"])
@pytest.mark.parametrize("strategy", ["easgd", "local-sgd"])
def test_checkpoints_asked_of_a_run_that_writes_none_are_refused_before_it_starts(
        tmp_path, monkeypatch, engine, strategy):
    """ray, spark and torch keep no checkpoint of local SGD's and EASGD's
    private worker copies, and write none: ``--engine torch --strategy easgd
    --checkpoint-every 20 --out OUT`` ran, exit 0, with no checkpoints
    folder, and ``--resume OUT`` then said only 'no checkpoints folder
    there'. Both are refused in one line that says why, before the engine
    starts (its run is never called), the previous folder left as it was;
    asked at the default interval too. The default interval alone checks."""
    from monsoon.api import check
    from monsoon.engines import ENGINES

    def started(*args, **kwargs):
        raise AssertionError("the engine started")

    monkeypatch.setattr(ENGINES.get(engine), "run", started)
    out = tmp_path / "run"
    before = previous_run(out)
    why = f"the {engine} engine keeps no checkpoints of {strategy}'s private worker copies"
    instead = f"or run {strategy} on the local or sim engine"
    args = ("--engine", engine, "--strategy", strategy, "--workers", "2", "--problem", "digits",
            "--steps", "100", "--out", str(out))
    for every in ("20", "1000"):
        refused(cli("train", *args, "--checkpoint-every", every),
                f"--checkpoint-every {every}: {why}, so this run writes none",
                f"drop --checkpoint-every, {instead}")
    refused(cli("train", *args, "--resume", str(out)),
            f"--resume {out}: {why}, so this run cannot resume", f"drop --resume, {instead}")
    assert snapshot(out) == before
    check("digits", strategy, 2, engine=engine, steps=100, out=out)
    check("digits", strategy, 2, steps=100, out=out, checkpoint_every=20)  # the local engine's


def test_the_pipeline_on_auto_threads_runs_its_stages_in_processes():
    """--backend auto picks threads on a GPU; the stage runner has only
    processes: auto then means processes, where --backend threads is refused."""
    from monsoon.config import resolve

    resolved = resolve("exp", "pipeline", 2, {"steps": 1, "backend": "auto"})
    resolved.engine.backend = "threads"  # what auto chooses on a GPU
    resolved.engine.given = frozenset({"steps"})
    resolved.engine.preflight(resolved.problem, resolved.strategy, 2, 32)
    assert resolved.engine.backend == "processes"


@pytest.mark.parametrize("args,words", [
    (["--workers", "8", "--batch-size", "64"], ["batch size 64 is larger than a worker's part"]),
    (["--workers", "0"], ["workers"]),
])
def test_compare_checks_every_strategy_before_any_runs(tmp_path, args, words):
    """serial trained fully, and only then was async refused."""
    out = tmp_path / "cmp"
    refused(cli("compare", "--strategies", "serial,async", "--epochs", "1", *args,
                "--out", str(out)), *words)
    assert not out.exists()


@pytest.mark.parametrize("problem,fraction,left", [
    ("digits", "0.9999", "no training example"), ("exp", "0.001", "no validation example")])
def test_a_val_fraction_that_leaves_no_examples_is_one_line(tmp_path, problem, fraction, left):
    """It was a 33-line traceback (a ValueError from validation_split)."""
    out = tmp_path / "run"
    refused(cli("train", "--problem", problem, "--val-fraction", fraction, "--epochs", "1",
                "--out", str(out)), f"--val-fraction {fraction}", left)
    assert not out.exists()


@pytest.mark.parametrize("command,problem", [
    ("train", "spark:{tmp}/clicks.svm"), ("simulate", "spark-table:clicks")])
def test_data_that_lives_in_spark_needs_the_spark_engine(tmp_path, command, problem):
    """On the local engine Spark was started, read the data, and the run
    failed mid-way ([CONTEXT_ONLY_VALID_ON_DRIVER]) with a "failed" folder."""
    out = tmp_path / "run"
    before = previous_run(out)
    line = refused(cli(command, "--problem", problem.format(tmp=tmp_path), "--epochs", "1",
                       "--out", str(out)), "add --engine spark")
    assert "Spark cannot read" not in line
    assert snapshot(out) == before


def test_more_micro_batches_than_a_batch_holds_are_refused(tmp_path):
    """It ran, cut 32 examples into 32 micro-batches, and summary.json said
    64 (and the GPipe bubble of 64)."""
    out = tmp_path / "run"
    refused(cli("train", "--strategy", "pipeline", "--workers", "2", "--problem", "digits",
                "--micro-batches", "64", "--batch-size", "32", "--epochs", "1",
                "--out", str(out)), "--micro-batches 64", "--micro-batches 32 or fewer")
    assert not out.exists()


def test_the_default_micro_batches_are_cut_to_the_batch_and_reported(tmp_path):
    import json

    import monsoon
    from monsoon.strategies.pipeline.schedules import gpipe_bubble

    run = monsoon.train("digits", "pipeline", 2, engine="sim", batch_size=2, steps=1,
                        evals=0, progress=False, out=tmp_path / "run")
    assert run.summary["micro_batches"] == 2
    assert run.summary["gpipe_bubble"] == gpipe_bubble(2, 2)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["micro_batches"] == 2
    assert max(st["peak_micro_batches_in_flight"] for st in run.summary["stages"]) == 2


TORCH_SYNC = ["--engine", "torch", "--strategy", "sync", "--workers", "2"]
# --reduce-via auto picks shared memory only where the CPU keeps stores in order
X86_ONLY = pytest.mark.skipif(NEEDS_FENCE, reason="no shared-memory reduce on this CPU")


@pytest.mark.parametrize("args,words", [
    (["--strategy", "local-sgd", "--workers", "2", "--outer-momentum", "0.5"],
     ["--outer-momentum", "add --diloco"]),
    (["--strategy", "sync", "--workers", "2", "--shards", "3"], ["drop --shards"]),
    (["--strategy", "serial", "--shards", "4"], ["drop --shards"]),
    (["--strategy", "hogwild", "--workers", "2", "--shards", "2"],
     ["hogwild here has no server to split", "update the shared parameters in place",
      "drop --shards"]),
    (["--strategy", "serial", "--beta", "0.1"], ["--beta", "drop --beta"]),
    (["--engine", "spark", "--strategy", "serial", "--average-epochs", "1"],
     ["--average-epochs", "(async, local-sgd, ssp)", "drop --average-epochs"]),
    (["--engine", "spark", "--strategy", "easgd", "--workers", "2", "--average-epochs", "1"],
     ["--average-epochs", "easgd keeps no such average"]),
    (["--engine", "sim", "--strategy", "serial", "--shards", "3"], ["drop --shards"]),
    (["--engine", "sim", "--strategy", "sync", "--workers", "2", "--shards", "2"],
     ["each apply the mean to their own copy", "drop --shards"]),
    (["--engine", "sim", "--strategy", "pipeline", "--workers", "2", "--shards", "2"],
     ["each stage updates its own parameters", "drop --shards"]),
    (["--engine", "ray", "--strategy", "pipeline", "--workers", "2", "--shards", "2"],
     ["pipeline here has no server to split", "each stage updates its own parameters",
      "drop --shards"]),
    (["--engine", "ray", "--strategy", "serial", "--shards", "2"],
     ["the ray engine cannot carry out Apply", "engines that run serial: local, sim, spark"]),
    (["--engine", "sim", "--strategy", "serial", "--service-s", "1", "--latency-s", "1"],
     ["--latency-s, --service-s: in serial no message is sent", "drop --latency-s, --service-s"]),
    (["--engine", "sim", "--strategy", "hogwild", "--workers", "2", "--bandwidth", "10"],
     ["--bandwidth: in hogwild", "drop --bandwidth"]),
    (["--engine", "sim", "--strategy", "pipeline", "--workers", "2", "--service-s", "1"],
     ["--service-s: in pipeline stages exchange activations with no server"]),
    (["--strategy", "pipeline", "--workers", "2", "--cuts", "2", "--balance", "time"],
     ["--cuts places the stages", "give --cuts or --balance, not both"]),
    (["--engine", "sim", "--strategy", "pipeline", "--workers", "2", "--stage-compute-s",
      "0.1,0.1", "--compute-s", "0.2"], ["give --stage-compute-s or --compute-s, not both"]),
    (["--engine", "sim", "--strategy", "async", "--workers", "2", "--straggler-factor", "5"],
     ["add --straggler-p or --slow-fraction, or drop --straggler-factor"]),
    (["--strategy", "serial", "--lr-gamma", "0.5"],
     ["--lr-gamma shapes the step schedule", "add --lr-schedule step"]),
    (["--strategy", "serial", "--lr-step-size", "3", "--lr-gamma", "0.5"],
     ["--lr-gamma and --lr-step-size", "drop --lr-gamma and --lr-step-size"]),
    (["--strategy", "async", "--workers", "2", "--shards", "100000"],
     ["--shards 100000", "use --shards 49 or fewer"]),
    (["--workers", "0"], ["--workers"]),
    (["--workers", "-3"], ["--workers"]),
    pytest.param(TORCH_SYNC + ["--bucket-mb", "1"],
                 ["--bucket-mb 1", "--reduce-via auto", "add --reduce-via backend"],
                 marks=X86_ONLY),
    pytest.param(TORCH_SYNC + ["--bucket-mb", "1", "--reduce-via", "shm"],
                 ["--reduce-via shm", "add --reduce-via backend"], marks=X86_ONLY),
    (TORCH_SYNC + ["--bucket-mb", "1", "--reduce-via", "backend", "--strategy", "local-sgd"],
     ["strategy local-sgd", "drop --bucket-mb"]),
    (TORCH_SYNC + ["--bucket-mb", "1", "--reduce-via", "backend", "--problem", "linear"],
     ["problem linear", "drop --bucket-mb"]),
    (TORCH_SYNC + ["--bucket-mb", "1", "--reduce-via", "backend", "--compress", "topk:0.5"],
     ["--compress", "drop --bucket-mb"]),
])
def test_an_option_that_would_do_nothing_is_refused(tmp_path, args, words):
    """Each ran, recorded the option in config.json and did not use it
    (serial x1 for --workers 0; 49 shards for 100000; the torch engine's
    --bucket-mb where no bucket runs: bucket_count null)."""
    out = tmp_path / "run"
    refused(cli("train", "--problem", "exp", *args, "--epochs", "1", "--out", str(out)),
            *words)
    assert not out.exists()


SPARSE = "rcv1-like:rows=200,features=50,nnz=5"


@pytest.mark.parametrize("problem,options", [
    ("exp", {"epochs": 1}), (SPARSE, {"steps": 4}), (SPARSE, {"epochs": 1, "batch_size": 8}),
    (SPARSE, {"epochs": 1, "rule": "adagrad"}), (SPARSE, {"epochs": 1, "engine": "sim"})])
def test_beta_is_refused_where_the_compiled_loop_does_not_run(problem, options):
    """--beta scales only the compiled per-example loop's steps: a dense
    problem, a --steps budget, --batch-size, another rule or another engine
    ran with it recorded in the summary and without effect."""
    from monsoon.api import check
    from monsoon.errors import ConfigError

    with pytest.raises(ConfigError, match="drop --beta$"):
        check(problem, "hogwild", 2, hogwild_beta=0.5, **options)
    check(problem, "hogwild", 2, **options)  # its default is no refusal
    check(SPARSE, "hogwild", 2, hogwild_beta=0.5, epochs=1)


def test_compare_passes_shards_to_the_strategies_that_have_a_server(tmp_path):
    """compare passes one set of options to every strategy: serial takes
    --shards without refusing it; async runs with the shards asked for."""
    import monsoon

    comparison = monsoon.compare("exp", ["serial", "async"], 2, out=tmp_path / "cmp", steps=4,
                                 shards=2, evals=0, progress=False)
    assert comparison.results["async"].summary["shards"] == 2


def test_a_step_schedule_takes_its_gamma_and_step_size(tmp_path):
    import monsoon

    import json

    monsoon.train("exp", "serial", lr_schedule="step", lr_gamma=0.5, lr_step_size=2, steps=4,
                  evals=0, progress=False, out=tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["lr_gamma"], config["lr_step_size"]) == (0.5, 2)
    # compare passes them to every strategy, as --beta: a run without a step schedule takes them
    monsoon.compare("exp", ["serial", "sync"], 2, out=tmp_path / "cmp", steps=2, evals=0,
                    lr_gamma=0.5, progress=False)


def test_spark_takes_average_epochs_where_it_keeps_an_average():
    from monsoon.api import check

    for strategy in ("async", "ssp", "local-sgd"):
        assert check("exp", strategy, 2, engine="spark", average_epochs=1.0,
                     epochs=1).engine.average_epochs == 1.0
    # compare passes it to every strategy: sync, which keeps none, takes it
    check("exp", "sync", 2, engine="spark", average_epochs=1.0, epochs=1,
          shared={"average_epochs"})


def test_sim_takes_shards_and_delays_where_a_server_serves_messages():
    from monsoon.api import check

    check("exp", "async", 2, engine="sim", shards=2, sim_service_s=1.0, sim_bandwidth=10.0,
          epochs=1)
    check("exp", "pipeline", 2, engine="sim", sim_latency_s=1.0, epochs=1)
    # compare passes them to every strategy: serial takes them without refusing
    check("exp", "serial", 1, engine="sim", shards=2, sim_latency_s=1.0, epochs=1,
          shared={"shards", "sim_latency_s"})


def test_straggler_factor_is_taken_where_there_are_stragglers():
    from monsoon.api import check

    for stragglers in ({"sim_straggler_p": 0.1}, {"sim_slow_fraction": 0.5}):
        check("exp", "async", 2, engine="sim", sim_straggler_factor=5.0, epochs=1, **stragglers)
    check("exp", "async", 2, engine="sim", sim_straggler_factor=5.0, epochs=1,
          shared={"sim_straggler_factor"})  # compare's, given to every strategy


def test_diloco_takes_its_outer_momentum():
    import monsoon

    run = monsoon.train("exp", "local-sgd", 2, diloco=True, outer_momentum=0.5, steps=4,
                        evals=0, progress=False)
    assert run.summary["outer_rule"]["momentum"] == 0.5


def test_stage_times_for_another_count_of_stages_are_refused_before_the_run(tmp_path):
    out = tmp_path / "run"
    before = previous_run(out)
    refused(cli("simulate", "--strategy", "pipeline", "--workers", "2", "--problem", "digits",
                "--stage-compute-s", "0.1,0.2,0.3", "--epochs", "1", "--out", str(out)),
            "gives 3 stage time(s), but the pipeline has 2 stages")
    assert snapshot(out) == before


@pytest.mark.parametrize("out", [123, 1.5, ["runs"]])
def test_an_out_that_is_not_a_path_is_refused_in_python(out):
    import monsoon
    from monsoon.errors import ConfigError

    with pytest.raises(ConfigError, match=r"give the run folder as a path"):
        monsoon.train("exp", "serial", out=out, epochs=1)


def test_a_run_refused_once_started_gives_the_previous_folder_back(tmp_path):
    """A stage that returns a tuple is found only when the pipeline measures
    its activations, after the run folder was set up: the previous run's
    results, TensorBoard file and another run's checkpoint are back as they
    were, and nothing of the refused run is left."""
    import numpy as np
    import torch

    import monsoon
    from monsoon.errors import ConfigError
    from monsoon.pipeline import staged
    from monsoon.problems import TorchProblem

    class Pair(torch.nn.Module):
        def forward(self, x):
            return x, x

    class First(torch.nn.Module):  # the whole model runs: a stage boundary does not
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, xs):
            return self.lin(xs[0])

    out = tmp_path / "run"
    previous_run(out)
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "ckpt-00000010.npz").write_bytes(b"another run's checkpoint")
    before = snapshot_bytes(out)
    model = staged([torch.nn.Sequential(torch.nn.Linear(4, 4), Pair()),
                                     First()])
    X = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    problem = TorchProblem(model, torch.nn.functional.mse_loss, X, X[:, :1])
    with pytest.raises(ConfigError, match="stage 0 returns a tuple"):
        monsoon.train(problem, "pipeline", 2, out=out, epochs=1, tensorboard=True)
    assert snapshot_bytes(out) == before


def snapshot_bytes(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_the_previous_files_a_killed_run_set_aside_go_with_the_next_run(tmp_path):
    """A run killed (SIGKILL) before its end leaves the previous run's files
    set aside; the next run in the folder removes them, as it would have."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / ".aside-summary.json").write_text("previous summary")
    (out / "checkpoints" / ".aside-ckpt-000000000010.npz").write_text("another run's")
    assert cli("train", "--epochs", "1", "--out", str(out)).returncode == 0
    assert not list(out.rglob(".aside-*"))
    assert (out / "summary.json").exists()


def test_a_new_run_keeps_the_users_own_event_files_in_tb(tmp_path):
    """tb/ may hold a user's own TensorBoard files (torch's SummaryWriter's
    ``events.out.tfevents.TIME.HOST.PID.N``, TensorFlow's ``.v2``) beside
    the runs': a new run there removes its previous run's event files
    (monsoon's, named ``....monsoon``), as any result of it, and keeps the
    user's, as any other file of theirs in the folder. Before, every
    ``events.out.tfevents.*`` file went."""
    out = tmp_path / "run"
    assert cli("train", "--epochs", "1", "--out", str(out)).returncode == 0
    tb = out / "tb"
    (previous,) = tb.iterdir()
    previous.write_bytes(previous.read_bytes() + b"previous run")
    users = {"events.out.tfevents.1764680000.myhost.4242.0": b"the user's own",
             "events.out.tfevents.1764680001.myhost.4242.17.v2": b"the user's TF2 events"}
    for name, data in users.items():
        (tb / name).write_bytes(data)
    assert cli("train", "--epochs", "1", "--seed", "1", "--out", str(out)).returncode == 0
    files = {p.name: p.read_bytes() for p in tb.iterdir()}
    assert {name: files.get(name) for name in users} == users
    (mine,) = set(files) - set(users)
    assert mine.endswith(".monsoon") and b"previous run" not in files[mine]


def test_a_refusal_of_the_live_series_gives_the_previous_folder_back(tmp_path, monkeypatch):
    """MLflow that cannot be reached (or is not installed) is refused after
    the folder was set up: the previous run's files are back, and no hidden
    file is left. (The sink's refusal is made at once here: a real
    unreachable server is refused after MLflow's own retries.)"""
    import monsoon
    from monsoon.errors import ConfigError
    from monsoon.record import live

    def unreachable(uri, *args, **kwargs):
        raise ConfigError(f"--mlflow {uri}: cannot be reached")

    monkeypatch.setattr(live, "MlflowSink", unreachable)
    out = tmp_path / "run"
    before = previous_run(out)
    with pytest.raises(ConfigError, match="cannot be reached"):
        monsoon.train("exp", "serial", out=out, epochs=1, mlflow="http://127.0.0.1:9",
                      live_every=1)
    assert snapshot(out) == before


def test_checkpoints_on_another_disk_are_set_aside_where_they_are(tmp_path):
    """A checkpoints folder linked to another file system (here /dev/shm):
    another run's checkpoints are set aside in their own folder (a rename
    across file systems would fail) and go once the new run stands."""
    import os
    import shutil
    import tempfile

    from monsoon.record import checkpoints

    other = tempfile.mkdtemp(prefix="monsoon-test-", dir="/dev/shm")
    try:
        out = tmp_path / "run"
        out.mkdir()
        os.symlink(other, out / "checkpoints")
        for seed in ("1", "2"):
            proc = cli("train", "--epochs", "1", "--seed", seed, "--checkpoint-every", "5",
                       "--out", str(out))
            assert proc.returncode == 0, proc.stderr
        names = sorted(os.listdir(other))
        assert names and all(n.startswith("ckpt-") for n in names), names
        assert {checkpoints.read(out / "checkpoints" / n).meta["seed"] for n in names} == {2}
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_a_refused_run_takes_its_own_files_with_it(tmp_path):
    """``SetAside.restore``: what the refused run wrote (a checkpoint, an
    event file, a result) goes, and what was set aside comes back."""
    from monsoon.record.run_folder import SetAside

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "tb").mkdir()
    (out / "summary.json").write_text("previous")
    (out / "checkpoints" / "ckpt-000000000010.npz").write_text("another run's")
    (out / "checkpoints" / "ckpt-000000000020.npz.damaged").write_text("damaged")
    aside = SetAside(out)
    aside.keep(out / "summary.json")
    aside.keep(out / "checkpoints" / "ckpt-000000000010.npz")
    aside.begins()
    (out / "checkpoints" / "ckpt-000000000010.npz").write_text("the refused run's")
    (out / "tb" / "events.out.tfevents.2.refused.monsoon").write_text("refused")
    (out / "metrics.csv").write_text("refused")
    aside.restore()
    assert snapshot(out) == {"checkpoints/ckpt-000000000010.npz": "another run's",
                             "checkpoints/ckpt-000000000020.npz.damaged": "damaged",
                             "summary.json": "previous"}


# what the torch engine says of each strategy it cannot run
TORCH_SERIAL = ("the torch engine cannot carry out Apply (an in-place update of the parameters by "
                "the worker itself), which serial uses; engines that run serial: local, sim, spark")
TORCH_ASYNC = ("the torch engine cannot carry out Push (a server that applies each push the moment "
               "it arrives), which async uses; engines that run async: local, sim, ray, spark")
TORCH_HOGWILD = ("the torch engine cannot carry out Apply (an in-place update of the parameters "
                 "by the worker itself), which hogwild uses; engines that run hogwild: local, sim")
TOO_MANY = "300 workers but only 256 training examples; use at most 256 workers"
STAGES = "300 pipeline stages but the model has only 3 layers; use --pipeline-stages 3 or fewer"


@pytest.mark.parametrize("args,ending", [
    (["--engine", "spark", "--strategies", "serial,hogwild,sync"],
     "engines that run hogwild: local, sim; drop hogwild from --strategies to compare serial, "
     "sync"),
    (["--engine", "torch", "--strategies", "serial,async,hogwild,sync"],
     f"error: {TORCH_SERIAL}; {TORCH_ASYNC}; {TORCH_HOGWILD}; drop serial, async, hogwild from "
     "--strategies to compare sync"),
    (["--strategies", "serial,async", "--workers", "8", "--batch-size", "64"],
     "use --batch-size 32 or less, or fewer workers; drop async from --strategies to compare "
     "serial"),
    (["--strategies", "sync,hogwild", "--compress", "hogwild=sign"],
     "strategy hogwild sends no messages to compress; drop hogwild=sign from --compress"),
    (["--strategies", "serial,hogwild", "--compress", "topk:0.5"],
     "strategy serial sends no messages to compress; drop --compress, or add to --strategies "
     "(serial,hogwild) one that sends messages: sync, async, local-sgd, easgd, ssp"),
    # reasons that differ only in the strategy's name are said once, naming both
    (["--strategies", "serial,async,hogwild", "--workers", "8", "--batch-size", "64"],
     "error: batch size 64 is larger than a worker's part of the data: each async or hogwild "
     "worker draws its batches from its own 32 of the 256 examples; use --batch-size 32 or "
     "less, or fewer workers; drop async, hogwild from --strategies to compare serial"),
    (["--strategies", "async,hogwild", "--workers", "8", "--batch-size", "64"],
     "error: batch size 64 is larger than a worker's part of the data: each async or hogwild "
     "worker draws its batches from its own 32 of the 256 examples; use --batch-size 32 or "
     "less, or fewer workers"),
    # a reason that names none of its strategies is prefixed by them
    (["--strategies", "serial,sync,pipeline", "--workers", "300"],
     f"error: sync: {TOO_MANY}; {STAGES}; drop sync, pipeline from --strategies to compare "
     "serial"),
    (["--engine", "torch", "--strategies", "serial,hogwild"],
     f"error: no strategy in --strategies runs with these options: {TORCH_SERIAL}; "
     f"{TORCH_HOGWILD}"),
    (["--strategies", "sync,async,pipeline", "--workers", "300"],
     f"error: no strategy in --strategies runs with these options: sync, async: {TOO_MANY}; "
     f"{STAGES}"),
    # one reason shared by all (a bad option): the run's own line, as it is
    (["--strategies", "sync,async", "--workers", "300"], f"error: {TOO_MANY}"),
], ids=["spark-hogwild", "torch-three", "batch", "compress-one", "compress-all", "batch-two",
        "batch-none-left", "workers-two-reasons", "torch-none-left", "workers-none-left",
        "workers-shared"])
def test_compare_says_which_strategies_to_drop(tmp_path, args, ending):
    """A strategy the run cannot take was refused in a run's words (the
    engines that run it, --strategy): the line now ends with what to change
    in compare's flags, naming the strategies to drop and those left. Every
    refused strategy's reason is in that one line, each distinct reason
    once, so one round trip tells them all."""
    out = tmp_path / "cmp"
    line = refused(cli("compare", "--epochs", "1", *args, "--out", str(out)))
    assert line.endswith(ending), line
    assert not out.exists()


def test_compare_from_python_names_its_keyword_and_raises_a_shared_refusal_as_it_is(tmp_path):
    import re

    import monsoon

    with pytest.raises(ConfigError, match=r"which hogwild needs here; engines that run hogwild: "
                       r"local, sim; drop hogwild from strategies to compare serial$"):
        monsoon.compare("exp", "serial,hogwild", 2, out=tmp_path / "a", engine="spark", epochs=1)
    # every strategy refused, each for its own reason: both are said
    with pytest.raises(ConfigError) as refusal:
        monsoon.compare("exp", "serial,hogwild", 2, out=tmp_path / "b", engine="torch", epochs=1)
    assert str(refusal.value) == ("no strategy in strategies runs with these options: "
                                  f"{TORCH_SERIAL}; {TORCH_HOGWILD}")
    with pytest.raises(ConfigError, match=re.escape(f"{TORCH_SERIAL}; {TORCH_HOGWILD}; drop "
                                                    "serial, hogwild from strategies to compare "
                                                    "sync") + "$"):
        monsoon.compare("exp", "serial,hogwild,sync", 2, out=tmp_path / "c", engine="torch",
                        epochs=1)
    # every strategy refused alike: no strategy left to compare, the run's own line
    with pytest.raises(ConfigError) as refusal:
        monsoon.compare("exp", "sync,async", 300, out=tmp_path / "d", epochs=1)
    assert type(refusal.value) is ConfigError and str(refusal.value) == TOO_MANY
    assert not any((tmp_path / name).exists() for name in "abcd")

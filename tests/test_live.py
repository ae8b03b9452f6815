"""Live series (monsoon/record/live.py): TensorBoard event files under OUT/tb,
read back with TensorBoard's own EventAccumulator; MLflow through its client."""
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import monsoon
from monsoon.record import read_metrics

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def scalars(folder) -> dict:
    """Every scalar tag in ``folder``'s event files: tag -> [(step, value)]."""
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def worker_tags(found: dict, workers: int, kind: str = "loss") -> None:
    for k in range(workers):
        rows = found.get(f"{kind}/worker-{k}")
        assert rows, f"no {kind}/worker-{k} rows; tags: {sorted(found)}"
        assert all(np.isfinite(v) for _, v in rows)


def objective_is_the_csv(run_dir: Path) -> None:
    found = scalars(run_dir / "tb")
    rows = read_metrics(run_dir / "metrics.csv")
    curve = found["objective/loss"]
    assert [s for s, _ in curve] == [r["examples"] for r in rows]
    # TensorBoard keeps scalars as float32: equal to the csv's, so rounded
    assert [v for _, v in curve] == [float(np.float32(r["loss"])) for r in rows]


@pytest.mark.slow
def test_rows_for_each_worker_appear_while_a_local_run_goes(tmp_path):
    """The run goes in this process; a thread reads its event files while it
    trains and, once each worker has two rows, interrupts it (SIGINT: Ctrl-C)."""
    import threading

    from monsoon.errors import Interrupted

    out, seen, done = tmp_path / "run", {}, threading.Event()

    def watch():
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not done.is_set():
            if (out / "tb").is_dir():
                found = scalars(out / "tb")
                if all(len(found.get(f"loss/worker-{k}", ())) >= 2 for k in range(2)):
                    seen["found"] = found
                    break
            time.sleep(0.1)
        if not done.is_set():  # (a run that ended by itself must not get pytest's Ctrl-C)
            os.kill(os.getpid(), signal.SIGINT)  # stops cleanly, writing the run folder

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # far more epochs than the test waits for: the watcher stops the run once it has seen the rows
    try:
        with pytest.raises(Interrupted):
            monsoon.train("digits", "async", 2, epochs=100000, live_every=0.2, out=out,
                          progress=False)
    finally:
        done.set()
    watcher.join(10)
    found = seen.get("found")
    assert found, "no two rows per worker while the run went"
    worker_tags(found, 2)
    worker_tags(found, 2, "examples_per_s")
    worker_tags(found, 2, "updates")
    for tag in ("run/examples_per_s", "run/updates", "run/staleness_mean",
                "run/staleness_max", "run/dropped_updates", "run/minibatch_loss"):
        assert found.get(tag), tag
    assert "objective/loss" not in found  # the exact curve comes after the run
    steps = [s for s, _ in found["loss/worker-0"]]
    assert steps == sorted(steps) and steps[-1] > 0
    assert (out / "metrics.csv").exists()
    objective_is_the_csv(out)  # the interrupted run's curve is written too


@pytest.mark.parametrize("strategy,workers,engine", [
    ("sync", 2, "local"), ("hogwild", 2, "local"), ("serial", 1, "local"), ("async", 3, "sim")])
def test_the_objective_curve_in_the_event_files_equals_metrics_csv(tmp_path, strategy,
                                                                   workers, engine):
    out = tmp_path / strategy
    monsoon.train("exp", strategy, workers, engine=engine, epochs=40, seed=0, out=out,
                  progress=False, live_every=0.05, backend="threads" if engine == "local" else None)
    objective_is_the_csv(out)
    found = scalars(out / "tb")
    worker_tags(found, workers)
    worker_tags(found, workers, "updates")


@pytest.mark.parametrize("engine,backend,first", [
    ("local", "threads", 1e30), ("local", "processes", 1e30), ("sim", None, 1e30),
    ("local", "threads", float("nan")), ("sim", None, float("nan"))])
def test_a_huge_or_non_finite_loss_spoils_only_the_row_it_falls_in(tmp_path, engine, backend,
                                                                   first):
    """Each worker's first mini-batch loss is 1e30 (or NaN; the sim's workers
    share one problem: the run's first), every later one 1.0: the rows after
    the one it falls in read exactly 1.0. The workers
    added their losses to running totals and a row took the difference of
    two: after a huge loss every later row read 0.0 (after a NaN, NaN)."""
    from faulty import ReportsLoss

    from monsoon.problems import make_problem

    out = tmp_path / "run"
    # long enough for several live rows a worker while the monitor shares its cores
    monsoon.train(ReportsLoss(make_problem("exp"), first), "async", 2, engine=engine, epochs=120,
                  seed=0, out=out, progress=False, live_every=0.02,
                  **({"backend": backend} if backend else {}))
    only_the_first_rows_spoilt(scalars(out / "tb"))


def only_the_first_rows_spoilt(found: dict) -> None:
    """Each worker's first loss (huge or not finite) spoils the row it falls
    in; every other row reads exactly 1.0."""
    for tag in ("loss/worker-0", "loss/worker-1", "run/minibatch_loss"):
        values = [v for _, v in found[tag]]
        spoilt = [i for i, v in enumerate(values) if v != 1.0]  # the rows a first loss fell in
        assert all(not abs(values[i]) < 1e20 for i in spoilt), (tag, values)
        assert len(values) - len(spoilt) >= 3, (tag, values)
        if tag == "run/minibatch_loss":  # each worker's first loss: in one row or two
            assert 1 <= len(spoilt) <= 2, values
        else:  # a worker's first row (the sim's worker 1 has none)
            assert spoilt in ([0], []), (tag, values)


@pytest.mark.ray
def test_a_huge_loss_on_ray_spoils_only_the_row_it_falls_in(tmp_path, local_ray):
    """Ray's workers kept a plain running sum of their losses: after one of
    1e30 every later row read 0.0."""
    from faulty import ReportsLoss

    from monsoon.problems import make_problem

    out = tmp_path / "run"
    monsoon.train(ReportsLoss(make_problem("exp"), 1e30), "async", 2, engine="ray", shards=1,
                  epochs=40, seed=0, out=out, progress=False, live_every=0.05)
    only_the_first_rows_spoilt(scalars(out / "tb"))


def test_the_monitor_reads_a_local_workers_losses_whole():
    """A worker process paused between two writes of its loss cells had the
    monitor read a count without its loss (a row of losses 1.0 read 0.667,
    the next one 1.33). Its WRITING mark is odd meanwhile: the monitor
    keeps its last whole reading until the write is done."""
    from monsoon.engines.local.store import WRITING, ParameterStore
    from monsoon.record.live import LOSS_N, LOSS_SUM, add_loss
    from monsoon.rules import make_rule

    store = ParameterStore(np.zeros(4), make_rule("sgd", 0.1), 1, 1, sync_slots=False,
                           backend="threads", live=True)
    try:
        row = store.live[0]
        add_loss(row, 1.0)
        whole = store.live_figures(1)[0][0]["losses"]
        row[WRITING] += 1  # a write begun: its count in, its loss not yet
        row[LOSS_N] += 1
        assert store.live_figures(1)[0][0]["losses"] == whole
        row[LOSS_SUM] += 1.0
        row[WRITING] += 1
        losses = store.live_figures(1)[0][0]["losses"]
        assert losses[LOSS_SUM] == 2.0 and losses[LOSS_N] == 2
    finally:
        store.close()


def test_spark_figures_keep_each_rows_losses_after_a_huge_one():
    """Spark's driver adds its tasks' loss sums (``add_figures``) to the
    figures a row reads: after a task's huge one, the next row still has
    the next tasks' mean, and a copy of the figures taken for a row keeps
    its own (the server's copies them under its lock)."""
    from monsoon.record.live import LiveWriter, add_figures

    writer, workers = LiveWriter(every=0.1), {}
    add_figures(workers, 0, 1e30, 1, 10)
    first = writer.write(0.0, 10, 1, {k: dict(f) for k, f in workers.items()})
    kept = {k: dict(f) for k, f in workers.items()}
    add_figures(workers, 0, 3.0, 2, 20)  # one task's two steps
    add_figures(workers, 0, float("inf"), 1, 10)
    add_figures(workers, 0, 1.0, 1, 10)
    second = writer.write(1.0, 50, 5, workers)
    add_figures(workers, 0, 1.0, 1, 10)
    third = writer.write(2.0, 60, 6, workers)
    assert first["loss/worker-0"] == 1e30 and kept[0]["losses"] != workers[0]["losses"]
    assert second["loss/worker-0"] == float("inf") and third["loss/worker-0"] == 1.0
    assert third["run/minibatch_loss"] == 1.0


@pytest.mark.parametrize("engine,strategy,workers", [
    ("local", "async", 2), ("local", "serial", 1), ("sim", "async", 2)])
def test_the_live_series_end_with_the_runs_final_counts(tmp_path, engine, strategy, workers):
    """docs/live.md's example, a run shorter than --live-every's second,
    wrote its step-0 row alone (run/updates 0, no losses); longer runs
    ended at the last row due. The run's last row now comes when it ends:
    summary.json's counts, and the losses since the row before. The sim's
    last row, written once its last messages had landed, with no example
    trained since the row before, read run/examples_per_s 0: a drop to 0 at
    the end of every chart; it writes no rate now."""
    out = tmp_path / engine
    monsoon.train("digits", strategy, workers, engine=engine, epochs=1, seed=0, out=out,
                  progress=False, **({"backend": "threads"} if engine == "local" else {}))
    found = scalars(out / "tb")
    ends_with_the_summarys_counts(out, found)
    worker_tags(found, workers)
    assert found["run/minibatch_loss"][-1][0] == found["run/updates"][-1][0]
    assert found["run/examples_per_s"][-1][1] > 0, found["run/examples_per_s"][-3:]


@pytest.mark.parametrize("engine,backend", [
    ("local", "threads"), ("local", "processes"), ("sim", None)])
def test_the_live_series_count_the_bytes_sent(tmp_path, engine, backend):
    """The live series carry the bytes sent (DESIGN.md); the local engine
    wrote none: run/bytes_sent now rises with the run to summary.json's."""
    out = tmp_path / engine
    monsoon.train("digits", "sync", 2, engine=engine, epochs=2, seed=0, out=out, progress=False,
                  compress="topk:0.1", live_every=0.02,
                  **({"backend": backend} if backend else {}))
    found = scalars(out / "tb")
    ends_with_the_summarys_counts(out, found)
    sent = [v for _, v in found["run/bytes_sent"]]
    assert any(0 < v < sent[-1] for v in sent), sent  # counted as the run goes


def test_the_sim_writes_against_virtual_time(tmp_path):
    out = tmp_path / "sim"
    result = monsoon.train("digits", "async", 4, engine="sim", epochs=1, seed=0, out=out,
                           progress=False)
    acc = event_accumulator.EventAccumulator(str(out / "tb"))
    acc.Reload()
    worker_tags(scalars(out / "tb"), 4)
    events = acc.Scalars("run/updates")
    span = events[-1].wall_time - events[0].wall_time
    simulated = result.summary["simulated_time_s"]
    assert len(events) >= 10  # a row with every row of the curve, however short the run
    sent = acc.Scalars("run/bytes_sent")  # the sim counts the bytes its messages carry
    assert sent[-1].value > sent[0].value >= 0
    assert span <= simulated + 1e-3  # virtual seconds, not the real time it took
    assert result.summary["real_time_s"] > simulated or span > 0


def test_compare_writes_one_tensorboard_run_per_strategy(tmp_path):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    strategies = ["serial", "sync", "async", "hogwild"]
    monsoon.compare("exp", strategies, workers=2, out=tmp_path, epochs=40, seed=0,
                    progress=False, backend="threads", live_every=0.02)
    mux = EventMultiplexer().AddRunsFromDirectory(str(tmp_path))
    mux.Reload()
    runs = mux.Runs()
    assert sorted(runs) == sorted(f"{s}/tb" for s in strategies)
    for s in strategies:
        assert "objective/loss" in runs[f"{s}/tb"]["scalars"]
        assert "loss/worker-0" in runs[f"{s}/tb"]["scalars"], (s, runs[f"{s}/tb"]["scalars"])


def test_no_run_folder_no_files_and_live_every_zero_writes_none(tmp_path):
    result = monsoon.train("exp", "sync", 2, epochs=5, progress=False, backend="threads")
    assert result.run_dir is None
    out = tmp_path / "off"
    monsoon.train("exp", "sync", 2, epochs=5, progress=False, out=out, live_every=0,
                  backend="threads")
    assert not (out / "tb").exists()


def test_options_md_gives_tensorboards_default_as_a_run_has_it(tmp_path):
    """docs/options.md's --tensorboard row said its default was "off"; a run
    with a folder writes tb/ unasked."""
    from monsoon.docs import option_tables

    row = next(line for line in option_tables().splitlines()
               if line.startswith("| `--tensorboard`"))
    assert row.split("|")[2].strip() == "on where there is a run folder", row
    monsoon.train("exp", "serial", steps=20, progress=False, out=tmp_path / "run")
    assert (tmp_path / "run" / "tb").is_dir()


def test_live_every_zero_with_tensorboard_writes_the_post_run_curve_alone(tmp_path):
    """--live-every 0 writes no live series; --tensorboard asked for then
    still gets the objective/ curve, written when the run ends (it wrote no
    tb/ at all)."""
    out = tmp_path / "curve"
    monsoon.train("exp", "serial", steps=50, progress=False, out=out, live_every=0,
                  tensorboard=True)
    found = scalars(out / "tb")
    assert found and all(tag.startswith("objective/") for tag in found), sorted(found)
    objective_is_the_csv(out)


def test_bad_live_options_are_refused_in_one_line(capsys):
    """From Python the refusals name the keywords (they named the flags:
    "give --out" to a caller of monsoon.train); the command line's name
    the flags."""
    from monsoon.cli import main as cli_main

    with pytest.raises(monsoon.ConfigError, match="fix live_every=$"):
        monsoon.train("exp", "sync", 2, epochs=1, live_every=-1)
    with pytest.raises(monsoon.ConfigError,
                       match="^tensorboard= writes under the run folder: give out=$"):
        monsoon.train("exp", "sync", 2, epochs=1, tensorboard=True, progress=False)
    with pytest.raises(monsoon.ConfigError,
                       match="^mlflow= logs the live series: give live_every= above 0$"):
        monsoon.train("exp", "sync", 2, epochs=1, mlflow="", live_every=0, progress=False)
    code = cli_main(["train", "--problem", "exp", "--strategy", "sync", "--epochs", "1",
                     "--quiet", "--mlflow", "--live-every", "0"])
    assert code == 2
    assert capsys.readouterr().err.strip().endswith(
        "--mlflow logs the live series: give --live-every above 0")


def ends_with_the_summarys_counts(out: Path, found: dict) -> None:
    """The live series' last row holds the run's final counts, summary.json's."""
    summary = json.loads((out / "summary.json").read_text())
    assert found["run/updates"][-1] == (summary["examples"], summary["updates"])
    assert found["run/examples"][-1] == (summary["examples"], summary["examples"])
    if "run/bytes_sent" in found:  # where the engine counts them as they go
        sent = [v for _, v in found["run/bytes_sent"]]
        assert sent == sorted(sent) and sent[-1] == np.float32(summary["bytes_sent"]), sent


def after_run(out: Path, workers: int, per_worker=("loss",)) -> dict:
    found = scalars(out / "tb")
    for kind in per_worker:
        worker_tags(found, workers, kind)
    assert found.get("run/examples_per_s") and found.get("run/updates")
    ends_with_the_summarys_counts(out, found)
    objective_is_the_csv(out)
    return found


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["sync", "async"])
def test_ray_writes_each_workers_series(tmp_path, local_ray, strategy):
    out = tmp_path / strategy
    # NumPy problem, one shard: 3 actors that import no torch; 200 steps of some
    # milliseconds each on Ray: several rows 0.05 s apart
    monsoon.train("logistic", strategy, 2, engine="ray", shards=1, steps=200, seed=0,
                  out=out, progress=False, live_every=0.05)
    found = after_run(out, 2, ("loss", "examples_per_s", "updates"))
    if strategy == "async":
        assert found.get("run/staleness_max")


@pytest.mark.ray
@pytest.mark.parametrize("compress", [None, "topk:0.5"])
def test_ray_easgd_live_series_count_its_elastic_exchanges(tmp_path, local_ray, compress):
    """EASGD on Ray: every live row read run/updates 0 and updates/worker-K
    0, the last row too, while summary.json counted its exchanges (its
    workers never counted an elastic exchange). The last row now holds the
    summary's updates, each worker's its own exchanges."""
    out = tmp_path / "easgd"
    run = monsoon.train("logistic", "easgd", 2, engine="ray", shards=1, steps=200, seed=0,
                        out=out, progress=False, live_every=0.05, compress=compress)
    found = scalars(out / "tb")
    ends_with_the_summarys_counts(out, found)
    assert run.summary["updates"] > 0
    assert sum(found[f"updates/worker-{k}"][-1][1] for k in range(2)) == run.summary["updates"]


@pytest.mark.ray
def test_ray_sync_live_dropped_updates_count_the_steps_its_shards_drop(tmp_path, local_ray):
    """Sync on Ray: worker 1's every third gradient is NaN, so the shards
    drop those steps (its workers drop none themselves). The live series'
    run/dropped_updates counts them as the curve's rows do: never more than
    the summary's, and more than none once a row has seen them. Their
    updates count each step applied once, as the local engine's do: the
    run's, and the workers' summed, never more than the summary's, each by
    the lowest rank it counted (worker 0), whichever part completed it."""
    from monsoon.problems import make_problem

    from faulty import FaultyProblem

    out = tmp_path / "sync"
    problem = FaultyProblem(make_problem("logistic", dtype="float64"), "nan", rank=1, after=0,
                            every=3)
    run = monsoon.train(problem, "sync", 2, engine="ray", shards=1, steps=300, seed=0, out=out,
                        progress=False, live_every=0.02, evals=20)
    found = scalars(out / "tb")
    dropped = [v for _, v in found["run/dropped_updates"]]
    assert run.summary["dropped_updates"] == 100
    assert dropped == sorted(dropped) and 0 < dropped[-1] <= 100, dropped
    updates = [v for _, v in found["run/updates"]]
    assert updates == sorted(updates) and 0 < updates[-1] <= run.summary["updates"], updates
    assert sum(found[f"updates/worker-{k}"][-1][1] for k in range(2)) <= run.summary["updates"]
    assert found["updates/worker-0"][-1][1] > 0
    assert all(v == 0 for _, v in found["updates/worker-1"])


@pytest.fixture(scope="module")
def spark():
    from spark_env import spark_session

    with spark_session("local[2]") as session:
        yield session


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)  # a Spark session's start and a job a step, on a busy machine
@pytest.mark.parametrize("strategy", ["sync", "async", "local-sgd"])
def test_spark_writes_each_workers_series(tmp_path, spark, strategy):
    out = tmp_path / strategy
    # each sync step or local-sgd round is a Spark job: a few are enough; async's
    # pushes go over its tasks' sockets, a millisecond or so each
    steps = 400 if strategy == "async" else 12
    monsoon.train("digits", strategy, 2, engine="spark", steps=steps, batch_size=128, seed=0,
                  out=out, progress=False, live_every=0.01, evals=5)
    after_run(out, 2, ("loss", "examples_per_s"))


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_spark_live_series_count_a_dropped_push_as_dropped(tmp_path, spark):
    """Async on Spark: every gradient is NaN, so a task sends no push and
    the server drops each (``ServerCore.drop``). The live series count
    those as dropped, as the local engine's do: each worker's updates stay
    0 (they counted every push before), and the run's dropped_updates rise."""
    from monsoon.problems import make_problem

    from faulty import FaultyProblem

    spark.sparkContext.addPyFile(str(Path(__file__).parent / "faulty.py"))
    out = tmp_path / "async"
    problem = FaultyProblem(make_problem("exp"), "nan", rank=None, after=0)
    run = monsoon.train(problem, "async", 2, engine="spark", steps=200, batch_size=64, seed=0,
                        out=out, progress=False, live_every=0.01, evals=5,
                        raise_on_divergence=False)
    found = scalars(out / "tb")
    assert run.summary["dropped_updates"] > 0
    for k in range(2):
        assert {v for _, v in found[f"updates/worker-{k}"]} == {0.0}, k
    assert found["run/dropped_updates"][-1][1] > 0


@pytest.mark.torchrun
@pytest.mark.slow
def test_torch_writes_each_ranks_loss(tmp_path):
    out = tmp_path / "torch"
    # the ranks' steps take a fraction of a millisecond after the first: rows
    # close enough together that the run has several (a rate needs two)
    monsoon.train("digits", "sync", 2, engine="torch", epochs=3, seed=0, out=out,
                  progress=False, live_every=0.002, timeout=60)
    after_run(out, 2)


@pytest.mark.torchrun
def test_torch_rows_read_each_ranks_mean_loss_since_the_row_before(tmp_path):
    """Rank k's i-th mini-batch loss is i + 1000 k (``CountsLoss``). A row
    at step S (the run's examples: every rank has taken t = S / B steps,
    whose losses came with the collectives; no gradient buckets on a NumPy
    problem) reads the mean of rank k's losses t' + 1 .. t, t' the row
    before's; run/minibatch_loss the two ranks' mean. The rows read each
    rank's last loss before the row (t + 1000 k)."""
    from faulty import CountsLoss

    from monsoon.problems import make_problem

    out, batch, steps = tmp_path / "run", 16, 300
    monsoon.train(CountsLoss(make_problem("exp")), "sync", 2, engine="torch", steps=steps,
                  batch_size=batch, seed=0, out=out, progress=False, live_every=0.005,
                  timeout=60)
    found = scalars(out / "tb")
    means = {}
    for k in range(2):
        before, windows = 0, []
        for step, value in found[f"loss/worker-{k}"]:
            assert step % batch == 0, step  # (B: the step's batch, over both ranks)
            t = step // batch
            assert value == pytest.approx((before + 1 + t) / 2 + 1000 * k), (k, step, before)
            means[step] = means.get(step, 0.0) + value / 2
            windows.append(t - before)
            before = t
        assert before == steps, k
        assert max(windows) > 1, windows  # a mean of several losses, not one
    assert dict(found["run/minibatch_loss"]) == pytest.approx(means)


@pytest.mark.torchrun
@pytest.mark.parametrize("resident", [False, True])
def test_torch_rows_in_gradient_buckets_read_each_step_with_its_own_collective(tmp_path,
                                                                             resident):
    """As above, with a torch model whose all-reduce runs in buckets during
    backward: a step's examples and loss ride in its own first bucket (the
    loss written once forward has computed it: into the host flags, or
    into the device buffer's for a ``resident`` model), so each row at step
    S holds exactly t = S / B steps per rank, the mean of rank k's losses
    t' + 1 .. t."""
    import torch
    from faulty import CountedMSE
    from torch import nn

    from monsoon.problems import TorchProblem

    g = torch.Generator().manual_seed(1)
    X = torch.randn(64, 4, generator=g)
    torch.manual_seed(0)
    problem = TorchProblem(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)),
                           CountedMSE(), X, X[:, :1].sin())
    problem.resident = resident  # the ranks' arrays: tensors, the flags in the buffer
    out, batch, steps = tmp_path / "run", 16, 60
    run = monsoon.train(problem, "sync", 2, engine="torch", steps=steps, batch_size=batch,
                        seed=0, lr=0.01, out=out, progress=False, live_every=0.001, evals=0,
                        reduce_via="backend", timeout=60)
    assert run.summary["bucket_count"] == 1 and run.summary["examples"] == steps * batch
    found = scalars(out / "tb")
    for k in range(2):
        before = 0
        for step, value in found[f"loss/worker-{k}"]:
            assert step % batch == 0, step
            t = step // batch
            assert t > before and value == pytest.approx((before + 1 + t) / 2 + 1000 * k), \
                (k, step, before)
            before = t
        assert before == steps, k
    assert len(found["loss/worker-0"]) > 2


def own_event_files(out: Path) -> list:
    from monsoon.record.events import OWN_PATTERN

    return sorted((out / "tb").glob(OWN_PATTERN))


def _write_a_row(pickled: bytes) -> None:
    import pickle

    writer = pickle.loads(pickled)
    writer.write(1.0, 10, 1, {0: {"loss": 2.0}})
    writer.flush()


def test_a_writer_carried_to_another_process_writes_on_in_its_file(tmp_path):
    """A writer opened in one process, pickled to another that writes its
    live rows (the torch engine's rank 0), then finished in the first (the
    post-run curve): one event file, begun once, holding both."""
    import multiprocessing
    import pickle

    from monsoon.record.live import LiveWriter

    writer = LiveWriter(every=1.0, tb_dir=tmp_path / "tb").open()
    child = multiprocessing.get_context("fork").Process(target=_write_a_row,
                                                        args=(pickle.dumps(writer),))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    writer.finish([{"epoch": 0, "examples": 10, "time_s": 1.0, "loss": 3.0}], None, "FINISHED")
    files = own_event_files(tmp_path)
    assert len(files) == 1, [f.name for f in files]
    assert files[0].read_bytes().count(b"brain.Event:2") == 1  # the first event, once
    found = scalars(tmp_path / "tb")
    assert found["loss/worker-0"] == [(10, 2.0)] and found["objective/loss"] == [(10, 3.0)]


@pytest.mark.torchrun
@pytest.mark.slow
def test_a_torch_run_writes_one_event_file_with_a_local_runs_tags(tmp_path):
    """The torch engine's launcher began an event file (the post-run curve
    went there) and its rank 0 another (the live rows): TensorBoard showed
    the run twice, its scalars split. One file holds them all now: a local
    run's tags, but the bytes sent (docs/live.md: torch hands them over at
    the end). Its rows lacked per-worker examples/s and updates: each rank's
    examples ride in the step's all-reduce now, and every rank has the
    run's updates (each applies every step to its replica)."""
    runs, found = {}, {}
    for engine, options in (("torch", {"timeout": 60}), ("local", {"backend": "threads"})):
        out = tmp_path / engine
        # torch's steps take a fraction of a millisecond: rows close enough
        # together that the run has several (a rate needs two)
        monsoon.train("digits", "sync", 2, engine=engine, epochs=1, seed=0, out=out,
                      progress=False, tensorboard=True, live_every=0.002, **options)
        files = own_event_files(out)
        assert len(files) == 1, (engine, [f.name for f in files])
        found[engine] = scalars(files[0])
        runs[engine] = set(found[engine])
    assert runs["torch"] == runs["local"] - {"run/bytes_sent"}, \
        sorted(runs["torch"] ^ runs["local"])
    torch_rows = found["torch"]
    summary = json.loads((tmp_path / "torch" / "summary.json").read_text())
    for k in range(2):
        assert torch_rows[f"updates/worker-{k}"][-1][1] == summary["updates"], k
        assert all(v >= 0 and np.isfinite(v) for _, v in torch_rows[f"examples_per_s/worker-{k}"])
    # each rank's examples/s over the rows' windows add up to its examples
    # since the first row, the ranks' together to the run's
    acc = event_accumulator.EventAccumulator(str(tmp_path / "torch" / "tb"),
                                             size_guidance={"scalars": 0})
    acc.Reload()
    rows = [(e.wall_time, e.value) for e in acc.Scalars("run/examples")]
    assert len(rows) > 2, rows
    ranks = []
    for k in range(2):
        rates = {e.wall_time: e.value for e in acc.Scalars(f"examples_per_s/worker-{k}")}
        assert len(rates) == len(rows) - 1, (k, rates)  # every row but the first
        ranks.append(sum(rates[t] * (t - before) for (before, _), (t, _) in zip(rows, rows[1:])))
    assert sum(ranks) == pytest.approx(rows[-1][1] - rows[0][1], rel=0.05), ranks


def test_mlflow_gets_the_config_the_series_and_the_run_folder(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for the opt-in
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()  # a local file store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # for mlflow.search_runs
    out = tmp_path / "run"
    monsoon.train("exp", "async", 2, epochs=40, seed=0, out=out, progress=False,
                  live_every=0.05, backend="threads", mlflow=uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("monsoon")
    runs = mlflow.search_runs([experiment.experiment_id], output_format="list",
                              filter_string="params.strategy = 'async'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["workers"] == "2" and run.data.params["engine"] == "local"
    history = client.get_metric_history(run.info.run_id, "loss/worker-1")
    assert history and all(np.isfinite(m.value) for m in history)
    steps = [m.step for m in history]
    assert steps == sorted(steps) and steps[-1] > 0
    curve = client.get_metric_history(run.info.run_id, "objective/loss")
    rows = read_metrics(out / "metrics.csv")
    assert [(m.step, m.value) for m in curve] == [(r["examples"], r["loss"]) for r in rows]
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"metrics.csv", "summary.json", "config.json", "tb"} <= names
    assert client.list_artifacts(run.info.run_id, "tb")  # a folder, with its files
    assert ".monsoon.lock" not in names  # the folder's lock (pid, command): held, not the run's


def test_mlflow_with_no_server_there_is_one_line_within_seconds(tmp_path, capsys,
                                                                 monkeypatch):
    """``--mlflow http://127.0.0.1:9`` (nothing listening) waited about 4
    minutes in silence, through MLflow's retries and backoff, before its
    one line. The first contact now retries little, briefly; the settings
    are the user's again after it (and a user's own are kept)."""
    import socket

    from monsoon.cli import main as cli_main

    pytest.importorskip("mlflow")
    with socket.socket() as s:  # a port that was free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")  # the user's: kept
    out = tmp_path / "run"
    t0 = time.monotonic()
    code = cli_main(["train", "--problem", "linear", "--strategy", "serial", "--steps", "10",
                     "--quiet", "--out", str(out), "--mlflow", f"http://127.0.0.1:{port}"])
    took = time.monotonic() - t0
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and took < 30, (code, took)
    assert len(lines) == 1 and f"--mlflow http://127.0.0.1:{port}" in lines[0], lines
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "120"
    with pytest.raises(monsoon.ConfigError, match=f"^mlflow='http://127.0.0.1:{port}': "):
        monsoon.train("linear", "serial", steps=10, progress=False,
                      mlflow=f"http://127.0.0.1:{port}")  # from Python: the keyword


def test_the_progress_bar_shows_loss_speed_and_worst_staleness():
    from collections import Counter

    from monsoon.problems import make_problem
    from monsoon.record import Recorder
    from monsoon.record.live import LiveWriter

    recorder = Recorder(make_problem("exp"), 1000, progress=True)
    recorder.live_writer = LiveWriter(every=0.5)  # no sink: the bar alone
    recorder.start(np.zeros(3, dtype=np.float32))
    workers = {0: {"loss_sum": 0.0, "loss_n": 0, "examples": 0},
               1: {"loss_sum": 0.0, "loss_n": 0, "examples": 0}}
    recorder.live(0.0, 0, 0, workers, Counter())
    assert not recorder.live_due(0.4) and recorder.live_due(0.5)
    workers = {0: {"loss_sum": 3.0, "loss_n": 2, "examples": 200},
               1: {"loss_sum": 1.0, "loss_n": 2, "examples": 100}}
    row = recorder.live(0.5, 300, 4, workers, Counter({0: 1, 5: 1, 2: 2}))
    assert row["loss/worker-0"] == 1.5 and row["loss/worker-1"] == 0.5
    assert row["run/minibatch_loss"] == 1.0 and row["run/examples_per_s"] == 600
    assert row["run/staleness_max"] == 5 and row["run/staleness_mean"] == 2.25
    postfix = recorder._bar.postfix
    recorder.close()
    assert "loss=1" in postfix and "ex/s=600" in postfix and "stale=5" in postfix

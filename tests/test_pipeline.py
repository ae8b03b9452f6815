"""The pipeline strategy (monsoon/strategies/pipeline/, each engine's pipeline.py): schedules, stage cuts, equality
with serial full-batch SGD on the local and sim engines, 2D replicas, memory
per worker, and bad input."""
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

import monsoon
from monsoon.cli import main
from monsoon.errors import ConfigError
from monsoon.engines.local.channels import boundary_bytes
from monsoon.pipeline import staged  # the README's name for it
from monsoon.strategies.pipeline.schedules import (bubble_fraction, gpipe_bubble,
                                                   peak_activations, schedule, timeline)
from monsoon.strategies.pipeline.stages import balanced_cuts, plan
from monsoon.problems import TorchProblem


def mlp4(dtype="float64"):
    """A 4-layer MLP on a planted regression task (300 examples)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 12))
    y = np.tanh(X @ rng.standard_normal((12, 3)))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                        nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 3))
    return TorchProblem(net, nn.MSELoss(), X, y, dtype=dtype, name="mlp4")


def problem_of(name):
    return mlp4() if name == "mlp4" else "digits"


OPTS = dict(steps=5, batch_size=64, dtype="float64", seed=3, lr=0.05, evals=0)


def serial(name, **extra):
    return monsoon.train(problem_of(name), "serial", **OPTS, **extra).params


# -- schedules ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("S,M", [(1, 1), (2, 1), (2, 4), (3, 8), (4, 2)])
def test_schedules_run_each_op_once_in_a_shared_order(name, S, M):
    fs, bs = [], []
    for s in range(S):
        ops = schedule(name, s, S, M)
        assert sorted(ops) == sorted([("F", m) for m in range(M)] + [("B", m) for m in range(M)])
        assert all(ops.index(("F", m)) < ops.index(("B", m)) for m in range(M))
        fs.append([m for k, m in ops if k == "F"])
        bs.append([m for k, m in ops if k == "B"])
        if name == "1f1b":
            assert peak_activations(ops) <= min(S - s, M)
        else:
            assert peak_activations(ops) == M
    assert all(f == fs[0] for f in fs) and all(b == bs[0] for b in bs)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("S,M", [(2, 1), (2, 4), (3, 8), (4, 16)])
def test_equal_stages_give_gpipes_bubble(name, S, M):
    span, busy = timeline(name, [[1.0] * M] * S, [[2.0] * M] * S)
    assert span == pytest.approx(3.0 * (M + S - 1))
    assert bubble_fraction(span, busy) == pytest.approx(gpipe_bubble(S, M))


def test_balanced_cuts_minimise_the_largest_stage():
    assert balanced_cuts([10, 0, 10, 0, 10, 10], 2) == [0, 3]
    assert balanced_cuts([1, 1, 1], 3) == [0, 1, 2]
    assert balanced_cuts([100, 1, 1, 1, 1], 2) == [0, 1]


# -- equality with serial full-batch SGD --------------------------------------

@pytest.mark.parametrize("name", ["mlp4", "digits"])
@pytest.mark.parametrize("S", [2, 3])
@pytest.mark.parametrize("M", [1, 4, 8])
@pytest.mark.parametrize("sched", ["gpipe", "1f1b"])
def test_sim_pipeline_equals_serial(name, S, M, sched):
    got = monsoon.train(problem_of(name), "pipeline", S, engine="sim", micro_batches=M,
                        schedule=sched, **OPTS)
    np.testing.assert_allclose(got.params, serial(name), rtol=1e-9, atol=1e-12)
    assert got.summary["updates"] == OPTS["steps"]
    assert got.summary["pipeline_stages"] == S


@pytest.mark.slow
# Every (model, S, M, schedule) is checked bit for bit on the sim above; on
# the local engine (processes, shared-memory channels: ~10 s each here) each
# model, stage count, micro-batch count and schedule appears at least once.
@pytest.mark.parametrize("name,S,M,sched", [
    ("mlp4", 2, 1, "gpipe"), ("mlp4", 3, 4, "1f1b"), ("mlp4", 2, 8, "1f1b"),
    ("digits", 3, 1, "1f1b"), ("digits", 2, 4, "gpipe"), ("digits", 3, 8, "gpipe")])
def test_local_pipeline_equals_serial(name, S, M, sched):
    got = monsoon.train(problem_of(name), "pipeline", S, micro_batches=M, schedule=sched,
                        rule="momentum", **OPTS)
    np.testing.assert_allclose(got.params, serial(name, rule="momentum"), rtol=1e-9, atol=1e-12)
    s = got.summary
    assert s["backend"] == "processes" and s["updates"] == OPTS["steps"]
    assert 0.0 <= s["bubble_fraction"] < 1.0
    assert [st["stage"] for st in s["stages"]] == list(range(S))
    assert all(st["busy_s"] > 0 for st in s["stages"])
    for st in s["stages"]:  # 1F1B bounds the activations a stage holds: S - s, not M
        bound = min(S - st["stage"], M) if sched == "1f1b" else M
        assert st["peak_micro_batches_in_flight"] == bound


@pytest.mark.parametrize("engine", ["local", "sim"])
def test_two_stages_by_two_replicas_equal_serial(engine):
    got = monsoon.train(mlp4(), "pipeline", 4, pipeline_stages=2, micro_batches=4,
                        engine=engine, rule="adam", **{**OPTS, "lr": 0.01})
    want = monsoon.train(mlp4(), "serial", rule="adam", **{**OPTS, "lr": 0.01}).params
    np.testing.assert_allclose(got.params, want, rtol=1e-9, atol=1e-12)
    assert got.summary["pipeline_replicas"] == 2


def test_user_given_stages_are_the_cuts():
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((100, 4)), rng.standard_normal((100, 1))
    model = staged([nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 8),
                    nn.Sequential(nn.Tanh(), nn.Linear(8, 1))])
    problem = TorchProblem(model, nn.MSELoss(), X, y, dtype="float64")
    opts = dict(steps=4, batch_size=20, dtype="float64", seed=0, lr=0.1, evals=0)
    got = monsoon.train(problem, "pipeline", 3, engine="sim", micro_batches=3, **opts)
    assert [st["param_bytes"] for st in got.summary["stages"]] == [40 * 8, 72 * 8, 9 * 8]
    want = monsoon.train(problem, "serial", **opts).params
    np.testing.assert_allclose(got.params, want, rtol=1e-9, atol=1e-12)


def batchnorm_mlp(named: bool = False):
    """Two BatchNorm layers, one in each of two stages (layers 1 and 4: the
    second stage's own layer 1), on inputs far from mean 0 and variance 1;
    ``named``: the Sequential's layers named (``bn1``, ...), not numbered."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((64, 6)) * 3 + 5
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 8),
              nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1)]
    names = ["fc1", "bn1", "act1", "fc2", "bn2", "act2", "out"] if named else \
        [str(i) for i in range(len(layers))]
    net = nn.Sequential(OrderedDict(zip(names, layers)))
    return TorchProblem(net, nn.MSELoss(), X, np.tanh(X[:, :1] - 5), dtype="float64")


@pytest.mark.parametrize("engine,named", [("local", False), ("sim", False), ("sim", True)])
def test_the_stages_batchnorm_statistics_are_the_models(engine, named, tmp_path):
    """Each stage's forwards train its layers' running statistics; the run's
    model (result.model, model.pt, the final loss) carries replica 0's. With
    one micro-batch a stage sees serial's batches, so they are serial's. The
    layers' names in the model, numbers or names, are the buffers' too."""
    opts = dict(steps=3, batch_size=32, dtype="float64", seed=0, lr=0.05, evals=0)
    got = monsoon.train(batchnorm_mlp(named), "pipeline", 2, engine=engine, micro_batches=1,
                        out=tmp_path, **opts)
    want = monsoon.train(batchnorm_mlp(named), "serial", **opts)
    assert [st["param_bytes"] for st in got.summary["stages"]] == [72 * 8, 97 * 8]
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    for layer, key in ((1, "bn1" if named else "1"), (4, "bn2" if named else "4")):
        bn, ref = got.model[layer], want.model[layer]
        assert int(bn.num_batches_tracked) == 3
        for name in ("running_mean", "running_var"):
            np.testing.assert_allclose(getattr(bn, name), getattr(ref, name), rtol=1e-9)
            assert torch.equal(saved[f"{key}.{name}"], getattr(bn, name))
    assert got.summary["final_loss"] == pytest.approx(want.summary["final_loss"], rel=1e-9)


def test_sizing_and_timing_the_stages_leave_the_models_buffers_alone():
    """The channels' dry forward (one example: eval mode) and --balance time's
    timing forwards move no running statistic the stages start from."""
    problem = batchnorm_mlp()
    before = {k: v.clone() for k, v in problem.module.state_dict().items()}
    boundary_bytes(problem, plan(problem, 2, "time", batch_size=32))
    assert problem.module.training and problem.module[1].training
    for k, v in problem.module.state_dict().items():
        assert torch.equal(v, before[k]), k


# -- the sim's time model -------------------------------------------------------

SIM = dict(engine="sim", steps=2, batch_size=64, seed=0, lr=0.05, evals=0)


def test_sim_step_is_the_critical_path_of_the_given_stage_times():
    """S = 2, M = 2 (micro-batches of 32), GPipe. Stage times 0.6 s and 1.2 s
    per batch: F = 1/3, B = 2/3 of a micro-batch's share, so f0 0.1, b0 0.2,
    f1 0.2, b1 0.4; each message 0.01 s. Stage 1 is the bottleneck, and the
    path is f0 + c + 2 (f1 + b1) + c + b0 = 1.52 s."""
    got = monsoon.train(mlp4(), "pipeline", 2, micro_batches=2, sim_stage_compute_s="0.6,1.2",
                        sim_latency_s=0.01, **SIM).summary
    assert got["sim_step_s"] == pytest.approx(1.52)
    busy = [st["busy_s"] / SIM["steps"] for st in got["stages"]]
    assert busy == pytest.approx([0.6, 1.2])
    assert got["bubble_fraction"] == pytest.approx(bubble_fraction(1.52, busy))


@pytest.mark.parametrize("S,M,sched", [(2, 8, "gpipe"), (3, 4, "1f1b")])
def test_sim_step_is_the_timeline_of_stage_times_and_message_bytes(S, M, sched):
    problem = mlp4()
    per_example = boundary_bytes(problem, plan(problem, S))
    times, latency, bandwidth = [0.5, 0.9, 0.7][:S], 0.003, 2e5
    got = monsoon.train(problem, "pipeline", S, micro_batches=M, schedule=sched,
                        sim_stage_compute_s=",".join(map(str, times)), sim_latency_s=latency,
                        sim_bandwidth=bandwidth, **SIM).summary
    k = SIM["batch_size"] // M  # examples per micro-batch
    forward = [[t * k / SIM["batch_size"] / 3] * M for t in times]
    backward = [[t * k / SIM["batch_size"] * 2 / 3] * M for t in times]
    transfer = [[latency + k * per_example[s] / bandwidth] * M if s < S - 1 else [0.0] * M
                for s in range(S)]
    span, _ = timeline(sched, forward, backward, transfer)
    assert got["sim_step_s"] == pytest.approx(span)
    assert span > max(times)  # the transfers and the fill are on the path


def test_without_stage_times_a_stage_gets_compute_s_by_parameter_share():
    problem = mlp4()
    shares = [(spec.hi - spec.lo) / problem.n_params for spec in plan(problem, 2)]
    by_share = monsoon.train(problem, "pipeline", 2, micro_batches=4, sim_compute_s=2.0,
                             **SIM).summary["sim_step_s"]
    given = monsoon.train(problem, "pipeline", 2, micro_batches=4,
                          sim_stage_compute_s=",".join(str(2.0 * x) for x in shares),
                          **SIM).summary["sim_step_s"]
    assert by_share == pytest.approx(given)


def test_stage_times_are_refused_for_a_strategy_without_stages():
    with pytest.raises(ConfigError, match="the sync strategy has no stages"):
        monsoon.train("linear", "sync", 2, engine="sim", steps=1, sim_stage_compute_s="1,2")


# -- memory -------------------------------------------------------------------

@pytest.mark.slow
def test_each_worker_holds_only_its_stage():
    width = 2560  # two 2560x2560 float32 layers: 52 MB of parameters
    net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
    X = np.zeros((8, width), dtype=np.float32)
    problem = TorchProblem(net, nn.MSELoss(), X, np.zeros((8, width), dtype=np.float32))
    model_bytes = problem.n_params * 4
    assert model_bytes >= 50e6
    got = monsoon.train(problem, "pipeline", 2, rule="adam", steps=1, batch_size=4,
                        micro_batches=2, evals=0)
    whole = model_bytes * 3  # parameters + Adam's two moments
    for st in got.summary["stages"]:
        held = st["param_bytes"] + st["rule_state_bytes"]
        assert held <= 0.6 * whole, st
        assert st["rule_state_bytes"] == 2 * st["param_bytes"]


# -- bad input ------------------------------------------------------------------

@pytest.mark.parametrize("argv,says", [
    (["--workers", "3", "--pipeline-stages", "2"], "not a multiple of --pipeline-stages"),
    (["--workers", "2", "--cuts", "1,2"], "--cuts 1,2 gives 3 stages"),
    (["--workers", "2", "--cuts", "x"], "--cuts takes layer indices"),
    (["--workers", "4"], "only 3 layers"),
    (["--workers", "2", "--schedule", "zigzag"], "unknown schedule"),
    (["--workers", "2", "--stage-compute-s", "0.1,0.2,0.3"], "gives 3 stage time(s)"),
    (["--workers", "2", "--stage-compute-s", "0.1,x"],
     "one number of seconds (0 or more) per pipeline stage, separated by commas, like "
     "0.021,0.028, got '0.1,x'; fix --stage-compute-s"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, says):
    code = main(["train", "--problem", "digits", "--strategy", "pipeline", "--engine", "sim",
                 "--steps", "1", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err


def test_threads_backend_is_refused():
    with pytest.raises(ConfigError, match="drop --backend threads"):
        monsoon.train("digits", "pipeline", 2, backend="threads", steps=1)


@pytest.mark.parametrize("engine", ["local", "sim"])
def test_checkpoints_asked_for_are_refused(engine, tmp_path):
    with pytest.raises(ConfigError, match="does not write or resume checkpoints yet"):
        monsoon.train("digits", "pipeline", 2, engine=engine, steps=1, out=tmp_path,
                      checkpoint_every=5)


def test_a_run_folder_alone_runs(tmp_path):  # it turns checkpoints on by default
    got = monsoon.train(mlp4(), "pipeline", 2, engine="sim", out=tmp_path, **OPTS)
    np.testing.assert_allclose(got.params, serial("mlp4"), rtol=1e-9, atol=1e-12)


def test_a_model_that_is_no_sequential_is_refused():
    with pytest.raises(ConfigError, match="nn.Sequential"):
        monsoon.train("linear", "pipeline", 2, engine="sim", steps=1)


def _diverging(engine):
    """exp at lr 1e6: most steps' gradients are not finite, and are dropped."""
    return monsoon.train("exp", "pipeline", 2, engine=engine, lr=1e6, epochs=2, batch_size=16,
                         seed=0, raise_on_divergence=False)


def _counted_as_everywhere(run):
    """updates: the steps applied; dropped_updates: the steps some stage
    did not apply; together the steps run; the curve's updates never fall."""
    s = run.summary
    steps = s["examples"] // 16
    assert s["dropped_updates"] > 0 and s["updates"] + s["dropped_updates"] == steps, s
    updates = [row["updates"] for row in run.history]
    assert updates == sorted(updates) and updates[-1] == s["updates"], updates


@pytest.mark.parametrize("engine", ["local", "sim"])
def test_a_dropped_step_is_no_update(engine):
    _counted_as_everywhere(_diverging(engine))


@pytest.mark.ray
def test_a_dropped_step_is_no_update_on_ray(local_ray):
    _counted_as_everywhere(_diverging("ray"))


# -- ray --------------------------------------------------------------------------

@pytest.mark.ray
@pytest.mark.slow
def test_ray_pipeline_equals_serial(local_ray):
    """Two replicas of two stages (4 actors): a replica's gradients reach the
    other's stage. The schedule only orders the ops the driver submits (the
    schedules' own tests run on the local and sim engines): one, 1f1b, whose
    interleaved forwards and backwards depend on that order most."""
    S, W, M, sched = 2, 4, 3, "1f1b"
    got = monsoon.train(mlp4(), "pipeline", W, pipeline_stages=S, engine="ray",
                        micro_batches=M, schedule=sched, rule="momentum",
                        **{**OPTS, "evals": 3})
    want = monsoon.train(mlp4(), "serial", rule="momentum", **OPTS).params
    np.testing.assert_allclose(got.params, want, rtol=1e-9, atol=1e-12)
    s = got.summary
    assert s["updates"] == OPTS["steps"] and s["pipeline_replicas"] == W // S
    assert s["shards"] is None  # as on local and sim: the stages have no server to split
    assert all(st["busy_s"] > 0 for st in s["stages"])
    assert len(got.history) >= 2


# -- faults -------------------------------------------------------------------------

class Boom(nn.Module):
    """A parameter-free layer that fails on its 3rd forward: raising, or
    killing its process outright."""

    def __init__(self, how="raise"):
        super().__init__()
        self.how, self.calls = how, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 3:
            if self.how == "raise":
                raise RuntimeError("boom in stage 1")
            import os
            os._exit(3)
        return x


def boom_problem(how):
    rng = np.random.default_rng(0)
    net = nn.Sequential(nn.Linear(4, 4), Boom(how), nn.Linear(4, 1))
    return TorchProblem(net, nn.MSELoss(), rng.standard_normal((64, 4)),
                        rng.standard_normal((64, 1)), dtype="float64")


@pytest.mark.parametrize("how,says", [("raise", "boom in stage 1"), ("exit", "exit code 3")])
def test_a_failing_stage_fails_the_run_naming_it(how, says):
    from monsoon.errors import WorkerError

    with pytest.raises(WorkerError, match=says) as info:
        monsoon.train(boom_problem(how), "pipeline", 2, cuts="1", steps=5, batch_size=8,
                      micro_batches=2, evals=0, timeout=20)
    assert "stage 1" in str(info.value)


def test_a_lost_stage_says_a_pipeline_needs_every_stage():
    """One stage of two lost: the run fails because a pipeline cannot go on
    without any of its stages (not because 'every worker failed')."""
    from monsoon.errors import WorkerError

    with pytest.raises(WorkerError, match="failed, and a pipeline needs every stage"):
        monsoon.train(boom_problem("raise"), "pipeline", 2, cuts="1", steps=5, batch_size=8,
                      micro_batches=2, evals=0, timeout=20)


class SlowToStart(nn.Module):
    """A parameter-free layer whose stage process takes a minute to set it
    up (to unpickle it); elsewhere (the monitor's copies) it is at once."""

    def __setstate__(self, state):
        import multiprocessing

        if multiprocessing.current_process().name.startswith("monsoon-stage"):
            import time

            time.sleep(60)
        super().__setstate__(state)

    def forward(self, x):
        return x


@pytest.mark.slow
def test_a_stop_signal_while_a_stage_hangs_in_its_set_up_keeps_the_start_timeout(monkeypatch):
    """SIGTERM while stage 1 is still setting up: the run does not wait for
    it (its watch would wait for every stage), but fails when the start-up
    time is up, in one line, and leaves no stage process behind."""
    import functools
    import os
    import signal
    import threading
    import time

    from monsoon.engines.local.engine import LocalEngine
    from monsoon.errors import WaitTimeout, WorkerError
    from monsoon.monitor.lifecycle import StopSignals
    from test_interrupts import stages_of

    start_s = 3.0
    monkeypatch.setattr(LocalEngine, "__init__",
                        functools.partialmethod(LocalEngine.__init__, start_timeout=start_s))
    rng = np.random.default_rng(0)
    problem = TorchProblem(nn.Sequential(nn.Linear(4, 4), SlowToStart(), nn.Linear(4, 1)),
                           nn.MSELoss(), rng.standard_normal((64, 4)),
                           rng.standard_normal((64, 1)), dtype="float64")
    sent = []

    def sigterm_once_the_stages_start():
        deadline = time.monotonic() + 60
        while not stages_of(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.02)
        if StopSignals.active is not None:  # the run's handler takes it
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)

    # a signal that lands just after the run put its handler back must not end pytest
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    threading.Thread(target=sigterm_once_the_stages_start, daemon=True).start()
    try:
        # the monitor's start-up wait ends, or stage 0's wait for the start (as long) first
        with pytest.raises((WaitTimeout, WorkerError),
                           match="did not start within 3 s|waited 3 s for the start signal") as info:
            monsoon.train(problem, "pipeline", 2, cuts="1", steps=5, batch_size=8,
                          micro_batches=2, evals=0, timeout=start_s)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert sent, "the run ended before its stages started"
    assert len(str(info.value).splitlines()) == 1
    # the start-up time, then the pool's join (5 s) kills the stage still setting up
    assert time.monotonic() - sent[0] < start_s + 5 + 15
    assert stages_of(os.getpid()) == []


def test_balance_by_measured_time_cuts_and_still_equals_serial():
    from monsoon.strategies.pipeline.stages import plan

    problem = mlp4()
    specs = plan(problem, 3, balance="time", batch_size=64)
    bounds = [s.layers for s in specs]
    assert bounds[0][0] == 0 and bounds[-1][1] == 7
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(bounds, bounds[1:]))
    got = monsoon.train(problem, "pipeline", 3, engine="sim", balance="time", **OPTS)
    np.testing.assert_allclose(got.params, serial("mlp4"), rtol=1e-9, atol=1e-12)


def test_tied_weights_across_stages_are_refused():
    first = nn.Linear(4, 4)
    last = nn.Linear(4, 4)
    last.weight = first.weight
    problem = TorchProblem(nn.Sequential(first, nn.Tanh(), last), nn.MSELoss(),
                           np.zeros((8, 4)), np.zeros((8, 4)))
    with pytest.raises(ConfigError, match="share a parameter"):
        monsoon.train(problem, "pipeline", 2, engine="sim", steps=1, batch_size=4)


def test_the_sim_pipeline_reports_the_sims_figures(tmp_path):
    """docs/engines/sim.md: simulated_time_s, real_time_s and utilization in
    summary.json, for the pipeline as for every other strategy."""
    import json

    monsoon.train("digits", "pipeline", 2, engine="sim", out=tmp_path, **OPTS)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["simulated_time_s"] == summary["wall_time_s"] > 0
    assert summary["real_time_s"] > 0
    assert 0 < summary["utilization"]["workers"] <= 1 and "delays" in summary

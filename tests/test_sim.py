"""The sim engine: same programs as the local engine, virtual time, real math."""
import json

import numpy as np
import pytest

import monsoon
from monsoon.cli import main as cli_main
from monsoon.errors import ConfigError


def test_sim_sync_equals_local_sync_and_serial():
    """Zero latency, constant compute: sim sync is local sync, bit for bit."""
    opts = dict(steps=20, batch_size=256, dtype="float64", seed=3, lr=0.05)
    serial = monsoon.train("exp", "serial", **opts)
    local = monsoon.train("exp", "sync", 3, **opts)
    sim = monsoon.train("exp", "sync", 3, engine="sim", **opts)
    assert np.array_equal(sim.params, local.params)
    np.testing.assert_allclose(sim.params, serial.params, rtol=1e-9, atol=1e-12)
    # 20 steps, each as long as the largest slice (86 of 256 examples) of 1 ms
    assert sim.summary["wall_time_s"] == pytest.approx(20 * 1e-3 * 86 / 256)
    assert sim.summary["utilization"]["workers"] == pytest.approx(256 / (3 * 86))


def test_a_gradient_costs_compute_s_times_its_share_of_the_batch():
    """``--compute-s`` is a gradient over ``--batch-size`` examples. Every
    gradient cost all of it, so a sync worker's 1/8 slice took as long as
    serial's whole batch: ``compare --engine sim --problem linear --strategies
    serial,sync,async --workers 8`` gave sync x8 a speedup of exactly 1 (async
    7.94). Now sync on N workers takes 1/N of serial's time; async, whose
    workers each take a whole batch, is unchanged."""
    from monsoon.engines.sim.delays import DelayModel

    opts = dict(engine="sim", steps=40, batch_size=256, seed=0, sim_compute_s=2e-3)
    serial = monsoon.train("linear", "serial", **opts).summary["simulated_time_s"]
    sync = monsoon.train("linear", "sync", 8, **opts).summary["simulated_time_s"]
    asynchronous = monsoon.train("linear", "async", 8, **opts).summary["simulated_time_s"]
    assert serial == pytest.approx(40 * 2e-3)
    assert sync == pytest.approx(serial / 8)
    assert asynchronous == pytest.approx(40 / 8 * 2e-3)  # 5 whole batches each
    # the lognormal draw is kept as it was, scaled by the share
    model = DelayModel(compute_sigma=0.5)
    whole = model.compute_time(np.random.default_rng(1), 0, 4)
    assert model.compute_time(np.random.default_rng(1), 0, 4, 0.25) == pytest.approx(whole / 4)


def test_a_slow_fraction_is_rounded_up_to_whole_workers_and_reported():
    """round() went to the even count: 0.25 of 2 workers slowed none, 0.75
    both. Now the fraction is rounded up, and the summary says how many."""
    from monsoon.engines.sim.delays import DelayModel

    counts = {f: DelayModel(slow_fraction=f).slow_workers(2) for f in (0.0, 0.25, 0.5, 0.75)}
    assert counts == {0.0: 0, 0.25: 1, 0.5: 1, 0.75: 2}
    assert DelayModel(slow_fraction=0.3).slow_workers(10) == 3  # 0.3 * 10 is 3.0000000000000004
    run = monsoon.train("exp", "async", 2, engine="sim", sim_slow_fraction=0.25, steps=20,
                        evals=0, progress=False)
    assert run.summary["delays"]["slow_workers"] == 1
    rng = np.random.default_rng(0)
    model = DelayModel(compute_s=1.0, slow_fraction=0.25)
    assert [model.compute_time(rng, rank, 2) for rank in (0, 1)] == [1.0, 10.0]


@pytest.mark.parametrize("strategy,options", [
    ("async", dict(n_fetch=2, n_push=2, rule="adarevision")),
    ("hogwild", dict(rule="dcasgd-a", lr=0.05)),
    ("sync", dict(backup_workers=2)),
    ("local-sgd", dict(local_steps=4)),
    ("easgd", dict()),
])
def test_same_seed_same_run(tmp_path, strategy, options):
    delays = dict(sim_compute_sigma=0.5, sim_straggler_p=0.1)
    if strategy != "hogwild":  # shared memory sends no message: refused there
        delays.update(sim_latency_s=2e-4, sim_bandwidth=1e6, sim_service_s=1e-4)
    a, b, c = [monsoon.train("logistic", strategy, 12, engine="sim", steps=200, seed=seed,
                             batch_size=24, out=out, **delays, **options)
               for seed, out in [(5, tmp_path / "5-0"), (5, tmp_path / "5-1"), (6, None)]]
    assert np.array_equal(a.params, b.params)
    assert (tmp_path / "5-0" / "metrics.csv").read_text() == (tmp_path / "5-1" / "metrics.csv").read_text()
    assert a.summary["wall_time_s"] == b.summary["wall_time_s"]
    assert not np.array_equal(a.params, c.params)


def test_adarevision_beats_adagrad_at_delays_of_a_thousand_updates():
    """McMahan & Streeter 2014: with 1024 asynchronous workers each gradient
    is ~1000 updates stale; AdaGrad applied to stale gradients falls behind.
    (8,000 updates: the mean staleness is past 900 once the first thousand,
    less stale, are a small part of the run. 1024 workers: each holds 16 of
    the 16,384 examples, one whole batch; 1000 hold 16 or 17, a batch of 16
    and one of 1, which costs 1/16 of a gradient, so fewer updates land
    while it is computed.)"""
    common = dict(engine="sim", steps=8000, lr=0.3, seed=0, sim_compute_sigma=0.3, shards=1)
    adagrad = monsoon.train("logistic", "async", 1024, rule="adagrad", **common).summary
    adarevision = monsoon.train("logistic", "async", 1024, rule="adarevision", **common).summary
    assert adagrad["staleness"]["mean"] > 900
    assert adarevision["final_loss"] < 0.8 * adagrad["final_loss"]


def test_backup_workers_beat_stragglers_in_simulated_time():
    """Chen et al. 2016: p = 0.05 of 10x-slow steps, 100 workers."""
    common = dict(engine="sim", steps=120, batch_size=1050, lr=0.2, seed=0,
                  sim_straggler_p=0.05, sim_straggler_factor=10, target_loss=0.02)
    plain = monsoon.train("linear", "sync", 100, **common).summary
    backed = monsoon.train("linear", "sync", 100, backup_workers=5, **common).summary
    assert plain["time_to_target_s"] is not None and backed["time_to_target_s"] is not None
    assert backed["time_to_target_s"] < 0.8 * plain["time_to_target_s"]
    assert backed["late_gradients"] > 0 and plain["late_gradients"] == 0
    assert backed["utilization"]["workers"] > plain["utilization"]["workers"]


def test_staleness_breaks_async_sgd_and_delay_tolerance_fixes_it():
    common = dict(engine="sim", steps=3000, lr=0.05, seed=0, sim_compute_sigma=0.3,
                  raise_on_divergence=False)
    few = monsoon.train("linear", "async", 4, **common).summary["final_loss"]
    many = monsoon.train("linear", "async", 64, **common).summary["final_loss"]
    slr = monsoon.train("linear", "async", 64, staleness_lr=True, **common).summary["final_loss"]
    dca = monsoon.train("linear", "async", 64, rule="dcasgd-a", **common).summary["final_loss"]
    assert few < 0.01
    assert not np.isfinite(many) or many > 100 * few  # diverged or stalled
    assert slr < 2 * few  # the staleness-aware rate fixes it
    assert np.isfinite(dca) and dca < 10 * few  # DC-ASGD-a keeps it from diverging


def test_a_slow_server_shows_in_utilization():
    busy_server = monsoon.train("logistic", "async", 16, engine="sim", steps=800, shards=1,
                                sim_service_s=1e-3, seed=0).summary["utilization"]
    assert busy_server["shards"] > 0.9 and busy_server["workers"] < 0.2


def test_simulate_command_writes_a_run_folder(tmp_path, capsys):
    code = cli_main(["simulate", "--problem", "logistic", "--strategy", "async", "--workers",
                     "200", "--steps", "2000", "--latency-s", "1e-4", "--straggler-p", "0.05",
                     "--out", str(tmp_path / "sim"), "--quiet"])
    assert code == 0
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["engine"] == "sim" and summary["workers"] == 200
    assert 0 < summary["utilization"]["workers"] <= 1
    assert summary["delays"]["latency_s"] == 1e-4
    assert "simulated" in capsys.readouterr().out


def test_compare_on_the_sim_engine(tmp_path):
    comparison = monsoon.compare("logistic", "serial,sync,async,hogwild", workers=32,
                                 out=tmp_path, engine="sim", steps=200, batch_size=32)
    assert {r["strategy"] for r in comparison.rows} == {"serial", "sync", "async", "hogwild"}
    assert (tmp_path / "comparison.png").exists()
    assert all(r.summary["engine"] == "sim" for r in comparison.results.values())


def test_bad_delay_model_is_refused():
    with pytest.raises(ConfigError, match="straggler probability"):
        monsoon.train("linear", "async", 4, engine="sim", steps=10, sim_straggler_p=2.0)


@pytest.mark.parametrize("flag,value,words", [
    ("--latency-s", "inf", "latency must be a finite number, got inf"),
    ("--compute-s", "inf", "compute time must be a finite number, got inf"),
    ("--compute-s", "1e400", "compute time must be a finite number, got inf"),
    ("--service-s", "inf", "service time must be a finite number, got inf"),
    ("--straggler-factor", "inf", "straggler factor must be a finite number, got inf"),
    ("--compute-sigma", "inf", "compute sigma must be a finite number, got inf"),
    ("--compute-sigma", "nan", "compute sigma must be a finite number, got nan"),
    ("--compute-sigma", "50", "compute sigma must be in [0, 3]"),
    ("--compute-sigma", "3.01", "compute sigma must be in [0, 3]"),
])
def test_a_delay_without_a_finite_meaning_is_refused_in_one_line(tmp_path, capsys, flag,
                                                                 value, words):
    """--latency-s inf simulated "inf s" and wrote rows of inf; --compute-sigma 50
    "0 s" (every draw underflowed): each is now refused before the run."""
    out = tmp_path / "run"
    assert cli_main(["simulate", "--problem", "linear", "--strategy", "async", "--workers",
                     "4", "--steps", "200", "--quiet", "--out", str(out), flag, value]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and flag in lines[0], lines
    assert not out.exists()


def test_the_delay_model_itself_refuses_what_has_no_finite_meaning():
    from monsoon.engines.sim.delays import DelayModel

    for field in ("compute_s", "latency_s", "bandwidth_Bps", "service_s", "straggler_factor"):
        with pytest.raises(ConfigError, match="finite"):
            DelayModel(**{field: float("inf")})
    with pytest.raises(ConfigError, match=r"in \[0, 3\]"):
        DelayModel(compute_sigma=50.0)
    DelayModel(compute_sigma=3.0)  # the largest spread taken


def test_each_delay_option_sets_its_own_field_of_the_delay_model():
    """``delay_model`` hands the options over in the order of the fields."""
    from dataclasses import fields

    from monsoon.engines.sim.delays import OPTIONS, DelayModel

    assert ([o.name.removeprefix("sim_") for o in OPTIONS]
            == [f.name.replace("bandwidth_Bps", "bandwidth") for f in fields(DelayModel)])


def test_hogwild_reads_are_inconsistent_in_the_sim():
    """A Hogwild! worker's read spans its compute time: with 4 shards, other
    workers' updates land between its shard reads, so some gradients are
    taken on parameters that match no single version of the shared vector."""
    from monsoon.engines.sim import engine as sim_engine

    reads, torn = {}, []
    read_shard = sim_engine.SimEngine._read_shard
    on_snapshot = sim_engine.SimEngine._gradient_on_snapshot

    def spy_read(self, w, s):
        reads.setdefault(w.rank, []).append(self.total["updates"])
        return read_shard(self, w, s)

    def spy_gradient(self, w, indices):
        versions = reads.pop(w.rank)
        assert len(versions) == 4
        torn.append(len(set(versions)) > 1)
        return on_snapshot(self, w, indices)

    sim_engine.SimEngine._read_shard = spy_read
    sim_engine.SimEngine._gradient_on_snapshot = spy_gradient
    try:
        run = monsoon.train("linear", "hogwild", 8, engine="sim", steps=400, shards=4, seed=1,
                            sim_compute_sigma=0.5)
    finally:
        sim_engine.SimEngine._read_shard = read_shard
        sim_engine.SimEngine._gradient_on_snapshot = on_snapshot
    assert len(torn) == 400
    assert 0.2 < sum(torn) / len(torn) < 1.0  # many reads torn, not all
    assert np.isfinite(run.summary["final_loss"])


@pytest.mark.parametrize("workers,steps,service_s,shards", [(8, 200, 1e-2, 1), (4, 400, 1e-3, 2)])
def test_a_shard_is_never_busy_past_the_simulations_end(workers, steps, service_s, shards):
    """A request's service is counted up to the simulation's end: a saturated
    shard is busy at most 100% of the simulated time."""
    summary = monsoon.train("linear", "async", workers, engine="sim", steps=steps,
                            sim_service_s=service_s, shards=shards, seed=0).summary
    assert 0.9 < summary["utilization"]["shards"] <= 1.0


@pytest.mark.parametrize("strategy,options", [
    ("sync", dict(batch_size=2048, steps=6)),
    ("async", dict(batch_size=16, steps=40)),
    ("ssp", dict(batch_size=16, steps=40)),
    ("hogwild", dict(batch_size=16, steps=40)),
])
def test_a_rows_examples_are_those_of_the_steps_it_holds(strategy, options):
    """A row paired the parameters after k updates with the examples of
    k + 1 steps: a gradient's examples were counted when it was computed.
    ``train --engine sim --problem logistic --strategy sync --workers 2
    --steps 6 --batch-size 16384`` had rows (0 updates, 16384 examples,
    epoch 1.0, the initial loss) and (5, 98304, epoch 6.0); async's first
    rows were (0, 16), (0, 32). Now a row counts the examples of the
    gradients the server has taken: a step still gathering, or a push in
    flight, is not counted until it lands."""
    delays = dict(sim_compute_sigma=0.5)
    if strategy != "hogwild":  # its updates are made in memory: no message to delay
        delays.update(sim_latency_s=2e-4, sim_service_s=1e-4)
    res = monsoon.train("logistic", strategy, 2, engine="sim", seed=1, **delays, **options)
    rows = res.history
    assert len(rows) > 4
    for row in rows:
        assert row["examples"] == row["updates"] * options["batch_size"], row
    assert res.summary["examples"] == rows[-1]["examples"]

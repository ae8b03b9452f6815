"""The benchmarks that reach into monsoon's internals (not only through
``monsoon.train``) still run against them: each imports, and the pipeline
benchmark's stage timing and channel cost run on a tiny model. The SSP
sweep's acceptance criteria are judged on rows built here. The Hogwild!
benchmark's shapes, its refusal of others and its ``why`` (one line, as the
render needs) are checked too. No figure is checked here; speed is measured
in bench/ only."""
import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))


@pytest.mark.parametrize("name", ["checkpoint_cost", "pipeline", "spark_overhead",
                                  "spark_vs_mllib", "spark_vs_torchdistributor"])
def test_the_benchmark_imports_what_it_uses(name):
    module = importlib.import_module(name)
    assert callable(module.main)


@pytest.mark.slow
def test_the_pipeline_benchmark_times_stages_and_channels():
    import pipeline

    took = pipeline.stage_compute(pipeline.problem(16, 64), 32, 4, repeats=1)
    assert len(took) == 2 and all(t > 0 for t in took)
    latency, bandwidth = pipeline.channel_cost(1 << 16, compute_s=0.0, rounds=6)
    assert latency > 0 and bandwidth > 0


def _ssp_rows(problem, workers, lr, losses, speedups=None):
    """One (problem, workers, lr) group of ssp_sweep rows: final loss over BSP's
    per setting, and time to target sooner than BSP (1.0 where not given)."""
    speedups = speedups or {}
    return [{"problem": problem, "workers": workers, "lr": lr, "setting": s,
             "bound": int(s[1:]) if s.startswith("S") else None,
             "final_loss_vs_sync": loss, "speedup_to_target_vs_sync": speedups.get(s, 1.0)}
            for s, loss in losses.items()]


def test_the_ssp_sweep_judges_its_second_criterion_where_async_is_hurt():
    import ssp_sweep

    fast = _ssp_rows("logistic", 32, 0.1, {"S0": 1.0, "S1": 1.0, "S4": 1.0, "async": 1.0},
                     {"S4": 2.0, "async": 3.0})
    hurt = {"S0": 1.0, "S1": 0.997, "S4": 1.02, "async": 1.214}
    rescued = ssp_sweep.summarize(fast + _ssp_rows("linear", 128, 0.01, hurt))
    assert rescued["met"] and rescued["rescue_ok"] == [True] and "why" not in rescued
    # the same problem and rate at 32 workers is another setting, judged on its own
    hurt_32 = _ssp_rows("linear", 32, 0.01, {**hurt, "S1": 1.03, "S4": 1.04})
    missed = ssp_sweep.summarize(fast + _ssp_rows("linear", 128, 0.01, hurt) + hurt_32)
    assert not missed["met"] and sorted(missed["rescue_ok"]) == [False, True]
    assert "linear 32 workers lr 0.01" in missed["why"] and "S1, 1.030x" in missed["why"]
    assert "128 workers" not in missed["why"]


def test_the_ssp_sweep_counts_an_untested_second_criterion_as_not_met():
    import ssp_sweep

    summary = ssp_sweep.summarize(_ssp_rows(
        "logistic", 32, 0.1, {"S0": 1.0, "S1": 1.0, "async": 1.02}, {"S1": 2.0}))
    assert summary["speed_ok"] == [True] and not summary["met"]
    assert "untested" in summary["why"]


def test_the_hogwild_benchmark_sweeps_its_shapes_and_refuses_others(monkeypatch, capsys):
    import hogwild_vs_torch as bench

    deep = bench.mlp(bench.SHAPES["mlp512x2"][0])
    assert [m.out_features for m in deep if hasattr(m, "out_features")] == [512, 512, 10]
    assert not isinstance(deep[-1], bench.nn.ReLU)  # the logits go to the loss as they are
    assert bench.geometric_mean([0.5, 2.0]) == pytest.approx(1.0)
    monkeypatch.setattr(sys, "argv", ["hogwild_vs_torch.py", "--shapes", "mlp256,mlp9"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "unknown shape(s) mlp9: choose from mlp256,mlp1024,mlp512x2" in capsys.readouterr().err


def test_the_hogwild_benchmarks_why_is_one_line_the_render_takes():
    import hogwild_vs_torch as bench

    shape = {"name": "mlp256", "ratio": 0.9, "ratio_runs": [0.8, 0.95],
             "rates": {"monsoon": [9.0e4, 9.5e4], "torch": [1.0e5, 1.2e5]}, "cold_s": 0.007,
             "steps": {"monsoon": 900.0, "torch": 950.0, "gather": 30.0, "finite": 10.0},
             "run_s": 2.0}
    why = bench.why([shape, {**shape, "name": "mlp1024"}], 0.9)
    assert "\n" not in why and "|" not in why
    assert ("mlp1024 0.90x (runs 0.80-0.95, PyTorch's 100,000-120,000), step 900 vs 950 us "
            "(1.06x), 30 + 10 us") in why and "0.4% of a run" in why

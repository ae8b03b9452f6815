"""The benchmarks that reach into monsoon's internals (not only through
``monsoon.train``) still run against them: each imports, and the pipeline
benchmark's stage timing and channel cost run on a tiny model. The SSP
sweep's acceptance criteria are judged on rows built here. No figure is
checked here; speed is measured in bench/ only."""
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

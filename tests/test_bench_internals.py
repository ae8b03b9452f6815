"""The benchmarks that reach into monsoon's internals (not only through
``monsoon.train``) still run against them: each imports, and the pipeline
benchmark's stage timing and channel cost run on a tiny model. The Hogwild!
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

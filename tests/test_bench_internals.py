"""The benchmarks that reach into monsoon's internals (not only through
``monsoon.train``) still run against them: each imports, and the pipeline
benchmark's stage timing and channel cost run on a tiny model. No figure is
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

"""Ray is optional: without it the ray engine says how to install it."""
import sys

import pytest

import monsoon


def test_missing_ray_gives_install_advice(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(monsoon.ConfigError, match=r"pip install 'monsoon\[ray\]'"):
        monsoon.train("exp", "async", 2, engine="ray", epochs=1)


@pytest.mark.parametrize("workers, cpus, each", [(2, 2, 1.0), (2, 16, 1.0), (4, 2, 0.5),
                                                 (3, 2, 0.66), (8, 0, 0.0)])
def test_each_worker_reserves_its_share_of_the_clusters_cpus(workers, cpus, each):
    """One CPU a worker where the cluster has them (Ray then spreads workers
    over nodes of one CPU), else an equal share that still fits them all."""
    from monsoon.engines.ray.engine import cpus_per_worker

    assert cpus_per_worker(workers, cpus) == each
    assert workers * cpus_per_worker(workers, cpus) <= max(cpus, 0)

"""Ray is optional: without it the ray engine says how to install it."""
import sys

import pytest

import monsoon


def test_missing_ray_gives_install_advice(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(monsoon.ConfigError, match=r"pip install 'monsoon\[ray\]'"):
        monsoon.train("exp", "async", 2, engine="ray", epochs=1)


@pytest.mark.parametrize("workers, cpus, each", [(2, 2, 1.0), (2, 16, 1.0), (4, 2, 0.5),
                                                 (3, 2, 0.5), (5, 2, 0.25), (100, 3, 1 / 64),
                                                 (8, 0, 0.0)])
def test_each_worker_reserves_its_share_of_the_clusters_cpus(workers, cpus, each):
    """One CPU a worker where the cluster has them (Ray then spreads workers
    over nodes of one CPU), else the largest share 1/2^k that still fits
    them all (so 3 and 4 workers on 2 CPUs reserve the same share)."""
    from monsoon.engines.ray.engine import cpus_per_worker

    assert cpus_per_worker(workers, cpus) == each
    assert workers * cpus_per_worker(workers, cpus) <= max(cpus, 0)


@pytest.mark.parametrize("workers, threads", [(1, 8), (4, 8), (5, 16), (12, 16), (13, 32)])
def test_a_server_actor_has_a_thread_for_each_worker_and_the_driver(workers, threads):
    """A shard's or clock's threads: one per worker plus the driver's, in
    steps of powers of two, so runs of 2 to 4 workers share one shape."""
    from monsoon.engines.ray.engine import server_threads

    assert server_threads(workers) == threads >= workers + 4

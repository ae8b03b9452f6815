"""The ray engine on a two-node Ray cluster made on this machine
(ray.cluster_utils.Cluster: a head node and a worker node, one CPU each),
joined by address as a user joins a real cluster. The runs use the NumPy
problem "logistic": each actor then starts without importing torch."""
import numpy as np
import pytest

import monsoon

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray
LAST_IN_GROUP = True  # it stops the session's local_ray (conftest.py): none after restarts it


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, connect=False,
                head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def test_two_nodes_sync_equals_serial(cluster):
    """Sync x4 across the two nodes equals serial on the full batch."""
    opts = dict(steps=12, batch_size=16384, dtype="float64", seed=2, lr=0.5)  # every example
    serial = monsoon.train("logistic", "serial", **opts)
    # one shard (on the head): the claim is the workers' nodes; test_ray splits the server.
    # 4 workers on 2 CPUs: each reserves half a CPU (cpus_per_worker), two a node; a
    # reservation of a whole CPU each could not be placed and the run would time out
    run = monsoon.train("logistic", "sync", 4, engine="ray", address=cluster.address, shards=1,
                        timeout=60, **opts)
    np.testing.assert_allclose(run.params, serial.params, rtol=1e-6, atol=1e-12)
    assert not ray.is_initialized()  # monsoon joined, and left, the cluster


def test_two_nodes_async_reaches_serial_loss(cluster):
    """The ray engine's async run (a worker a node, one shard on the head)
    does serial's budget and ends within 10% of its loss, with stale pushes."""
    opts = dict(epochs=1, seed=0)
    serial = monsoon.train("logistic", "serial", **opts).summary
    run = monsoon.train("logistic", "async", 2, engine="ray", address=cluster.address,
                        shards=1, **opts).summary
    assert run["examples"] == serial["examples"]
    assert run["final_loss"] <= 1.10 * serial["final_loss"]
    assert run["staleness"]["max"] >= 1
    assert len(run["failed_workers"]) == 0

"""The ray engine on a two-node Ray cluster made on this machine
(ray.cluster_utils.Cluster: a head node and a worker node, one CPU each),
joined by address as a user joins a real cluster."""
import numpy as np
import pytest

import monsoon

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def test_two_nodes_sync_equals_serial(cluster):
    opts = dict(steps=12, batch_size=1438, dtype="float64", seed=2, lr=0.05)  # digits less 20%
    serial = monsoon.train("digits", "serial", **opts)
    run = monsoon.train("digits", "sync", 2, engine="ray", address=cluster.address, **opts)
    np.testing.assert_allclose(run.params, serial.params, rtol=1e-6, atol=1e-12)
    assert not ray.is_initialized()  # monsoon joined, and left, the cluster


def test_two_nodes_async_reaches_serial_loss(cluster):
    serial = monsoon.train("digits", "serial", seed=0).summary
    run = monsoon.train("digits", "async", 2, engine="ray", address=cluster.address,
                        seed=0).summary
    assert run["final_loss"] <= 1.10 * serial["final_loss"]
    assert len(run["failed_workers"]) == 0

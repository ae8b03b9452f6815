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


@pytest.mark.parametrize("given", ["--address", "RAY_ADDRESS"])
def test_an_address_where_no_cluster_answers_fails_in_one_line(given, tmp_path):
    """--address (or Ray's RAY_ADDRESS, which ray.init joins without one)
    at a closed port of this machine: the run ends with one line that says
    no cluster answered there and what to change, before ray.init (which
    retries such an address for minutes, saying only Ray's own warnings);
    the wall limit is a generous bound on "minutes", not a speed claim."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    closed = socket.socket()  # bound, never listening: a connect to it is refused
    closed.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{closed.getsockname()[1]}"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, "-m", "monsoon", "train", "--engine", "ray", "--timeout", "10",
            "--problem", "logistic", "--strategy", "async", "--workers", "2", "--epochs", "1",
            "--out", str(tmp_path / "x"), "--quiet"]
    if given == "--address":
        argv += ["--address", address]
    else:
        env["RAY_ADDRESS"] = address
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env)
    finally:
        closed.close()
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()  # no Ray warnings: ray.init never ran
    assert len(lines) == 1, proc.stderr
    if given == "--address":
        assert f"no Ray cluster answered at --address {address}" in lines[0]
        assert "ray start --head" in lines[0] and "omit --address" in lines[0]
    else:
        assert f"no Ray cluster answered at RAY_ADDRESS={address}" in lines[0]
        assert "unset RAY_ADDRESS" in lines[0]


def test_a_port_that_answers_but_is_no_ray_cluster_is_refused_in_time(cluster):
    """A port that accepts connections but is no Ray cluster (Ray's
    dashboard or another HTTP/1 server; a port nothing reads) is refused
    in one line within --timeout: ray.init retried such a port for over
    200 s, heeding neither --timeout nor SIGTERM. The cluster's own GCS
    passes the same check."""
    import http.server
    import socket
    import threading
    import time

    from monsoon.engines.ray.address import check_address
    from monsoon.errors import ConfigError

    check_address(cluster.address, 5)  # Ray's GCS speaks gRPC
    web = http.server.ThreadingHTTPServer(("0.0.0.0", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    silent = socket.socket()  # listens, never reads
    silent.bind(("0.0.0.0", 0))
    silent.listen(4)
    try:
        for port in (web.server_address[1], silent.getsockname()[1]):
            t0 = time.monotonic()
            with pytest.raises(ConfigError, match="but it is no Ray cluster") as err:
                check_address(f"127.0.0.1:{port}", 3)
            assert time.monotonic() - t0 < 3 + 2  # --timeout, not Ray's minutes
            assert "6379 unless set" in str(err.value) and "fix --address" in str(err.value)
    finally:
        web.shutdown()
        web.server_close()
        silent.close()


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


def test_ray_address_in_the_environment_joins_that_cluster(cluster, monkeypatch):
    """Without --address, a RAY_ADDRESS set in the environment (as on a
    Ray cluster's nodes) is the cluster ray.init joins; the run used to fail
    there ("num_cpus ... must not be provided"), asking Ray for a local
    instance's CPUs."""
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    run = monsoon.train("logistic", "async", 2, engine="ray", steps=20, seed=0, timeout=60)
    assert run.summary["status"] == "finished" and run.summary["examples"] > 0
    assert not ray.is_initialized()  # joined, and left, the cluster


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

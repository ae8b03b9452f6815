"""Losing a node is not losing the run (issue 38): a real two-node Ray
cluster, each node in its own network namespace (``netns.py``), token
authentication on, as a user sets it up; mid-run the second node's link
goes down, a network partition, not a clean kill.

- async keeps its parameter server on the driver's node
  (``engines/ray/engine.on_driver_node``): the partition takes only the
  worker on the lost node, which is named in ``failed_workers``, and the
  run finishes on the other, within 5% of an uninterrupted run's loss;
- sync with ``--elastic`` carries on with the worker left when the link
  goes down, takes node b's worker back once b has rejoined, and ends
  where serial SGD does (each step is still the full-batch gradient);
- sync, which needs every worker, fails within ``--timeout`` in one line
  with the run folder written (``"status": "failed"``) and the ``--resume``
  command, never a traceback; once node b is back, the same command with
  ``--resume`` ends bit-identical to an uninterrupted run.
"""
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import monsoon
import netns

# three runs on a two-node cluster and a node rejoining: minutes on a busy machine
# Its own xdist group: its clusters live in network namespaces with their own
# RAY_TMPDIR, which no other test's ray.init() can find or reach, so it runs
# beside the tests of the session's local Ray instance.
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.xdist_group("ray-netns")]

ROOT = Path(__file__).resolve().parents[1]
PORT = 6391
WHY = netns.available()
RAY = Path(sys.executable).with_name("ray")


@pytest.fixture(scope="module")
def head():
    """(net, env, live): the namespaces, a Ray head in "head", and whether
    node b is joined and has not been cut since (``live["b"]``)."""
    if WHY:
        pytest.skip(WHY)
    pytest.importorskip("ray")
    token = secrets.token_hex(32)
    net = netns.Net(["head", "b"])
    tmp = {n: f"/tmp/mr{os.getpid() % 100000}{n[0]}" for n in net.nodes}  # short: socket paths
    base = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
            # a partitioned node is declared dead after ~2 s, not Ray's default ~30 s
            "RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
            "RAY_health_check_failure_threshold": "4",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
            "RAY_USAGE_STATS_ENABLED": "0"}
    env = {n: {**base, "RAY_TMPDIR": tmp[n]} for n in net.nodes}
    try:
        addr = net.addr["head"]
        net.run("head", [str(RAY), "start", "--head", "--block", f"--port={PORT}",
                         f"--node-ip-address={addr}", "--num-cpus=1",
                         "--include-dashboard=false"], env=env["head"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_nodes(net, env["head"], "READY")
        yield net, env, {"b": False}
    finally:
        net.close()
        for path in tmp.values():
            shutil.rmtree(path, ignore_errors=True)


def _join_b(net, env) -> None:
    """A fresh node in "b" joined to the head (a node Ray declared dead
    does not come back: its raylet is replaced; the old one is dead to the
    head, so it is not given time to stop cleanly)."""
    net.kill(["b"], grace_s=1)
    net.run("b", [str(RAY), "start", "--block", f"--address={net.addr['head']}:{PORT}",
                  f"--node-ip-address={net.addr['b']}", "--num-cpus=1"], env=env["b"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_nodes(net, env["head"], 2)


@pytest.fixture
def cluster(head):
    """(net, the driver's env, rejoin): two live nodes; ``rejoin()`` brings
    node b back after a cut, as its operator would. Node b is joined again
    only where the test before cut it and did not bring it back."""
    net, env, live = head
    if not live["b"]:
        _join_b(net, env)
    live["b"] = False  # every test cuts it; its rejoin() says it is back

    def rejoin():
        _join_b(net, env)
        live["b"] = True

    return net, env["head"], rejoin


# One process polls the head's node table (no driver joins, no job starts):
# it exits 0 once exactly ``want`` nodes are alive ("READY": once the head
# answers), or 1 after its timeout.
PROBE = """
import socket, sys, time
from ray._raylet import GcsClient
from ray.core.generated.gcs_pb2 import GcsNodeInfo
address, want, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
host, port = address.split(":")
deadline = time.monotonic() + timeout
client = None
while time.monotonic() < deadline:
    try:
        socket.create_connection((host, int(port)), 1).close()  # GcsClient() blocks 40 s if not
        if want == "READY":
            sys.exit(0)
        client = client or GcsClient(address=address)
        nodes = client.get_all_node_info(timeout=5).values()
        if sum(n.state == GcsNodeInfo.ALIVE for n in nodes) == int(want):
            sys.exit(0)
    except Exception:
        pass  # not listening yet, or a call timed out
    time.sleep(0.2)
sys.exit(1)
"""


def _wait_for_nodes(net, env, count, timeout=90) -> None:
    """Wait until exactly ``count`` nodes are alive in the head's table
    ("READY": until the head answers)."""
    proc = net.run("head", [sys.executable, "-c", PROBE, f"{net.addr['head']}:{PORT}",
                            str(count), str(timeout)], env=env)
    if proc.wait(timeout + 30) != 0:
        raise TimeoutError(f"the Ray head did not count {count} live nodes in {timeout} s")


def _written(out, proc, pattern, min_bytes, what, timeout=120) -> None:
    """Wait until the running ``proc`` has written a file ``out/pattern`` of
    at least ``min_bytes``: live rows (it trains), or a checkpoint."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(f.stat().st_size >= min_bytes for f in out.glob(pattern)):
            return
        time.sleep(0.05)
    raise AssertionError(f"the run never {what} (exit code {proc.poll()})")


def _train(net, env, out, strategy, epochs, cut_after_s=None, problem="exp", extra=(),
           after_checkpoint=False, while_cut=None, times=None, budget="--epochs",
           end_within=180):
    """``monsoon train`` on the cluster from the head's namespace; the
    second node's link goes down ``cut_after_s`` after the run trains (after
    its first checkpoint, with ``after_checkpoint``), and back up once the
    run has ended, or, given ``while_cut``, once that has been called
    (with the running process); None: no cut. ``times`` gets the
    monotonic times of the cut ("cut") and of the run's end ("ended").
    ``epochs`` is the run's budget, in ``budget`` (``--epochs`` or ``--steps``);
    the run must end within ``end_within`` seconds of the cut."""
    argv = [sys.executable, "-X", "faulthandler", "-m", "monsoon", "train", "--engine", "ray",
            "--address",
            f"{net.addr['head']}:{PORT}", "--problem", problem, "--strategy", strategy,
            "--workers", "2", budget, str(epochs), "--seed", "0", "--timeout", "15",
            "--evals", "10", "--quiet", "--live-every", "0.2", "--checkpoint-every", "100",
            "--out", str(out), *extra]
    proc = net.run("head", argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   text=True, cwd=out.parent)
    if cut_after_s is None:
        _, err = proc.communicate(timeout=180)
        return proc.returncode, err
    if after_checkpoint:  # a --resume then has a checkpoint to take
        _written(out, proc, "checkpoints/ckpt-*.npz", 1, "wrote a checkpoint")
    else:  # its live series have rows (every 0.2 s)
        _written(out, proc, "tb/events.out.tfevents.*", 1000, "started training")
    time.sleep(cut_after_s)
    net.cut("b")
    cut_at = time.monotonic()
    try:
        if while_cut is not None:
            while_cut(proc)
            net.restore("b")
        try:
            _, err = proc.communicate(timeout=end_within)
        except subprocess.TimeoutExpired:  # faulthandler writes every thread's stack
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"the run did not end within {end_within} s; its stderr:\n"
                                 f"{err[-3000:]}")
    finally:
        net.restore("b")
    if times is not None:
        times.update(cut=cut_at, ended=time.monotonic())
    return proc.returncode, err


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def test_async_loses_the_worker_on_a_partitioned_node_and_finishes(cluster, tmp_path):
    net, env, _ = cluster
    # the uninterrupted reference: the same run on the local engine, in
    # process. Async on logistic is on its loss plateau (~0.26) from the
    # first epoch: on the local engine, 1 to 6 epochs and 3 to 5 seeds each
    # end within 1.5% of one another, well inside the 5% bound.
    whole = monsoon.train("logistic", "async", 2, epochs=3, seed=0, evals=10, timeout=15,
                          progress=False).summary
    out = tmp_path / "cut"
    rc, err = _train(net, env, out, "async", 3, cut_after_s=1, problem="logistic")
    assert rc == 0, err
    assert "Traceback" not in err
    s = _summary(out)
    assert s["status"] == "finished"
    assert len(s["failed_workers"]) == 1, s["failed_workers"]  # the worker on node b
    assert "node" in s["failed_workers"][0]["error"]  # Ray's word: its node was lost
    assert s["examples"] < whole["examples"]  # the lost worker's share was not done
    assert abs(s["final_loss"] / whole["final_loss"] - 1) <= 0.05, (s["final_loss"],
                                                                    whole["final_loss"])


@pytest.mark.timeout(480)  # 158 s of its 180 s on CI's machine at stop 71
def test_elastic_sync_carries_on_and_takes_the_returning_node_back(cluster, tmp_path):
    net, env, rejoin = cluster
    out = tmp_path / "cut"

    def node_b_returns(proc):
        _wait_for_nodes(net, env, 1, timeout=30)  # Ray declares b dead after ~2 s of failed checks
        assert proc.poll() is None, "the run ended before node b came back"
        net.restore("b")
        rejoin()

    # 8,000 steps: node b is declared dead ~2 s after the cut and a fresh
    # raylet joins ~10-15 s later, well before the run's end (at 3,200 steps,
    # a loaded machine ended the run, ~20 s, before the raylet had joined)
    epochs = 500
    rc, err = _train(net, env, out, "sync", epochs, cut_after_s=1, extra=("--elastic",),
                     while_cut=node_b_returns, end_within=330)
    assert rc == 0, err
    assert "Traceback" not in err
    s = _summary(out)
    assert s["status"] == "finished" and s["elastic"] is True
    events = s["membership"]
    assert [e["event"] for e in events] == ["left", "joined"], events
    lost = events[0]["worker"]
    assert events[1]["worker"] == lost and events[0]["members"] == [1 - lost]
    assert events[1]["members"] == [0, 1] and 0 < events[0]["step"] <= events[1]["step"]
    assert "node" in events[0]["reason"]  # Ray's word: the worker's node was lost
    assert [f["worker"] for f in s["failed_workers"]] == [lost]
    serial = monsoon.train("exp", "serial", epochs=epochs, seed=0).summary  # the same steps
    assert s["updates"] == serial["updates"]
    assert abs(s["final_loss"] / serial["final_loss"] - 1) <= 0.01, (s["final_loss"],
                                                                     serial["final_loss"])


def test_sync_fails_in_one_line_and_resumes_bit_identical(cluster, tmp_path):
    net, env, rejoin = cluster
    # the uninterrupted reference runs on the cluster too: the local engine's
    # sync ends a few bits away from the Ray engine's (same options), so it is
    # no bit-for-bit reference. logistic (NumPy): the claim is the engine's,
    # and neither the three drivers nor their actors import torch.
    run = dict(problem="logistic", budget="--steps")
    steps = 1000  # the cut comes 0.5 s after the first checkpoint (step 100)
    rc, err = _train(net, env, tmp_path / "whole", "sync", steps, **run)
    assert rc == 0, err
    out = tmp_path / "cut"
    times = {}
    rc, err = _train(net, env, out, "sync", steps, cut_after_s=0.5, after_checkpoint=True,
                     times=times, **run)
    assert rc != 0 and times["ended"] - times["cut"] < 15 + 10  # --timeout (15 s), and its exit
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--resume" in lines[0], err
    assert "node was terminated" in lines[0]  # Ray's reason: the worker's node was lost
    s = _summary(out)
    assert s["status"] == "failed" and s["failed_worker"] in (0, 1), s
    rejoin()  # the link is back: node b rejoins, and the same command resumes
    rc, err = _train(net, env, out, "sync", steps, extra=("--resume", str(out)), **run)
    assert rc == 0, err
    s, whole = _summary(out), _summary(tmp_path / "whole")
    assert s["status"] == "finished" and s["resumed_from"]
    assert s["final_loss"] == whole["final_loss"] and s["updates"] == whole["updates"]
    assert np.array_equal(np.load(out / "params.npy"), np.load(tmp_path / "whole" / "params.npy"))

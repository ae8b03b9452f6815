"""Losing a node, on the torch engine (issue 38): two torchrun agents, one
in each of two network namespaces (``netns.py``), meet at a c10d
rendezvous hosted by the head's agent, as two machines would
(``--local-addr``, ``--rdzv-conf is_host``, ``GLOO_SOCKET_IFNAME``: what a
user sets where the host name does not resolve to the node's address).
After the run's first checkpoint, node b's link goes down: a partition,
not a kill.

- Without restarts, the head's rank fails within ``--timeout``, in one
  line that names rank 1 and the ``--resume`` command, and rank 0 writes
  the run folder (``"status": "failed"``), not the cut-off rank.
- With torchrun's ``--max-restarts 1``, both agents restart their ranks
  once the link is back (each for its rank's failure, or node b's for the
  head's new rendezvous round: then the agents' restart counts differ, and
  the ranks meet in rank 0's attempt, ``collectives.join_attempt``), the
  run carries on from the newest checkpoint, and it ends where serial SGD
  does (sync in float64 equals serial).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import monsoon
import netns

pytestmark = [pytest.mark.torchrun, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
WHY = netns.available()
STEPS, TIMEOUT = 1000, 10  # the cut comes at step ~50, right after the first checkpoint


@pytest.fixture
def net():
    if WHY:
        pytest.skip(WHY)
    pytest.importorskip("torch")
    net = netns.Net(["head", "b"])
    try:
        yield net
    finally:
        net.close()


def _torchrun(net, node, out, restarts, log):
    """One node's torchrun agent: one rank, 2 nodes, sync on exp, float64."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           "OMP_NUM_THREADS": "1",
           "GLOO_SOCKET_IFNAME": "br0" if node == "head" else net.link[node][0]}
    port = 29000 + os.getpid() % 1000
    argv = [str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{net.addr['head']}:{port}", "--rdzv-id", "lost-node",
            "--rdzv-conf", f"is_host={int(node == 'head')}", "--local-addr", net.addr[node],
            "--max-restarts", str(restarts),
            "-m", "monsoon", "train", "--engine", "torch", "--workers", "2", "--strategy", "sync",
            "--problem", "exp", "--dtype", "float64", "--quiet", "--timeout", str(TIMEOUT),
            "--steps", str(STEPS), "--checkpoint-every", "50", "--out", str(out)]
    return net.run(node, argv, env=env, cwd=ROOT, stdout=open(log, "w"),
                   stderr=subprocess.STDOUT)


def _cut_after_first_checkpoint(net, out, head, timeout=90):
    deadline = time.monotonic() + timeout
    while not list(out.glob("checkpoints/ckpt-*.npz")):
        assert head.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint within {timeout} s"
        time.sleep(0.005)
    net.cut("b")
    return time.monotonic()


def _monsoon_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("monsoon:")]


def _logs(logs: dict) -> str:
    return "\n".join(f"--- node {node} ---\n{log.read_text()}" for node, log in logs.items())


def test_a_cut_rank_fails_the_run_within_timeout_in_one_line(net, tmp_path):
    out = tmp_path / "run"
    head = _torchrun(net, "head", out, 0, tmp_path / "head.log")
    _torchrun(net, "b", out, 0, tmp_path / "b.log")
    cut = _cut_after_first_checkpoint(net, out, head)
    code = head.wait(timeout=TIMEOUT + 60)
    assert code != 0 and time.monotonic() - cut < TIMEOUT + 15
    lines = _monsoon_lines(tmp_path / "head.log")
    assert len(lines) == 1, lines  # monsoon's own line (torchrun's agent reports after it)
    assert "rank 0:" in lines[0] and "rank 1 died, stalled or was cut off" in lines[0]
    assert f"--resume {out}" in lines[0]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "failed" and s["failed_worker"] == 1
    assert s["error"].startswith("rank 0:")  # rank 0 wrote the folder; rank 1 did not
    deadline = time.monotonic() + 60  # rank 1's line (its agent, cut off, lingers: killed)
    while not _monsoon_lines(tmp_path / "b.log") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "rank 0, if it is alive, writes the run folder" in _monsoon_lines(tmp_path / "b.log")[0]


def test_max_restarts_carries_the_run_on_once_the_link_is_back(net, tmp_path):
    out = tmp_path / "run"
    logs = {node: tmp_path / f"{node}.log" for node in ("head", "b")}
    head = _torchrun(net, "head", out, 1, logs["head"])
    b = _torchrun(net, "b", out, 1, logs["b"])
    _cut_after_first_checkpoint(net, out, head)
    deadline = time.monotonic() + TIMEOUT + 60  # until both ranks have failed (their lines)
    while not all(_monsoon_lines(log) for log in logs.values()):
        assert time.monotonic() < deadline, "a cut-off rank did not fail within --timeout"
        time.sleep(0.2)
    # both agents live through the cut (a rendezvous store read waits 60 s,
    # c10d's read_timeout); a new agent for b could not join the head's run:
    # torch 2.13's rank-0 agent publishes its workers' store in its first
    # rendezvous round only (dynamic_rendezvous.py)
    assert head.poll() is None and b.poll() is None, _logs(logs)
    net.restore("b")
    code = head.wait(timeout=200)
    assert code == 0, _logs(logs)
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "finished" and s["restarts"] >= 1, s
    assert s["resumed_at_step"] >= 50 and s["updates"] == STEPS
    with np.load(out / "checkpoints" / f"ckpt-{STEPS:012d}.npz") as f:
        params = f["params"]
    serial = monsoon.train("exp", "serial", dtype="float64", steps=STEPS, evals=0).params
    assert np.linalg.norm(params - serial) <= 1e-9 * np.linalg.norm(serial)
    assert b.wait(timeout=60) == 0

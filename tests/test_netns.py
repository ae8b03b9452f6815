"""The fault-injection harness itself (``netns.py``): nodes reach each
other over their link; a cut link stops them, a restored one lets them
through again; closing leaves no namespace behind."""
import subprocess
import sys
import time

import pytest

import netns

WHY = netns.available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

PORT = 7391
CONNECT = ("import socket, sys, time; t = time.monotonic()\n"
           "try:\n    socket.create_connection(('{host}', {port}), {timeout}).close()\n"
           "except OSError:\n    sys.exit(1)\n"
           "print(time.monotonic() - t)")


def _connect(net, host, timeout=2.0):
    """Seconds a TCP connect from node b to ``host`` took, or None if it failed."""
    proc = net.run("b", [sys.executable, "-c", CONNECT.format(host=host, port=PORT,
                                                               timeout=timeout)],
                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out, _ = proc.communicate(timeout=30)
    return float(out) if proc.returncode == 0 else None


def test_a_link_cut_and_restored():
    net = netns.Net(["a", "b"])
    try:
        host = net.addr["a"]
        server = ("import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
                  f"socket.SO_REUSEADDR, 1); s.bind(('{host}', {PORT})); s.listen(64)\n"
                  "while True:\n    s.accept()[0].close()")
        net.run("a", [sys.executable, "-c", server])
        deadline = time.monotonic() + 30
        while _connect(net, host) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _connect(net, host) is not None  # over the link
        net.cut("b")
        assert _connect(net, host, timeout=1.0) is None  # a partition
        net.restore("b")
        assert _connect(net, host) is not None
    finally:
        net.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in net.ns.values())

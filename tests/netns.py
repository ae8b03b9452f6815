"""Fault injection: nodes of a real cluster on one machine, in network
namespaces joined by veth links, with links to cut, restore and degrade.

``Net(["a", "b"])`` makes one namespace per node name, each with its
loopback up, and joins node 0 (the head) to every other node by a veth
pair on the subnet 10.231.0.0/24: node k has address 10.231.0.(k + 1).
``cut(name)`` takes the node's end of its link down (a network partition:
its processes live on and cannot reach the others), ``restore(name)``
brings it back. (Latency and loss, ``tc netem``, are not offered: this
machine's kernel has no netem qdisc.) ``run(name, argv)`` starts a process
inside a namespace;
``kill(nodes)`` ends every process in those namespaces (by the ids ``ip
netns pids`` gives, never by name); ``close()`` kills all and removes them.

``available()`` says why namespaces cannot be made here (not root, no
``ip``), or None: the tests skip, with that reason, only there.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time


def available() -> str | None:
    if not shutil.which("ip") or not os.path.exists("/proc/self/ns/net"):
        return "no iproute2 (ip) or no network namespaces on this machine"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    probe = f"monsoon-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


class Net:
    SUBNET = "10.231.0"

    def __init__(self, nodes: list[str]):
        tag = f"m{os.getpid() % 100000}"
        self.nodes = list(nodes)
        self.ns = {n: f"monsoon-{tag}-{n}" for n in nodes}
        self.addr = {n: f"{self.SUBNET}.{k + 1}" for k, n in enumerate(nodes)}
        self.link = {}   # node -> (its end's name, the head's end's name)
        self.procs: list[subprocess.Popen] = []
        try:
            for n in nodes:
                _ip("ip", "netns", "add", self.ns[n])
                _ip("ip", "link", "set", "lo", "up", ns=self.ns[n])
            head = nodes[0]
            # one bridge in the head's namespace joins every link (one subnet)
            _ip("ip", "link", "add", "br0", "type", "bridge", ns=self.ns[head])
            _ip("ip", "addr", "add", f"{self.addr[head]}/24", "dev", "br0", ns=self.ns[head])
            _ip("ip", "link", "set", "br0", "up", ns=self.ns[head])
            for k, n in enumerate(nodes[1:], start=1):
                mine, theirs = f"{tag}n{k}", f"{tag}h{k}"
                _ip("ip", "link", "add", mine, "type", "veth", "peer", "name", theirs)
                _ip("ip", "link", "set", mine, "netns", self.ns[n])
                _ip("ip", "link", "set", theirs, "netns", self.ns[head])
                _ip("ip", "link", "set", theirs, "master", "br0", ns=self.ns[head])
                _ip("ip", "link", "set", theirs, "up", ns=self.ns[head])
                _ip("ip", "addr", "add", f"{self.addr[n]}/24", "dev", mine, ns=self.ns[n])
                _ip("ip", "link", "set", mine, "up", ns=self.ns[n])
                self.link[n] = (mine, theirs)
        except BaseException:
            self.close()
            raise

    # -- faults -------------------------------------------------------------------
    def cut(self, node: str) -> None:
        _ip("ip", "link", "set", self.link[node][0], "down", ns=self.ns[node])

    def restore(self, node: str) -> None:
        _ip("ip", "link", "set", self.link[node][0], "up", ns=self.ns[node])

    # -- processes ----------------------------------------------------------------
    def run(self, node: str, argv: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns[node], *argv], **kw)
        self.procs.append(proc)
        return proc

    def pids(self, nodes=None) -> list[int]:
        out = []
        for n in nodes or self.nodes:
            got = _ip("ip", "netns", "pids", self.ns[n], check=False).stdout.split()
            out += [int(p) for p in got if p.isdigit()]
        return out

    def kill(self, nodes=None, grace_s: float = 5.0) -> None:
        """Kill every process in the nodes' namespaces (TERM, then KILL)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.pids(nodes):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while self.pids(nodes) and time.monotonic() < deadline:
                time.sleep(0.1)

    def close(self, grace_s: float = 5.0) -> None:
        """Kill what runs in the namespaces, and remove them."""
        self.kill(grace_s=grace_s)
        for proc in self.procs:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
        for ns in self.ns.values():
            _ip("ip", "netns", "del", ns, check=False)

"""A ray run's start-up: the local Ray instance a run starts for itself
runs GCS, the raylet and its agents, without the head processes its one
driver never uses (``engine.py``'s ``_head_unneeded``: the dashboard's
server, the autoscaler's monitor, the log monitor), and still trains."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent

# In a Python of its own (Ray not yet initialised there): start Ray as a run
# does, name the programs of the processes under this one (the script of a
# Python process), then train on that instance and stop it.
_SCRIPT = r'''
import json, os, sys
from pathlib import Path
import monsoon
from monsoon.engines.ray.engine import import_ray, start_ray

def parent(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])

def program(pid):
    args = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    words = [a.decode() for a in args if a.endswith(b".py") or a is args[0]]
    return os.path.basename(words[-1])

def under(top):
    pids, found = {}, {top}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                pids[int(entry.name)] = parent(entry.name)
            except (OSError, IndexError):
                pass
    grew = True
    while grew:
        new = {p for p, pp in pids.items() if pp in found} - found
        found |= new
        grew = bool(new)
    return found - {top}

ray = import_ray()
Node = ray._private.node.Node
own = {name: getattr(Node, name) for name in ("start_api_server", "start_monitor")}
start_ray(ray, None)
programs = sorted({program(p) for p in under(os.getpid()) if Path(f"/proc/{p}").exists()})
restored = all(getattr(Node, name) is f for name, f in own.items())
result = monsoon.train("exp", "async", 2, engine="ray", epochs=1, seed=0)
ray.shutdown()
print(json.dumps({"programs": programs, "restored": restored,
                  "examples": result.summary["examples"]}))
'''


def test_a_local_instance_runs_no_head_process_its_driver_never_uses():
    """The instance a run starts runs no dashboard server (``include_dashboard
    =False`` started it all the same, for usage stats), autoscaler monitor
    or log monitor (``log_to_driver=False``: no driver reads what it streams);
    GCS and the raylet run, a run trains on it, and Ray's own ``Node`` is as
    it was once ``start_ray`` returns (a later ``ray.init`` is Ray's own)."""
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    programs = seen["programs"]
    assert "gcs_server" in programs and "raylet" in programs, programs
    for unneeded in ("dashboard.py", "monitor.py", "log_monitor.py"):
        assert unneeded not in programs, programs
    assert seen["restored"], "start_ray left Ray's Node hooked"
    assert seen["examples"] > 0, seen

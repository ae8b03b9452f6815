"""Losing an executor's node on the spark engine (issue 38): a Spark
standalone cluster, a master and a worker in namespace "head" and a worker
in "b" (``netns.py``), and the driver in "head". Mid-run, b's link goes down:
Spark declares its executor lost (``spark.network.timeout``) and runs the
lost tasks again on the other; the driver applies only what a finished job
returns, so every push lands exactly once and the run finishes."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import netns

# Its own xdist group: its Spark cluster lives in network namespaces, apart
# from the session's local Spark, so it runs beside the other Spark tests.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.xdist_group("spark-netns")]

ROOT = Path(__file__).resolve().parents[1]
PORT = 7177
# the pushes go over the tasks' sockets (a few ms each): enough steps that
# the run is still going when the link is cut
STEPS = 12800
WHY = netns.available()
DRIVER = """
import json, sys
import monsoon
from monsoon.engines.spark import start_session
spark = start_session("spark://{head}:{port}", "monsoon-lost-node", conf={{
    "spark.driver.host": "{head}", "spark.network.timeout": "8s",
    "spark.network.timeoutInterval": "2s", "spark.storage.blockManagerHeartbeatTimeoutMs": "8000",
    "spark.executor.heartbeatInterval": "1s", "spark.cores.max": "2",
    "spark.executor.cores": "1", "spark.executor.memory": "1g"}})
run = monsoon.train("logistic", "async", 2, engine="spark", steps={steps}, batch_size=64,
                    n_fetch=8, n_push=8, lr=0.5, seed=0, dtype="float64", evals=4,
                    timeout=60, out=sys.argv[1], progress=False, live_every=0.2)
# the executors still registered at the end, the driver's own included
print(json.dumps({{"executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()}}))
spark.stop()
"""


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@pytest.fixture
def cluster(tmp_path):
    if WHY:
        pytest.skip(WHY)
    pytest.importorskip("pyspark")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("no Java runtime (Spark needs Java 17+)")
    net = netns.Net(["head", "b"])
    home = _spark_home()
    cls = str(home / "bin" / "spark-class")
    env = {n: {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": net.addr[n],
               "SPARK_WORKER_DIR": str(tmp_path / f"work-{n}"),
               "SPARK_LOCAL_DIRS": str(tmp_path / f"local-{n}"),
               "PYSPARK_PYTHON": sys.executable,
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
           for n in net.nodes}
    head = net.addr["head"]
    log = open(tmp_path / "cluster.log", "w")
    try:
        net.run("head", [cls, "org.apache.spark.deploy.master.Master", "--host", head,
                         "--port", str(PORT), "--webui-port", "18180"], env=env["head"],
                stdout=log, stderr=subprocess.STDOUT)
        for n, ui in (("head", 18181), ("b", 18182)):
            net.run(n, [cls, "org.apache.spark.deploy.worker.Worker",
                        f"spark://{head}:{PORT}", "--host", net.addr[n], "--cores", "1",
                        "--memory", "1g", "--webui-port", str(ui)], env=env[n], stdout=log,
                    stderr=subprocess.STDOUT)
        _wait_for_workers(tmp_path / "cluster.log", 2)
        yield net, env["head"]
    finally:
        net.close()
        log.close()


def _wait_for_workers(log: Path, count: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.read_text().count("Registering worker") >= count:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{count} Spark workers did not register in {timeout} s:\n"
                       + log.read_text()[-2000:])


def test_async_survives_a_partitioned_executor_and_applies_each_push_once(cluster, tmp_path):
    net, env = cluster
    out = tmp_path / "run"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(head=net.addr["head"], port=PORT, steps=STEPS))
    proc = net.run("head", [sys.executable, str(script), str(out)], env=env,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        files = list((out / "tb").glob("events.out.tfevents.*")) if (out / "tb").is_dir() else []
        if files and files[0].stat().st_size > 2000:
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    time.sleep(1)
    net.cut("b")
    try:
        stdout, err = proc.communicate(timeout=240)
    finally:
        net.restore("b")
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(stdout.splitlines()[-1])["executors"] == 2  # b's was lost mid-run
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "finished" and s["failed_workers"] == []
    # STEPS / 2 steps a worker, a push every 8, each applied once
    assert s["updates"] == STEPS // 8 and s["examples"] == STEPS * 64

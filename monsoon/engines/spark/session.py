"""Finding or starting the SparkSession the spark engine runs on.

A session that is already running (a notebook, the user's own
``SparkSession.builder...getOrCreate()``), or the one ``spark-submit``'s
settings describe, is used as it is and never stopped. Otherwise the
engine starts a SparkContext on ``master`` (default ``local[WORKERS]``),
without a SparkSession (its RDD jobs need none; ``start_session`` builds
one for users), and stops it after the run. A context started here tells
executors to run the driver's Python (``PYSPARK_PYTHON``) with the
driver's ``sys.path`` (so monsoon and the problem's code import there)
and, on ``local`` and ``local-cluster`` masters, to fork Python workers
from a daemon that has monsoon imported already (``daemon.py``), and torch
too unless the engine says its run needs none (``DAEMON_TORCH``: a NumPy
problem with no barrier stage). On a real cluster, install monsoon on
every node (README).
"""
from __future__ import annotations

import os
import shutil
import sys

from ...errors import ConfigError


def import_pyspark():
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise ConfigError("the spark engine needs pyspark: pip install 'monsoon[spark]'") from exc
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        raise ConfigError("the spark engine needs a Java 17+ runtime and found none: install "
                          "one (apt-get install openjdk-17-jre-headless) or set JAVA_HOME")


def active_context():
    from pyspark import SparkContext

    return SparkContext._active_spark_context


DAEMON_TORCH = "MONSOON_DAEMON_TORCH"  # "0": the daemon forks its workers without torch


def _settings(master: str, torch: bool, conf: dict | None) -> dict:
    """The Spark settings of a session started here (``conf`` last)."""
    import_pyspark()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.executorEnv.PYTHONPATH": path,
                "spark.executorEnv.PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
                f"spark.executorEnv.{DAEMON_TORCH}": "1" if torch else "0"}
    if master.startswith("local"):  # this machine's Python: monsoon imports there
        settings["spark.python.daemon.module"] = "monsoon.engines.spark.daemon"
    return {**settings, **(conf or {})}


def start_session(master: str, app_name: str = "monsoon", conf: dict | None = None,
                  torch: bool = True):
    """A new SparkSession on ``master``, configured for monsoon's executors
    (``conf``: more Spark settings, such as ``{"spark.driver.memory": "4g"}``;
    ``torch``: whether their worker daemon imports torch before it forks:
    False for a session whose runs never need it, ``daemon.py``)."""
    settings = _settings(master, torch, conf)
    start_context(master, app_name, settings)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def start_context(master: str, app_name: str, settings: dict):
    """A new SparkContext on ``master`` with ``settings`` (``_settings``),
    and no SparkSession: the engine's jobs are RDD jobs, and a session's
    SQL start-up costs seconds they never use."""
    from pyspark import SparkConf, SparkContext

    _launch_own_jvm(master, app_name, settings)
    conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(settings.items()))
    return SparkContext.getOrCreate(conf)


def _launch_own_jvm(master: str, app_name: str, settings: dict) -> None:
    """Start Spark's JVM, where this process has none yet, in a session of
    its own (and so its Python workers on a local master): a SIGTERM to
    monsoon's process group (``timeout``, a batch scheduler, ``kill --
    -PGID``) then reaches monsoon alone, which stops the run cleanly and
    the session with it, instead of killing the JVM under the run (PySpark
    keeps only SIGINT from it). The JVM still ends with this process: it
    exits when its stdin, a pipe from here, closes."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return  # a JVM is up already (an earlier session, spark-submit's): it is used
    conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(settings.items()))
    SparkContext._gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True})
    SparkContext._jvm = SparkContext._gateway.jvm


def session_for(master: str | None, workers: int, torch: bool = True):
    """(SparkContext, started): the running one; under ``spark-submit``
    (whose JVM is already up) the session its settings describe, left
    running for the script; else a context started on ``master`` (whose
    worker daemon imports torch where ``torch``), for the caller to stop."""
    import_pyspark()
    sc = active_context()
    if sc is None and not master and os.environ.get("PYSPARK_GATEWAY_PORT"):
        from pyspark.sql import SparkSession

        sc = SparkSession.builder.getOrCreate().sparkContext  # spark-submit's --master
    if sc is not None:
        if master and sc.master != master:
            raise ConfigError(f"a SparkSession on {sc.master} is already running; drop --master "
                              f"{master}, or stop that session first")
        return sc, False
    master = master or f"local[{workers}]"
    return start_context(master, "monsoon", _settings(master, torch, None)), True

"""PySpark's Python worker daemon, with monsoon (and, where the session's
runs need it, torch) imported before it forks its workers: a fresh worker
then starts in milliseconds instead of importing them again (3 s or more
each). Sessions the engine starts use it (``spark.python.daemon.module``);
on a cluster, set that option to ``monsoon.engines.spark.daemon`` where
monsoon is installed on every node.

torch (``torch.distributed``: torch models, sync's barrier stage) costs the
daemon ~2 s, on the first job's path. The executors' environment variable
``MONSOON_DAEMON_TORCH`` (``session.DAEMON_TORCH``; Spark passes
``spark.executorEnv.*`` to the daemon) says whether to import it: "0"
skips it (the engine's own session for a NumPy problem that runs no barrier
stage), anything else or unset imports it. A worker whose task needs torch
on a daemon without it imports torch itself. Only imports happen before the
fork: no torch thread pool exists yet."""
import os

import monsoon  # noqa: F401
import monsoon.engines.spark.barrier  # noqa: F401
import monsoon.engines.spark.tasks  # noqa: F401
from monsoon.engines.spark.session import DAEMON_TORCH

if os.environ.get(DAEMON_TORCH, "1") != "0":
    import torch.distributed  # noqa: F401  (torch models, sync's barrier stage)

from pyspark.daemon import manager  # noqa: E402

if __name__ == "__main__":
    manager()

"""PySpark's Python worker daemon, with monsoon (and torch) imported before
it forks its workers: a fresh worker then starts in milliseconds instead of
importing them again (3 s or more each). Sessions the engine starts use it
(``spark.python.daemon.module``); on a cluster, set that option to
``monsoon.engines.spark.daemon`` where monsoon is installed on every node.
Only imports happen before the fork: no torch thread pool exists yet."""
import monsoon  # noqa: F401
import monsoon.engines.spark.barrier  # noqa: F401
import monsoon.engines.spark.tasks  # noqa: F401
import torch.distributed  # noqa: F401  (sync's barrier stage)

from pyspark.daemon import manager

if __name__ == "__main__":
    manager()

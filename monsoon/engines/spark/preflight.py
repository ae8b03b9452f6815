"""Before a session's first job: can the executors run monsoon's tasks?

One small job (one task per default partition) reports, from each
executor's Python, ``sys.executable``, the Python version and the versions
of monsoon, numpy and scipy (and torch for a torch problem). The run is
refused, in one line, when that job cannot run at all (the executors'
Python is missing, or cannot import pyspark or monsoon: the daemon
``spark.python.daemon.module`` is monsoon's), when a module is missing, or
when a version differs from the driver's. The line names the executors'
Python and how to fix it: ``spark.pyspark.python`` / ``PYSPARK_PYTHON``,
or a packed venv shipped with ``--archives``. The probe is pickled by
value (it must run where monsoon cannot be imported). A session passes the
check once; later runs on it skip it.
"""
from __future__ import annotations

import sys

from ...errors import ConfigError, MonsoonError

_PROBE_SOURCE = '''
def probe(names):
    def run(_):
        import importlib, sys
        found = {"python": sys.executable, "version": "%d.%d" % sys.version_info[:2]}
        for name in names:
            try:
                found[name] = str(getattr(importlib.import_module(name), "__version__", "?"))
            except Exception as exc:
                found[name] = None
                found.setdefault("error", "%s: %s" % (type(exc).__name__, exc))
        return [found]
    return run
'''

_PASSED: set = set()

FIX = ("point the executors at a Python with monsoon and the driver's versions installed: "
       "--conf spark.pyspark.python=PATH (or PYSPARK_PYTHON=PATH), or ship a packed venv "
       "with --archives venv.tar.gz#venv --conf spark.pyspark.python=./venv/bin/python")


def _probe(names):
    namespace = {"__name__": "monsoon_executor_probe"}  # not importable: pickled by value
    exec(compile(_PROBE_SOURCE, "<monsoon executor probe>", "exec"), namespace)
    return namespace["probe"](tuple(names))


def driver_versions(names) -> dict:
    import importlib

    return {name: str(getattr(importlib.import_module(name), "__version__", "?"))
            for name in names}


def executor_python(sc) -> str:
    configured = sc.getConf().get("spark.pyspark.python", None)
    exe = getattr(sc, "pythonExec", None) or configured or "python3"
    return exe if not configured or configured == exe else f"{exe}; spark.pyspark.python={configured}"


def mismatch(found: list[dict], driver: dict, python: str) -> str | None:
    """What is wrong with the executors' reports, or None (pure: tested
    without Spark)."""
    for report in found:
        where = f"the executors' Python ({report.get('python') or python})"
        missing = [n for n in driver if report.get(n) is None]
        if missing:
            return (f"{where} cannot import {', '.join(missing)} "
                    f"({report.get('error', 'not installed')})")
        if report.get("version") != python_version():
            return (f"{where} is Python {report.get('version')}, the driver's is "
                    f"{python_version()}")
        for name, version in driver.items():
            if report[name] != version:
                return f"{where} has {name} {report[name]} where the driver has {version}"
    return None


def python_version() -> str:
    return "%d.%d" % sys.version_info[:2]


def check_executors(sc, timeout: float, torch: bool = False, arrow: bool = False) -> None:
    """Refuse, in one line, executors that cannot run this run's tasks
    (``arrow``: the data comes through pyarrow, ``arrow.py``)."""
    names = ["monsoon", "numpy", "scipy"] + (["torch"] if torch else []) + \
        (["pyarrow"] if arrow else [])
    if any(app == sc.applicationId and set(names) <= passed for app, passed in _PASSED):
        return
    from .jobs import Jobs

    n = max(1, int(sc.defaultParallelism))
    jobs = Jobs(sc, timeout, "preflight")
    try:
        found = jobs.run(sc.parallelize(range(n), n), _probe(names),
                         what="checking the executors' Python")
    except MonsoonError as exc:
        raise ConfigError(f"the executors' Python ({executor_python(sc)}) cannot run monsoon's "
                          f"tasks ({str(exc).split(': ', 1)[-1]}): {FIX}") from None
    finally:
        jobs.close()
    problem = mismatch(found, driver_versions(names), executor_python(sc))
    if problem:
        raise ConfigError(f"{problem}: {FIX}")
    _PASSED.add((sc.applicationId, frozenset(names)))

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
check once; later runs on it skip it. The engine's run on data of its own
has the job that loads the data into the executors carry the probe
(``carry``, one report per partition): the first job starts the
executors' Python either way, and one job costs less than two.
"""
from __future__ import annotations

import sys

from ...errors import ConfigError, MonsoonError, WaitTimeout

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


def check_executors(sc, timeout: float, torch: bool = False, arrow: bool = False,
                    carry=None):
    """Refuse, in one line, executors that cannot run this run's tasks
    (``arrow``: the data comes through pyarrow, ``arrow.py``). ``carry``:
    (rdd, func, what), the run's first job, whose results are returned: its
    tasks report too, so a session not yet checked runs one job, not two;
    where that job fails, the probe's own job tells the executors' Python
    (the check's line) from the job's own failure (its error, as it was)."""
    names = ["monsoon", "numpy", "scipy"] + (["torch"] if torch else []) + \
        (["pyarrow"] if arrow else [])
    passed = any(app == sc.applicationId and set(names) <= done for app, done in _PASSED)
    if passed and carry is None:
        return None
    from .jobs import Jobs

    jobs = Jobs(sc, timeout, "preflight")
    try:
        if passed:
            return jobs.run(carry[0], carry[1], what=carry[2])
        if carry is None:
            found, out = _probe_job(sc, jobs, names), None
        else:
            found, out = _carried(sc, jobs, names, carry)
    finally:
        jobs.close()
    problem = mismatch(found, driver_versions(names), executor_python(sc))
    if problem:
        raise ConfigError(f"{problem}: {FIX}")
    _PASSED.add((sc.applicationId, frozenset(names)))
    return out


def _probe_job(sc, jobs, names) -> list[dict]:
    """The probe alone, one task per default partition."""
    n = max(1, int(sc.defaultParallelism))
    try:
        return jobs.run(sc.parallelize(range(n), n), _probe(names),
                        what="checking the executors' Python")
    except MonsoonError as exc:
        raise ConfigError(f"the executors' Python ({executor_python(sc)}) cannot run monsoon's "
                          f"tasks ({str(exc).split(': ', 1)[-1]}): {FIX}") from None


def _carried(sc, jobs, names, carry) -> tuple[list[dict], list]:
    """(the reports, the job's results) of ``carry``'s job with the probe
    in each task."""
    rdd, func, what = carry
    try:
        results = jobs.run(rdd, _reporting(func, _probe(names)), what=what)
    except WaitTimeout:
        raise  # its wait is spent: not a second one for the probe
    except MonsoonError:
        _probe_job(sc, jobs, names)  # the executors' Python's line, where it is that
        raise
    return ([found for report, found in results if report],
            [item for report, item in results if not report])


def _reporting(func, probe):
    """``func`` (a task's function) whose task also reports its Python."""
    def run(it):
        return [(False, item) for item in func(it)] + [(True, found) for found in probe(None)]
    return run

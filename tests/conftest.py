import os

# Keep each test process from oversubscribing the 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# Every JVM the tests start (Spark's drivers, executors, a standalone
# master and worker) compiles with C1 only and collects with one thread:
# the suite's jobs are short, and C2's compiler threads and the parallel
# collector cost CPU they never earn back (a local[2] session with six short
# runs: 40 s of JVM CPU, 20 s this way), on a machine of 2 cores shared with
# the other tests. Where SPARK_CONF_DIR is set already it is left alone.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
if "SPARK_CONF_DIR" not in os.environ:
    import atexit  # noqa: E402
    import tempfile  # noqa: E402

    _spark_conf = tempfile.mkdtemp(prefix="monsoon-tests-spark-conf-")
    atexit.register(shutil.rmtree, _spark_conf, True)
    Path(_spark_conf, "spark-defaults.conf").write_text(
        f"spark.driver.extraJavaOptions {JVM_OPTIONS}\n"
        f"spark.executor.extraJavaOptions {JVM_OPTIONS}\n")
    os.environ["SPARK_CONF_DIR"] = _spark_conf
    os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", JVM_OPTIONS)  # standalone master, worker

# Tests that share a server run in one pytest-xdist worker (``--dist
# loadgroup``): the Ray tests reuse one Ray instance (``local_ray``) and a
# cluster started by ``ray start`` would be found by another worker's
# ``ray.init()``; the Spark tests share one JVM; torchrun jobs are heavy. A
# module that marks its own ``xdist_group`` keeps it (the lost-node tests,
# whose clusters live apart in network namespaces).
SERVER_GROUPS = ("ray", "spark", "torchrun")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # a module that stops the session's server for its own cluster
    # (``LAST_IN_GROUP``) runs after the others, so none starts it again
    items.sort(key=lambda item: (bool(getattr(getattr(item, "module", None), "LAST_IN_GROUP",
                                              False)), _spark_rank(item)))
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue  # a module that chose its own group
        for group in SERVER_GROUPS:
            if item.get_closest_marker(group) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
                break
    # The tests of no group go one at a time to whichever xdist worker is
    # free, in this order: the modules that hold a slow test before the
    # others (the sort is stable: collection order otherwise), so the run
    # ends on short tests and neither worker idles long at the end while
    # the other finishes a slow one. (A module's tests may still run on both
    # workers, each building the module's fixtures, as before.)
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None
               and item.path not in slow)


# The Spark modules in the order that starts the fewest sessions (spark_env
# keeps one per master for the modules after): the modules that need sessions
# of their own first, then those on local[2] (any module not named), then
# local[2,4], then the local cluster.
SPARK_FIRST = ("test_spark_users.py", "test_spark_startup.py")
SPARK_LAST = ("test_spark_faults.py", "test_spark_torch.py", "test_spark_cluster.py")


def _spark_rank(item) -> int:
    name = item.path.name
    if name in SPARK_FIRST:
        return 0
    return 2 + SPARK_LAST.index(name) if name in SPARK_LAST else 1


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """In a pytest-xdist worker under ``--dist loadgroup``: fail the run if a
    server's test did not get its group (xdist suffixes the test's id with
    ``@group``). Without it, two Ray clusters on the same addresses would
    run at once and the run would fail or crawl, not say why."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None and not item.nodeid.endswith("@" + mark.args[0]):
            why = (f"pytest-xdist did not group {item.nodeid} ({mark.args[0]}): this pytest "
                   "and pytest-xdist do not work together; install with -c constraints.txt")
            os.write(2, f"\n{why}\n".encode())  # a worker's exception reaches no one
            raise pytest.UsageError(why)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Under ``--dist loadgroup`` the Ray group's tests run one after
    another in one xdist worker: after the last of them, stop the session's
    Ray instance, whose idle daemons would take CPU from the tests still to
    run (a later Ray test would start it again)."""
    yield
    group = "@ray"
    if not item.nodeid.endswith(group) or (nextitem is not None
                                           and nextitem.nodeid.endswith(group)):
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def _ray_for_the_session():
    """Shuts down, at the end of the session, the Ray instance ``local_ray`` started."""
    ray = pytest.importorskip("ray")
    yield ray
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def local_ray(_ray_for_the_session, plugin_site):
    """A real local Ray instance that counts ``CPUS`` (8) logical CPUs on
    this machine's 2 cores: every run of up to 8 workers reserves one CPU a
    worker (``cpus_per_worker``), so the runs of consecutive tests have
    hosts of one shape and reuse those the last run left (``hosts.py``), as
    a user's sweep on an 8-core machine would; what reserves a share of a
    CPU is tested on clusters of 1-CPU nodes. Its worker processes import
    helpers from tests/, monsoon from this checkout (not another one
    installed in the environment) and the example plug-in (the plug-in tests
    then need no instance of their own). Started once and kept for the
    modules after (a start and a shutdown cost seconds); a module that needs
    another instance (a cluster, other paths) shuts it down, and the next
    module that asks for this one starts it again."""
    ray = _ray_for_the_session
    here = Path(__file__).parent
    paths = f"{plugin_site}:{here}:{here.parent}"
    if ray.is_initialized() and _ray_paths.get("current") != paths:
        ray.shutdown()
    if not ray.is_initialized():
        ray.init(num_cpus=CPUS, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": paths}})
        _ray_paths["current"] = paths
    yield ray


CPUS = 8
_ray_paths = {}  # the PYTHONPATH the running instance of local_ray was started with


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test(request):
    """After a test on ``local_ray``: kill the actors of any monsoon run
    still under way on it (its pooled hosts, and a named run's actors). A
    test that failed mid-run (a timeout, a failed assert while a run trains
    in a thread) would otherwise leave its workers holding the instance's 2
    CPUs, and every Ray test after it would fail
    waiting for its own workers to start."""
    yield
    if "local_ray" not in request.fixturenames:
        return
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    from monsoon.engines.ray.hosts import POOL

    POOL.clear(ray, idle=False)  # unnamed hosts of a run under way; idle ones serve the next
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"].startswith("monsoon-"):
            try:
                ray.kill(ray.get_actor(entry["name"], namespace=entry["namespace"]))
            except ValueError:  # it ended meanwhile
                pass


@pytest.fixture(autouse=True)
def _figures_built_not_drawn(request, monkeypatch):
    """Runs in the test's process build every figure of their run folder
    (each curve, axis and legend: ``record/plots.py`` runs whole) but do not
    rasterize it to PNG, about 0.7 s of CPU a run folder, most of a short
    run's time; the file is written, empty. A test that checks the PNG
    itself is marked ``png`` and gets it drawn."""
    if request.node.get_closest_marker("png") is not None:
        return
    from monsoon.record import plots

    def built_not_drawn(fig, path):
        Path(path).write_bytes(b"")

    monkeypatch.setattr(plots, "_save_png", built_not_drawn)


PLUGIN = Path(__file__).resolve().parent / "plugin_example"


def _reload():
    from monsoon.config import registries

    for registry in registries().values():
        registry.reload()


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory):
    """The example plug-in, installed with pip into a site folder."""
    site = tmp_path_factory.mktemp("site")
    source = tmp_path_factory.mktemp("src") / "plugin"  # the build writes beside its source
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-build-isolation", "--no-index", "--target", str(site),
                           str(source)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert list(site.glob("monsoon_example_plugin-*.dist-info/entry_points.txt"))
    return site


@pytest.fixture
def plugin(plugin_site):
    """The installed plug-in on sys.path, for this test only."""
    site = plugin_site
    sys.path.insert(0, str(site))
    import importlib

    importlib.invalidate_caches()
    _reload()
    yield site
    sys.path.remove(str(site))
    sys.modules.pop("monsoon_example_plugin", None)
    _reload()



import os

# Keep each test process from oversubscribing the 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    """A real local Ray instance with 2 CPUs for one test module. Its worker
    processes import helpers from tests/ and monsoon from this checkout (not
    another one installed in the environment)."""
    ray = pytest.importorskip("ray")
    here = Path(__file__).parent
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{here}:{here.parent}"}})
    yield ray
    ray.shutdown()

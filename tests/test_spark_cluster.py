"""The spark engine on ``local-cluster[2,1,1024]``: two executor JVMs, each
with its own Python workers, as on a real cluster."""
import numpy as np
import pytest

import monsoon
from spark_env import spark_session

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def spark():
    with spark_session("local-cluster[2,1,1024]") as session:
        yield session


def test_sync_equals_serial_and_async_is_stale(spark):
    kw = dict(lr=0.5, steps=3, batch_size=16384, seed=0, dtype="float64", evals=0)
    serial = monsoon.train("logistic", strategy="serial", **kw)
    sync = monsoon.train("logistic", strategy="sync", workers=2, engine="spark", **kw)
    np.testing.assert_allclose(sync.params, serial.params, rtol=1e-9, atol=1e-12)
    assert sync.summary["spark_master"].startswith("local-cluster")

    kw = dict(lr=0.5, steps=128, batch_size=64, seed=0, dtype="float64", evals=0)
    serial = monsoon.train("logistic", strategy="serial", **kw)
    run = monsoon.train("logistic", strategy="async", workers=2, engine="spark", n_fetch=32,
                        n_push=32, **kw)
    assert run.summary["staleness"]["max"] > 0
    assert run.summary["final_loss"] <= 1.1 * serial.summary["final_loss"]

"""A Spark curve row's examples are those of the updates its parameters
hold, for the strategies that run in tasks (``engines/spark/server.py``,
``rounds.py``; sync's, on the driver and in the barrier stage:
``test_spark_barrier.py``)."""
import time

import pytest

import monsoon
from monsoon.engines.spark.server import DriverServer
from spark_env import spark_session

pytestmark = [pytest.mark.spark]

B = 64  # logistic's 16384 rows: 8192 a partition, whole batches of 64 every epoch


@pytest.fixture(scope="module")
def spark():
    with spark_session("local[2]") as session:
        yield session


@pytest.mark.parametrize("strategy, options, steps", [
    ("async", dict(n_push=2, n_fetch=2), 960),  # a push: 2 steps of its worker's batches
    ("ssp", dict(n_push=2, n_fetch=2), 960),    # a clock: the same
    ("easgd", dict(easgd_tau=2), 960),          # an exchange: tau steps
    ("local-sgd", dict(local_steps=2), 32),     # a round (a job): 2 global batches, split
])
def test_a_rows_examples_are_those_of_its_updates(spark, monkeypatch, strategy, options, steps):
    """Every update carries 2 x 64 examples, so a row at ``updates`` k has
    128 k. The monitor read the server's examples, then, for a row due,
    its parameters and updates under the lock: a push applied between the
    two was in the row's updates and not its examples (``late`` widens
    that gap as a busy driver would: rows 128 short, several pushes)."""
    snapshot = DriverServer._snapshot

    def late(self):
        time.sleep(0.03)  # the workers' threads apply pushes meanwhile
        return snapshot(self)

    monkeypatch.setattr(DriverServer, "_snapshot", late)
    run = monsoon.train("logistic", strategy=strategy, workers=2, engine="spark", steps=steps,
                        batch_size=B, lr=0.1, seed=0, evals=24, **options)
    rows = [(row["updates"], row["examples"]) for row in run.history]
    assert len(rows) >= 4 and rows[-1] == (steps // 2, steps * B)
    assert rows == [(k, 2 * B * k) for k, _ in rows]

"""EASGD's workers exchange once more after their last step where it is not
an exchange step (a shorter last period), as local SGD averages its short
last round: no local step is thrown away.

It used to exchange only every tau steps: with tau at least a worker's
steps, the run returned the starting parameters (logistic: loss ln 2, the
starting loss) as "finished", 0 updates. Each worker now makes
ceil(steps / tau) exchanges, and a run resumed with no steps left makes
none again."""
import math

import numpy as np
import pytest

import monsoon
from monsoon.problems import make_problem

from spark_env import spark  # noqa: F401 - the fixture

# 16,384 rows, batch 16, two workers: 512 steps a worker
OPTIONS = dict(epochs=1, seed=0, evals=4, progress=False)
STEPS = 512


@pytest.mark.parametrize("engine", ["local", "sim"])
@pytest.mark.parametrize("tau", [1000, 100])
def test_a_worker_exchanges_after_its_last_step(engine, tau):
    run = monsoon.train("logistic", "easgd", 2, engine=engine, easgd_tau=tau, **OPTIONS)
    s = run.summary
    start = make_problem("logistic")
    assert s["status"] == "finished" and s["local_updates"] == 2 * STEPS, s
    assert s["updates"] == 2 * math.ceil(STEPS / tau), s  # 2 (tau 1000), 12 (tau 100)
    assert not np.array_equal(run.params, start.initial_params(0))
    assert s["final_loss"] < 0.5 * start.loss(start.initial_params(0)), s


def exchanges_after(tau: int, steps: int, start_step: int) -> list:
    """The steps after which worker 0's program (``steps`` in all, resumed
    at ``start_step``) exchanges."""
    from monsoon.strategies.batches import Budget
    from monsoon.strategies.base import WorkerJob
    from monsoon.strategies.easgd import EASGD
    from monsoon.strategies.ops import Elastic, Gradient

    program = EASGD(alpha=0.5, tau=tau).program(
        WorkerJob(0, 1, 64, 4, 0, Budget(steps=steps), start_step=start_step))
    done, out, reply = start_step, [], None
    for op in iter(lambda: program.send(reply), None):  # StopIteration ends it
        done += type(op) is Gradient
        if type(op) is Elastic:
            out.append(done)
        reply = (0.0, np.zeros(1)) if type(op) is Gradient else None
    return out


def test_the_last_exchange_is_made_once_resumed_or_not():
    """10 steps of tau 4: exchanges after steps 4, 8 and 10. A worker
    resumed within the last period makes the last; one resumed with no
    steps left made it before it stopped (an Elastic lands before a halt),
    and does not make it again; one whose last step is an exchange step
    makes no second."""
    assert exchanges_after(4, 10, 0) == [4, 8, 10]
    assert exchanges_after(4, 10, 9) == [10]
    assert exchanges_after(4, 10, 10) == []
    assert exchanges_after(4, 8, 0) == [4, 8]
    assert exchanges_after(4, 8, 8) == []


@pytest.mark.spark
def test_a_worker_exchanges_after_its_last_step_spark(spark):
    """Spark runs a segment of tau steps per task: the last, shorter one
    ends with the exchange too."""
    run = monsoon.train("logistic", "easgd", 2, engine="spark", easgd_tau=1000, steps=128,
                        seed=0, evals=2, progress=False)
    s = run.summary
    assert (s["status"], s["updates"], s["local_updates"]) == ("finished", 2, 128), s
    start = make_problem("logistic")
    assert s["final_loss"] < 0.8 * start.loss(start.initial_params(0)), s

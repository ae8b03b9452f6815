"""local-sgd (DiLoCo too) and EASGD count in two units, each pair apart:

- ``updates`` and ``dropped_updates``: the server's updates (averaging
  rounds; EASGD's exchanges), applied and not applied;
- ``local_updates`` and ``dropped_local_updates``: the workers' own local
  steps, summed over the workers, applied and dropped (a NaN gradient).

A run with a few NaN local gradients is healthy: it used to count them in
``dropped_updates`` against its rounds, and past 100 the recorder stopped it
as diverged. A run whose local steps are mostly dropped still stops, with
the local steps' counts in its message. The ray, spark and torch engines'
tests are in their own modules (``test_ray.py``, ``test_spark_programs.py``,
``test_torch_engine.py``)."""
import pytest

import monsoon
from monsoon.problems import make_problem
from monsoon.record.recorder import DROPPED_LOCAL

from faulty import FaultyProblem

# (strategy, options, steps, local steps in all, server updates): local SGD's
# workers each take a local step on every global step; EASGD's share the
# steps out (400 a worker), and each exchanges every 4 of its own
STRATEGIES = [
    ("local-sgd", {"local_steps": 8}, 400, 2 * 400, 400 // 8),
    ("local-sgd", {"local_steps": 8, "diloco": True}, 400, 2 * 400, 400 // 8),
    ("easgd", {"easgd_tau": 4}, 800, 800, 2 * (400 // 4)),
]


def nan_every_third(engine):
    """exp with every third gradient NaN after the third: on worker 1 of the
    local engine (a copy a worker), on the sim's one problem (every virtual
    worker computes on it, so its calls count theirs together)."""
    return FaultyProblem(make_problem("exp"), "nan", rank=1 if engine == "local" else 0,
                         after=3, every=3)


@pytest.mark.parametrize("engine", ["local", "sim"])
@pytest.mark.parametrize("strategy,options,steps,local,rounds", STRATEGIES)
def test_dropped_local_steps_are_counted_apart_from_the_updates(engine, strategy, options,
                                                                steps, local, rounds):
    run = monsoon.train(nan_every_third(engine), strategy, 2, engine=engine, steps=steps,
                        seed=0, progress=False, **options)
    s = run.summary
    # every round (exchange) was applied: a NaN local step is not one of them
    assert (s["updates"], s["dropped_updates"]) == (rounds, 0), s
    # every local step counted once, in its own unit
    assert s["local_updates"] + s["dropped_local_updates"] == local
    assert 100 < s["dropped_local_updates"] < s["local_updates"]
    # more drops than rounds, far fewer than the local steps applied: healthy
    assert s["status"] == "finished" and "stopped" not in s


@pytest.mark.parametrize("engine", ["local", "sim"])
@pytest.mark.parametrize("strategy,options", [s[:2] for s in STRATEGIES])
def test_a_diverging_run_stops_on_its_dropped_local_steps(engine, strategy, options):
    """lr 1e6: after a step or two every local gradient overflows and is
    dropped, while each round averages finite copies and is applied."""
    run = monsoon.train("exp", strategy, 2, engine=engine, lr=1e6, epochs=300, seed=0,
                        progress=False, raise_on_divergence=False, **options)
    s = run.summary
    assert s["status"] == "diverged"
    assert s["dropped_local_updates"] > max(100, s["local_updates"])
    assert s["stopped"] == DROPPED_LOCAL.format(dropped=s["dropped_local_updates"],
                                                updates=s["local_updates"])
    assert s["examples"] < 300 * make_problem("exp").n_examples  # stopped early


def test_strategies_without_local_steps_have_no_local_counts():
    s = monsoon.train("exp", "sync", 2, steps=4, progress=False).summary
    assert "local_updates" not in s and "dropped_local_updates" not in s

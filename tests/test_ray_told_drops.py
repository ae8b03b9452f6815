"""The Ray driver's counts of a worker that ends without reporting (lost,
or killed where the run stopped), on plain ``Shard`` objects and
``ShardCheckpoints`` without Ray, through the orders a cluster produces
only by chance: the worker's last call that reaches one shard before the
driver's tell and another after it, a shard that fails while the driver
tells, and a checkpoint written after a worker was lost."""
from types import SimpleNamespace

import numpy as np
import pytest

from monsoon.engines.ray.checkpointing import ShardCheckpoints
from monsoon.engines.ray.engine import LOST, RayEngine
from monsoon.engines.ray.shard import Shard
from monsoon.record.checkpoints import Checkpointer, read_meta
from monsoon.rules import make_rule
from monsoon.strategies import make_strategy

RayActorError = pytest.importorskip("ray.exceptions").RayActorError


class NoRay:
    """A call's reference is its answer; counts the waits."""

    def __init__(self):
        self.waits = 0

    def get(self, refs, timeout=None):
        self.waits += 1
        return refs


def _handle(obj, *methods):
    """``obj``'s ``methods`` called as Ray calls them (``.remote``)."""
    return SimpleNamespace(**{m: SimpleNamespace(remote=getattr(obj, m)) for m in methods})


def _shards(heard: list):
    """Two shards whose rules count in ``heard`` the drops they hear of."""
    shards = []
    for s in range(2):
        rule = make_rule("sgd", 1.0)
        rule.on_dropped = lambda w, state, s=s: heard.__setitem__(s, heard[s] + 1)
        shards.append(Shard(s, np.zeros(2), rule, workers=2, counted=2, timeout=5.0))
    return shards


def test_every_shard_hears_the_count_the_driver_reports_whichever_it_heard_first():
    """Worker 1 dropped 7 pushes; the driver last saw 5. Its read telling 7
    reaches shard 0 before the driver's tell and shard 1 after it (it runs
    until killed): both rules hear 7, once, and the driver counts 7."""
    heard = [0, 0]
    shards = _shards(heard)
    ray = NoRay()
    shards[0].read(1, 7)
    told = RayEngine(timeout=5.0)._told_drops(ray, [_handle(sh, "told") for sh in shards],
                                              {1: {"dropped": 5, "examples": 80}})
    shards[1].read(1, 7)
    assert heard == [7, 7]
    assert told == {1: {"dropped": 7, "examples": 80}}
    shards[1].read(1, 9)  # a later call of the worker's tells none
    assert heard == [7, 7] and ray.waits == 2


def test_the_driver_tells_every_rank_in_one_wait_and_a_failing_shard_leaves_the_counts():
    heard = [0, 0]
    ray = NoRay()
    handles = [_handle(sh, "told") for sh in _shards(heard)]
    figures = {0: {"dropped": 2}, 1: {"dropped": 3}}
    assert RayEngine(timeout=5.0)._told_drops(ray, handles, figures) == figures
    assert heard == [5, 5] and ray.waits == 1

    def dead(*args):
        raise RayActorError()

    handles[1] = SimpleNamespace(told=SimpleNamespace(remote=dead))
    assert RayEngine(timeout=5.0)._told_drops(ray, handles, {2: {"dropped": 4}}) == \
        {2: {"dropped": 4}}


def test_a_shard_that_fails_the_second_tells_leaves_the_most_heard():
    """Worker 1's read told shard 0 of 7 drops; the driver saw 5. Shard 1
    fails only when told again: the tells of the first wait have landed,
    and the driver counts the 7 shard 0 heard (its rule will hear them)."""
    heard = [0, 0]
    shards = _shards(heard)
    shards[0].read(1, 7)
    calls = []

    def fails_twice(*args):
        calls.append(args)
        if len(calls) > 1:
            raise RayActorError()
        return shards[1].told(*args)

    handles = [_handle(shards[0], "told"),
               SimpleNamespace(told=SimpleNamespace(remote=fails_twice))]
    told = RayEngine(timeout=5.0)._told_drops(NoRay(), handles, {1: {"dropped": 5}})
    assert told == {1: {"dropped": 7}} and heard == [7, 5] and len(calls) == 2


def test_an_async_checkpoint_places_a_lost_worker_after_the_batches_it_did(tmp_path):
    """Async, 2 workers on 100 examples in batches of 10: worker 0 did 50
    examples, worker 1 did 30 and was lost. The checkpoint counts both and
    puts worker 1 at its fourth batch, not back at its first."""
    rule = make_rule("sgd", 1.0)
    keeper = Checkpointer(str(tmp_path), 4, None, {})
    ckpts = ShardCheckpoints(keeper, rule, make_strategy("async"), [(0, 2)], 2, 100, 10)
    ckpts.load(np.zeros(2))
    copy = (np.zeros(2), tuple(rule.init(2, np.float64)), 0)
    shard = SimpleNamespace(taken=SimpleNamespace(remote=lambda: {4: copy}))
    last = {"examples": 30, "dropped": 1}
    ckpts.collect(NoRay(), [shard], 5.0, 1.0, {0: {"examples": 50}, LOST: last}, {1: last})
    meta = read_meta(keeper.last_path)
    assert meta["positions"] == [5, 3]
    assert (meta["examples"], meta["dropped"]) == (80, 1)

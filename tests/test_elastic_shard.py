"""Elastic sync's shard protocol (``engines/ray/shard.py``), driven from
threads without Ray, through the orders a cluster produces only by
chance: a regroup that lands while a step waits, a shard that applied a
step the other shards regroup, a joiner's part for a step this shard has
applied, and a contribution that arrives before the driver's regroup; and
the run that loses its last member fails naming that one."""
import threading
import time

import numpy as np
import pytest

from monsoon.engines.ray.shard import Shard
from monsoon.rules import make_rule


def _shard(timeout=5.0):
    return Shard(0, np.zeros(2), make_rule("sgd", 1.0), workers=2, counted=2, timeout=timeout,
                 elastic=True)


def _in_thread(fn, *args):
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("reply", fn(*args)), daemon=True)
    thread.start()
    return thread, box


def _until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.001)


def test_a_regroup_drops_the_steps_parts_and_the_survivor_applies_the_whole_batch_once():
    sh = _shard()
    thread, box = _in_thread(sh.contribute, 0, 0, np.array([1.0, 1.0]), 1, 0)
    _until(lambda: 0 in sh.arrivals)  # worker 0's half is in; worker 1 never comes
    assert sh.regroup(1, (0,)) == 0
    thread.join(5)
    assert box["reply"] == ("regroup", 1, (0,)) and sh.arrivals == {}
    assert sh.contribute(0, 1, np.array([5.0, 5.0]), 1, 0)[0] == "regroup"  # a late old part
    params, behind, counted = sh.contribute(0, 0, np.array([2.0, 4.0]), 2, 1)  # the batch
    np.testing.assert_array_equal(params, [-2.0, -4.0])
    assert (behind, counted, sh.step) == (0, True, 1)


def test_a_joiner_reads_the_slice_before_an_applied_step_and_is_not_applied_twice():
    sh = _shard()
    thread, _ = _in_thread(sh.contribute, 0, 0, np.array([1.0, 3.0]), 1, 0)
    _until(lambda: 0 in sh.arrivals)
    sh.contribute(0, 1, np.array([3.0, 5.0]), 1, 0)  # the step completes on this shard
    thread.join(5)
    params, step, before = sh.joining()
    np.testing.assert_array_equal(params, [-2.0, -4.0])
    np.testing.assert_array_equal(before, [0.0, 0.0])  # w at step 0, for a joiner at step 0
    assert step == 1
    sh.regroup(1, (0, 1))
    late = sh.contribute(0, 1, np.array([9.0, 9.0]), 1, 1)  # the joiner's part of step 0
    np.testing.assert_array_equal(late[0], params)  # this shard's step 1, unchanged
    assert late[2] is False and sh.step == 1


def test_a_part_of_a_newer_generation_waits_for_the_driver_and_times_out_in_words():
    sh = _shard()
    thread, box = _in_thread(sh.contribute, 0, 0, np.array([1.0, 1.0]), 1, 1)
    time.sleep(0.05)
    assert "reply" not in box and sh.arrivals == {}  # held until generation 1 is here
    sh.regroup(1, (0,))
    thread.join(5)
    np.testing.assert_array_equal(box["reply"][0], [-1.0, -1.0])
    quick = _shard(timeout=0.1)
    with pytest.raises(TimeoutError, match="membership generation 2"):
        quick.contribute(0, 0, np.array([1.0, 1.0]), 1, 2)


def test_the_run_fails_naming_the_rank_whose_loss_left_no_member():
    """Worker 0 is lost (its new actor not started yet), then worker 1: the
    run fails naming worker 1, the one lost last, with its reason."""
    from monsoon.engines.ray.membership import Membership
    from monsoon.errors import WorkerError
    from monsoon.strategies import make_strategy

    class NoRay:  # a call's reference is its answer
        get = staticmethod(lambda refs, timeout=None: refs)

    from types import SimpleNamespace

    sh = _shard()
    actor = SimpleNamespace(regroup=SimpleNamespace(remote=sh.regroup))  # called as Ray calls
    members = Membership(NoRay(), [actor], make_strategy("sync", elastic=True), 2, 5.0, 5.0,
                         spawn=None, cpus=1.0, gpus=0.0)
    members.lose(0, "ActorDiedError: node 0 lost")
    with pytest.raises(WorkerError, match="worker 1 failed.*node 1 lost") as caught:
        members.lose(1, "ActorDiedError: node 1 lost")
    assert caught.value.worker == 1

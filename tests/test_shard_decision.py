"""One synchronous step on several Ray shards with backup workers: every
shard applies the same workers' parts (``engines/ray/sync_step.py``), and
the step's update is credited to the lowest rank counted.

Plain ``Shard`` objects (no Ray), driven from threads through the worker's
own protocol (``step_replies``), with the arrivals in orders a cluster
produces only by chance: one order on one shard, the reverse on the other."""
import threading

import numpy as np
import pytest

from monsoon.engines.ray.shard import Shard
from monsoon.engines.ray.sync_step import step_replies
from monsoon.rules import make_rule

WAIT_S = 10.0  # a bound on every wait here, never reached when the protocol is right


class Tapped(threading.Condition):
    """A shard's lock that tells ``waiting`` which thread waits on it: that
    thread's call is in (the shard holds its part, or its place) and the
    next arrival may come."""

    def __init__(self, waiting):
        super().__init__()
        self.waiting = waiting

    def wait(self, timeout=None):
        self.waiting(threading.get_ident())
        return super().wait(timeout)


class Orders:
    """Lets each worker's first call on shard s in only in ``orders[s]``'s
    turn, and the next one once the shard has taken it (it returned, or it
    waits on the shard's lock)."""

    def __init__(self, shards, orders):
        self.orders = orders
        self.turn = [0] * len(shards)
        self.inside = [None] * len(shards)  # the thread whose call is being taken
        self.seen = set()
        self.cond = threading.Condition()
        for s, sh in enumerate(shards):
            sh.lock = Tapped(lambda ident, s=s: self._taken(s, ident))

    def _taken(self, s, ident):
        with self.cond:
            if self.inside[s] == ident:
                self.inside[s] = None
                self.turn[s] += 1
                self.cond.notify_all()

    def run(self, s, worker, method):
        first = (s, worker) not in self.seen
        self.seen.add((s, worker))
        if first:
            order = self.orders[s]
            with self.cond:
                assert self.cond.wait_for(
                    lambda: self.turn[s] < len(order) and order[self.turn[s]] == worker,
                    WAIT_S), f"worker {worker} never had its turn on shard {s}"
                self.inside[s] = threading.get_ident()
        try:
            return method()
        finally:
            if first:
                self._taken(s, threading.get_ident())

    def call_for(self, worker, shards):
        """Worker ``worker``'s ``call``, its calls let in in their turns."""
        return _parallel(lambda sh, name, args: self.run(
            shards.index(sh), worker, lambda: getattr(sh, name)(*args)))


def _parallel(run):
    """A ``call`` that runs a batch's calls at once, each in a thread (as
    the worker's remote calls run), through ``run(shard, method, args)``."""
    def call(batch):
        replies, errors = [None] * len(batch), []

        def one(k, item):
            try:
                replies[k] = run(*item)
            except BaseException as exc:  # noqa: BLE001 - raised in the worker's thread
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(k, item), daemon=True)
                   for k, item in enumerate(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        if errors:
            raise errors[0]
        return replies
    return call


def _shards(workers, counted, size=4, timeout=WAIT_S):
    half = size // 2
    return [Shard(s, np.zeros(half), make_rule("sgd", 1.0), workers=workers, counted=counted,
                  timeout=timeout, span=(s * half, (s + 1) * half, size)) for s in range(2)]


def _step(shards, call, rank, grad, examples=1, backups=True):
    """Worker ``rank``'s step 0, as ``RemoteWorker._synchronous`` sends it."""
    parts = [grad[:2], grad[2:]]
    whole = bool(np.isfinite(grad).all())
    return step_replies(call, shards, [0, 1], 0, rank, parts, examples, 0, whole, backups)


def _run_workers(shards, orders, grads, ranks=None, backups=True):
    """Each worker's step in a thread, its arrivals on shard s in ``orders[s]``
    (or an ``Orders`` made before, already in use); ``backups`` False: the
    plain protocol of a step that counts every worker."""
    gate = orders if isinstance(orders, Orders) else Orders(shards, orders)
    replies, errors = {}, []

    def worker(rank):
        try:
            replies[rank] = _step(shards, gate.call_for(rank, shards), rank, grads[rank],
                                  backups=backups)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,), daemon=True)
               for r in (ranks if ranks is not None else range(len(grads)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * WAIT_S)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return replies


def _counted_set(params, grads):
    """The pair of workers whose mean step (sgd, lr 1, from 0) gives ``params``."""
    pairs = [(a, b) for a in range(len(grads)) for b in range(a + 1, len(grads))
             if np.allclose(params, -(grads[a] + grads[b]) / 2)]
    assert len(pairs) == 1, (params, pairs)
    return pairs[0]


def test_shards_that_see_the_arrivals_in_opposite_orders_apply_the_same_workers():
    grads = [np.full(4, 10.0 ** w) for w in range(3)]  # every pair's mean is distinct
    shards = _shards(workers=3, counted=2)
    replies = _run_workers(shards, [[0, 1, 2], [2, 1, 0]], grads)
    sets = [_counted_set(sh.params, [g[s * 2:(s + 1) * 2] for g in grads])
            for s, sh in enumerate(shards)]
    assert sets[0] == sets[1], f"shard 0 applied workers {sets[0]}, shard 1 {sets[1]}"
    assert [sh.step for sh in shards] == [1, 1]
    counted = {r for r, reply in replies.items() if reply[0][2]}
    assert counted == set(sets[0])  # the worker is told what every shard did
    for reply in replies.values():
        assert all(r[2] == reply[0][2] for r in reply.values())


def test_a_part_not_finite_counted_on_one_shard_and_late_on_the_other_drops_nowhere():
    """Worker 2's gradient is NaN in shard 1's slice only, and shard 1 sees
    it first: shard 0 counts workers 0 and 1, so no shard drops the step."""
    grads = [np.full(4, 10.0 ** w) for w in range(3)]
    grads[2][3] = np.nan
    shards = _shards(workers=3, counted=2)
    _run_workers(shards, [[0, 1, 2], [2, 1, 0]], grads)
    assert [sh.core.dropped for sh in shards] == [0, 0]
    np.testing.assert_allclose(np.concatenate([sh.params for sh in shards]),
                               -(grads[0] + grads[1]) / 2)


def test_a_worker_lost_before_shard_0_counted_it_is_left_out_everywhere():
    grads = [np.full(4, 10.0 ** w) for w in range(3)]
    shards = _shards(workers=3, counted=2)
    shards[1].offer(0, 0, grads[0][2:], 1)  # worker 0's process dies here
    _run_workers(shards, [[1, 2], [1, 2]], grads, ranks=[1, 2])
    np.testing.assert_allclose(np.concatenate([sh.params for sh in shards]),
                               -(grads[1] + grads[2]) / 2)


def test_a_worker_lost_once_counted_holds_no_shard_up():
    """Worker 0 is counted on shard 0 and dies before it settles shard 1:
    the other counted worker's settle applies the step there, on the same
    parts, and the late worker is told it was late on every shard."""
    grads = [np.full(4, 10.0 ** w) for w in range(3)]
    shards = _shards(workers=3, counted=2)
    gate = Orders(shards, [[1, 2], [1, 2]])  # worker 0's calls, below, go straight in

    def lost():
        shards[1].offer(0, 0, grads[0][2:], 1)
        shards[0].decide(0, 0, grads[0][:2], 1)  # ... and dies before settle

    thread = threading.Thread(target=lost, daemon=True)
    thread.start()
    _run_workers(shards, gate, grads, ranks=[1])
    thread.join(WAIT_S)
    assert not thread.is_alive()
    late = _run_workers(shards, gate, grads, ranks=[2])[2]
    assert [reply[2] for reply in late.values()] == [False, False]
    np.testing.assert_allclose(np.concatenate([sh.params for sh in shards]),
                               -(grads[0] + grads[1]) / 2)
    assert [sh.step for sh in shards] == [1, 1]


def test_a_part_for_a_step_a_shard_has_not_reached_waits_for_it():
    """A late worker that skipped ahead may offer its part of step 1 to a
    shard still on step 0: the part is held for step 1, never summed into
    step 0."""
    sh = _shards(workers=3, counted=2)[1]
    sh.offer(0, 0, np.array([1.0, 1.0]), 1)
    sh.offer(0, 1, np.array([3.0, 3.0]), 1)
    ahead = threading.Thread(target=sh.offer, args=(1, 2, np.array([50.0, 50.0]), 1),
                             daemon=True)
    ahead.start()
    ahead.join(0.05)
    assert ahead.is_alive() and set(sh.arrivals) == {0, 1}
    params, behind, counted = sh.settle(0, 0, (0, 1))
    np.testing.assert_array_equal(params, [-2.0, -2.0])
    assert (behind, counted) == (0, True)
    ahead.join(WAIT_S)
    assert set(sh.arrivals) == {2} and sh.step == 1
    again = sh.settle(0, 1, (0, 1))  # the other counted worker: applied already
    np.testing.assert_array_equal(again[0], params)
    assert sh.step == 1


def test_a_late_worker_that_missed_steps_waits_for_them_on_every_shard():
    """Shard 0 told a late worker of step 0 that it missed step 1 too: its
    settle on shard 1 (still on step 0) returns once shard 1 has applied
    step 1 as well, so its next gradient is taken at step 2's parameters."""
    sh = _shards(workers=3, counted=2)[1]
    sh.offer(0, 0, np.array([1.0, 1.0]), 1)
    sh.offer(0, 1, np.array([3.0, 3.0]), 1)
    late = {}
    thread = threading.Thread(target=lambda: late.setdefault("reply", sh.settle(0, 2, None, 1)),
                              daemon=True)
    thread.start()
    sh.settle(0, 0, (0, 1))
    thread.join(0.05)
    assert thread.is_alive() and sh.step == 1
    sh.offer(1, 0, np.array([1.0, 1.0]), 1)
    sh.offer(1, 1, np.array([3.0, 3.0]), 1)
    sh.settle(1, 0, (0, 1))
    thread.join(WAIT_S)
    params, behind, counted = late["reply"]
    np.testing.assert_array_equal(params, [-4.0, -4.0])  # after steps 0 and 1
    assert (behind, counted) == (1, False)


def test_the_decided_steps_waits_time_out_in_words():
    sh = _shards(workers=3, counted=2, timeout=0.1)[1]
    with pytest.raises(TimeoutError, match="shard 1 waited 0.1 s to reach step 2"):
        sh.offer(2, 0, np.zeros(2), 1)
    with pytest.raises(TimeoutError, match="shard 1 waited 0.1 s for step 0 to complete"):
        sh.settle(0, 0, None)


@pytest.mark.parametrize("workers, order, backups", [(2, [0, 1], False), (2, [0, 1], True),
                                                     (3, [1, 2, 0], True)])
def test_the_lowest_counted_rank_counts_the_step_whichever_part_completed_it(workers, order,
                                                                            backups):
    """A step's update counts once in the workers' live figures, by the
    lowest rank it counted (``StepReply.applied``), not by the worker whose
    part came last: 2 workers, worker 1's part completes the step (the
    plain protocol, and the one with backups); 3 with a backup, workers 1
    and 2 counted, worker 2's part completes it."""
    grads = [np.full(4, 10.0 ** w) for w in range(workers)]
    replies = _run_workers(_shards(workers=workers, counted=2), [order, order], grads,
                           backups=backups)
    assert {r for r, reply in replies.items() if reply[0].applied} == {min(order[:2])}

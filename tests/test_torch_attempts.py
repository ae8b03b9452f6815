"""Naming a torch run's attempts (``collectives.join_attempt``), in one
process: each rank is a thread with its own client of one TCPStore, as
torchrun's ranks share their agent's store across restarts.

- Every rank of an attempt gets rank 0's name and number, whatever order
  they start in; a later attempt gets a new name and the next number.
- What a dead attempt leaves in the store (a nonce rank 0 never answered,
  an answered one) is not read as this attempt's: the case that made
  restarted ranks of a two-node run meet a dead attempt's gloo addresses.
- A rank whose peer never starts fails within the timeout, naming it.
"""
import datetime
import threading
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from monsoon.engines.torchrun.collectives import join_attempt  # noqa: E402
from monsoon.errors import WaitTimeout  # noqa: E402


@pytest.fixture
def server():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True,
                          timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    yield store


def _client(server):
    store = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                          timeout=datetime.timedelta(seconds=30))
    return dist.PrefixStore("monsoon/", store)


def _attempt(server, world, delays, timeout=10.0):
    """Every rank's (number, name) or exception; rank k starts after delays[k] s."""
    out = {}

    def rank(k):
        store = _client(server)
        time.sleep(delays[k])
        try:
            out[k] = join_attempt(store, k, world, timeout)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            out[k] = exc

    threads = [threading.Thread(target=rank, args=(k,)) for k in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout + 20)
    assert not any(t.is_alive() for t in threads)
    return out


def test_every_rank_gets_rank_0s_name_in_any_start_order(server):
    names = []
    for number, delays in enumerate([(0, 0, 0), (0.3, 0, 0.1), (0, 0.3, 0.2)]):
        got = _attempt(server, 3, delays)
        assert len(set(got.values())) == 1, got
        assert got[0][0] == number
        names.append(got[0][1])
    assert len(set(names)) == 3


def test_a_dead_attempts_leftovers_are_not_read_as_this_ones(server):
    first = _attempt(server, 2, (0, 0))[0]
    # a dead attempt: rank 1 queued its nonce, and rank 0 died before it answered
    _client(server).queue_push("hello", "stale-nonce")
    # the next attempt's rank 0 answers that nonce before its rank 1 starts
    got = _attempt(server, 2, (0, 1.0))
    assert got[0] == got[1] and got[0][0] == 1 and got[0][1] != first[1], got


def test_a_rank_whose_peer_never_starts_fails_within_the_timeout(server):
    store = _client(server)
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout, match="rank 1: rank 0 did not start within --timeout 1 s"):
        join_attempt(store, 1, 2, 1.0)
    with pytest.raises(WaitTimeout, match="rank 0: 2 of the other 2 ranks did not start") as err:
        join_attempt(store, 0, 3, 1.0)
    assert time.monotonic() - t0 < 6 and err.value.worker is None

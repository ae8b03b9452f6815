"""The torch engine's shared-memory all-reduce (``shm_reduce.py``), between
two real processes that meet through a real gloo process group: every rank
gets the same bits, the sum in rank order, over calls that reuse both
parity slots; a rank whose process has gone is named within the check
interval, not after --timeout; nothing is left in /dev/shm."""
import json
import os
import socket
import time
from pathlib import Path

import numpy as np

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2")
    from monsoon.engines.torchrun.collectives import Collectives
    from monsoon.engines.torchrun.shm_reduce import open_shm_reduce
    from monsoon.errors import WorkerError

    comm = Collectives("gloo", 20.0, {"local_rank": rank})
    shm = open_shm_reduce(comm, 7, np.float64, timeout=20.0, required=True)
    sums = []
    for call in range(3):  # both parity slots, one of them twice
        a = np.linspace(0.1, 1.0, 7) * (rank + 1) + call / 3
        shm.all_reduce(a)
        sums.append(a.tolist())
    report = {"sums": sums}
    if rank == 0:
        time.sleep(0.3)  # rank 1 is gone by now
        t0 = time.monotonic()
        try:
            shm.all_reduce(np.ones(7))
            report["error"] = None
        except WorkerError as exc:
            report["error"] = str(exc)
        report["seconds"] = time.monotonic() - t0
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    os._exit(0)  # rank 1: dies without a word; rank 0: no teardown with a dead peer


def test_shared_memory_all_reduce_sums_in_rank_order_and_names_a_dead_rank(tmp_path):
    import torch.multiprocessing as tmp

    shm_dir = Path("/dev/shm")
    before = set(shm_dir.glob("monsoon-*")) if shm_dir.is_dir() else set()
    tmp.start_processes(_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True,
                        start_method="spawn")
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert r0["sums"] == r1["sums"]  # the same bits on every rank
    for call, got in enumerate(r0["sums"]):
        base = np.linspace(0.1, 1.0, 7)
        assert np.array_equal(got, (base + call / 3) + (base * 2 + call / 3))
    assert r0["error"] is not None and "rank 1" in r0["error"], r0
    assert r0["seconds"] < 5, r0  # the peer check, not the 20 s timeout
    after = set(shm_dir.glob("monsoon-*")) if shm_dir.is_dir() else set()
    assert not _unmapped(after - before)  # new segments are other tests' runs, alive


def _unmapped(paths: set[Path]) -> set[Path]:
    """The segments no live process maps: left behind. Another test running
    beside this one (pytest-xdist) may hold segments of its own; those are
    mapped by its live processes."""
    if not paths:
        return set()
    mapped = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                maps = (entry / "maps").read_text()
            except OSError:
                continue
            mapped |= {p for p in paths if str(p) in maps}
    return paths - mapped


class _OneRank:
    """torch.distributed's part for a world of one: nothing to exchange."""
    rank, world = 0, 1

    class dist:
        @staticmethod
        def barrier():
            pass

    @staticmethod
    def broadcast_object(obj, src=0):
        return obj


def test_no_room_in_dev_shm_falls_back_to_the_backend_or_says_what_to_do(monkeypatch):
    import pytest

    from monsoon.engines.torchrun import shm_reduce
    from monsoon.errors import ConfigError

    assert shm_reduce.has_room(1) and not shm_reduce.has_room(1 << 60)
    shm = shm_reduce.open_shm_reduce(_OneRank(), 5, np.float32, 5.0, required=False)
    a = np.arange(5, dtype=np.float32)
    shm.all_reduce(a)
    assert np.array_equal(a, np.arange(5))
    shm.close()
    monkeypatch.setattr(shm_reduce, "has_room", lambda nbytes: False)
    assert shm_reduce.open_shm_reduce(_OneRank(), 5, np.float32, 5.0, required=False) is None
    with pytest.raises(ConfigError, match="--shm-size"):
        shm_reduce.open_shm_reduce(_OneRank(), 5, np.float32, 5.0, required=True)


def test_a_cpu_that_reorders_stores_reduces_through_the_backend(monkeypatch):
    """The block's counters need stores kept in order (x86): elsewhere
    ``auto`` picks the backend's all-reduce and ``shm`` is refused."""
    import pytest

    from monsoon.engines.torchrun import shm_reduce
    from monsoon.errors import ConfigError

    one_machine = {"local_world_size": 2, "world_size": 2}
    assert shm_reduce.uses_shm("auto", "gloo", one_machine) == (not shm_reduce.NEEDS_FENCE)
    monkeypatch.setattr(shm_reduce, "NEEDS_FENCE", True)
    assert not shm_reduce.uses_shm("auto", "gloo", one_machine)
    with pytest.raises(ConfigError, match="keeps stores in order"):
        shm_reduce.uses_shm("shm", "gloo", one_machine)

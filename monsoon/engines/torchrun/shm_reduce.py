"""A sum all-reduce through shared memory, for ranks on one machine.

gloo reduces between processes of one machine over TCP loopback: copies
through the kernel, and a sum in gloo's own threads that compete with the
ranks' compute for the cores (bench/torch_engine_vs_ddp.py). Ranks that
share a machine can meet in one block of shared memory instead, as NCCL's
SHM transport and monsoon's local engine do:

- the block holds two rounds of slots (by call parity), one slot per rank,
  and one counter per rank: the calls it has published;
- call k (k = 1, 2, ...): rank r writes its contribution into slot
  [k % 2][r], sets counter[r] = k, waits until every counter is >= k, and
  sums the round's slots in rank order into its own buffer.

Invariants:

- every rank adds the same slots in the same order, so every rank holds
  the bit-identical sum (the replicas stay identical, as after gloo's);
- a slot is rewritten (call k + 2) only after every rank has read it: a
  rank starts call k + 2 after the wait of call k + 1, which needs every
  counter >= k + 1, and a rank publishes call k + 1 only after its sum of
  call k;
- every wait is bounded by ``--timeout``, and a rank whose process has
  gone is named within one check of the wait (each rank's pid is in the block);
- nothing is left in /dev/shm: rank 0 removes the file once every rank
  has mapped it; where /dev/shm has no room for the slots (a container's
  is often 64 MB), the ranks use the backend's all-reduce instead.

Counters are written after the slot, and read before it; x86's stores
become visible in program order. The block has no lock to fence with, so
on a CPU that does not keep stores in order (``NEEDS_FENCE``: ARM) the
ranks use the backend's all-reduce, and ``--reduce-via shm`` is refused.
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from ...errors import ConfigError, WorkerError
from ...shared_memory import NEEDS_FENCE, SharedArrays, shm_dir
from ...monitor.waiting import wait_until

PEER_CHECK_S = 0.05


REDUCE_VIA = ("auto", "shm", "backend")


def uses_shm(reduce_via: str, backend: str, env: dict) -> bool:
    """Whether the ranks reduce through shared memory: ``auto`` where every
    rank runs on this machine (torchrun's LOCAL_WORLD_SIZE is the world) and
    the buffers live in host memory (gloo; NCCL reduces on the GPUs), on a
    CPU that keeps stores in order."""
    one_machine = env["local_world_size"] == env["world_size"]
    if reduce_via == "shm" and NEEDS_FENCE:
        raise ConfigError("--reduce-via shm needs a CPU that keeps stores in order (x86); "
                          "use --reduce-via auto or backend here")
    if reduce_via == "shm":
        if not one_machine:
            raise ConfigError(f"--reduce-via shm needs every rank on one machine, but "
                              f"{env['world_size']} ranks run {env['local_world_size']} per node; "
                              "use --reduce-via auto or backend")
        return True
    return reduce_via == "auto" and one_machine and backend == "gloo" and not NEEDS_FENCE


def _gone(pid: int) -> bool:
    """The process has exited (a zombie its agent has not reaped counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def has_room(nbytes: int) -> bool:
    """Whether the shared-memory file system can hold ``nbytes`` more. A
    write past a tmpfs's size kills the process with SIGBUS, and a
    container's /dev/shm is often small (Docker's default is 64 MB)."""
    st = os.statvfs(shm_dir() or tempfile.gettempdir())
    return st.f_bavail * st.f_frsize >= nbytes + nbytes // 8 + (1 << 20)


def open_shm_reduce(comm, size: int, dtype, timeout: float, required: bool):
    """The ranks' ``ShmAllReduce`` for buffers of ``size`` elements, or None
    where the shared-memory file system has no room for it (then the ranks
    use the backend's all-reduce, or with ``required`` all fail alike)."""
    world = comm.world
    block = None
    if comm.rank == 0:
        layout = {"slots": ((2, world, size), str(np.dtype(dtype))),
                  "calls": ((world,), "int64"), "pids": ((world,), "int64")}
        if has_room(2 * world * size * np.dtype(dtype).itemsize):
            block = SharedArrays(layout)
    block = comm.broadcast_object(block)  # the others map it by its path; the same verdict
    if block is None:
        if required:
            raise ConfigError(f"--reduce-via shm: {shm_dir() or tempfile.gettempdir()} has no "
                              f"room for {2 * world * size * np.dtype(dtype).itemsize / 2**20:.0f}"
                              " MB of slots; give it more (docker run --shm-size) or use "
                              "--reduce-via backend")
        return None
    try:
        block["pids"][comm.rank] = os.getpid()
        comm.dist.barrier()  # every rank has mapped it
    finally:
        if comm.rank == 0:
            block.unlink()
    return ShmAllReduce(comm.rank, world, block, timeout)


class ShmAllReduce:
    def __init__(self, rank: int, world: int, block, timeout: float):
        self.rank, self.world = rank, world
        self.timeout = timeout
        self.block = block
        self.slots, self.calls, self.pids = block["slots"], block["calls"], block["pids"]
        self.k = 0
        self._checked = time.monotonic()

    def contribution(self) -> np.ndarray:
        """This rank's slot for the next call: write the contribution here
        and call ``reduce`` (saves ``all_reduce``'s copy)."""
        return self.slots[(self.k + 1) % 2, self.rank]

    def all_reduce(self, array: np.ndarray) -> None:
        """Sum ``array`` over the ranks, in place."""
        np.copyto(self.contribution(), array)
        self.reduce(array)

    def reduce(self, out: np.ndarray) -> None:
        """Publish this rank's contribution, wait for every rank's, and sum
        them in rank order into ``out``."""
        k = self.k + 1
        self.calls[self.rank] = k
        calls = self.calls
        wait_until(lambda: calls.min() >= k, self.timeout, self._peer_gone,
                   f"the other ranks' call {k} of the shared-memory all-reduce")
        slots = self.slots[k % 2]
        if self.world == 1:
            np.copyto(out, slots[0])
        else:
            np.add(slots[0], slots[1], out=out)
            for j in range(2, self.world):
                out += slots[j]
        self.k = k

    def _peer_gone(self) -> bool:
        now = time.monotonic()
        if now - self._checked < PEER_CHECK_S:
            return False
        self._checked = now
        for j, pid in enumerate(self.pids):
            if j != self.rank and self.calls[j] < self.k + 1 and _gone(int(pid)):
                raise WorkerError(f"rank {j} (pid {int(pid)}) has exited")
        return False

    def close(self) -> None:
        self.slots = self.calls = self.pids = None
        self.block.close()

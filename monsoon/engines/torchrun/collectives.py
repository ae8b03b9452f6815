"""torch.distributed for the torch engine: the process group and the
collectives it needs, a sum all-reduce of a flat buffer and (compressed
runs) an all-gather of every rank's packed message.

Backends: ``gloo`` reduces CPU tensors in place, so a NumPy buffer is
reduced through ``torch.from_numpy`` with no copy. ``nccl`` (``--dist-backend
nccl``, or ``auto`` when CUDA is available) reduces GPU tensors: each rank
uses the GPU of its LOCAL_RANK (one device per local rank, as torchrun's
``--nproc-per-node`` = GPUs per node expects), the buffer is copied there,
reduced, and copied back. The model computes on the rank's GPU under
``--device cuda`` (``devices.rank_device``), else on the CPU. A buffer
already on the group's GPU (the ranks' arrays on the device, ``rank.py``)
is reduced where it is, with no copy either way. The NCCL path is verified
by tests/test_gpu.py where a GPU exists.

Attempts (``join_attempt``): torchrun's agents keep one store for the
whole run, and under ``--max-restarts`` every attempt's ranks must meet in a
prefix of it that no earlier attempt used, or a restarted gloo group reads
a dead attempt's addresses (connection refused). The agents' restart
counts (TORCHELASTIC_RESTART_COUNT) cannot name it: an agent restarts its
ranks uncounted when another node joins the rendezvous (a membership
change), so after a lost link the two nodes' counts can differ. Rank 0
names the attempt instead, and every other rank learns the name through a
nonce of its own, which no earlier attempt can have answered.

``init_process_group`` gets ``--timeout`` as its timeout: every collective
then fails after that long instead of torch's default (30 minutes for gloo,
10 for NCCL), so a rank that dies or hangs ends the run within the timeout.
"""
from __future__ import annotations

import datetime
import os
import time
import uuid

import numpy as np

from ...errors import ConfigError, WaitTimeout

ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """Whether this process is a rank started by torchrun (or its agent)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def launch_id() -> str | None:
    """The id of the launch this rank belongs to, the same on every attempt
    of it (TORCHELASTIC_RUN_ID: monsoon's launcher and torchrun --standalone
    draw a fresh one per launch; otherwise torchrun's --rdzv-id, "none" by
    default and under --master-port); None outside one."""
    return os.environ.get("TORCHELASTIC_RUN_ID")


def agent_restarts() -> int:
    """This rank's agent's restart count (TORCHELASTIC_RESTART_COUNT; 0
    outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0) or 0)


def rank_env() -> dict:
    """torchrun's variables, checked: rank, world_size, local_rank (ints),
    master_addr, master_port."""
    missing = [k for k in ENV if k not in os.environ]
    if missing:
        raise ConfigError(f"the torch engine's ranks need torchrun's {', '.join(missing)} in "
                          "the environment; start them with torchrun, or run monsoon train "
                          "--engine torch --workers N without torchrun to launch them")
    return {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"]),
            "local_rank": int(os.environ["LOCAL_RANK"]),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
            "master_addr": os.environ["MASTER_ADDR"], "master_port": os.environ["MASTER_PORT"]}


def join_attempt(store, rank: int, world: int, timeout: float) -> tuple[int, str]:
    """This attempt's number (0 for the run's first; rank 0's count of the
    attempts that reached this point in the store) and its name, the same
    on every rank of the attempt.

    Rank 0 counts the attempt and names it. Every other rank queues a fresh
    nonce and waits for the name under that nonce; rank 0 answers every
    nonce in the queue (those an earlier attempt's ranks left are answered
    too, and read by no one) until every other rank has said it has the
    name. No rank can read an earlier attempt's name: torchrun starts an
    attempt's ranks only once every node's earlier ranks have been stopped,
    and only this attempt's rank 0 can answer a nonce made in it."""
    if world == 1:
        return store.add("attempts", 1) - 1, uuid.uuid4().hex
    if rank != 0:
        nonce = uuid.uuid4().hex
        store.queue_push("hello", nonce)
        try:
            store.wait([f"welcome/{nonce}"], datetime.timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001 - torch's DistStoreError: say what it means
            raise _late(f"rank {rank}: rank 0 did not start", timeout, 0) from None
        name = store.get(f"welcome/{nonce}").decode()
        store.add(f"joined/{name}", 1)
        return int(name.split("-")[0]), name
    attempt = store.add("attempts", 1) - 1
    name = f"{attempt}-{uuid.uuid4().hex}"
    deadline = time.monotonic() + timeout
    while store.add(f"joined/{name}", 0) < world - 1:
        while store.queue_len("hello") > 0:
            store.set(f"welcome/{store.queue_pop('hello', False).decode()}", name)
        if time.monotonic() > deadline:
            joined = store.add(f"joined/{name}", 0)
            raise _late(f"rank 0: {world - 1 - joined} of the other {world - 1} ranks did not "
                        "start", timeout, 1 if world == 2 else None)
        time.sleep(0.01)
    return attempt, name


def _late(what: str, timeout: float, worker) -> WaitTimeout:
    err = WaitTimeout(f"{what} within --timeout {timeout:g} s (torchrun starts an attempt's "
                      "ranks together: a late one is slow or stuck in its start-up)")
    err.worker = worker
    return err


def pick_backend(requested: str) -> str:
    import torch

    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise ConfigError("--dist-backend nccl needs CUDA GPUs on every worker; use gloo on CPUs")
    return requested


class _Pending:
    """An NCCL all-reduce in flight: on ``wait`` the GPU result is copied back."""

    def __init__(self, work, host, device_tensor):
        self.work, self.host, self.device_tensor = work, host, device_tensor

    def wait(self):
        self.work.wait()
        self.host.copy_(self.device_tensor)


class Collectives:
    def __init__(self, backend: str, timeout: float, env: dict):
        import torch
        import torch.distributed as dist

        self.dist = dist
        self.torch = torch
        self.backend = pick_backend(backend)
        self.device = None
        if self.backend == "nccl":
            self.device = torch.device("cuda", env["local_rank"])
            torch.cuda.set_device(self.device)
        limit = datetime.timedelta(seconds=timeout)
        # torchrun's env:// store, with this attempt's own prefix (join_attempt)
        store, rank, world = next(dist.rendezvous("env://", timeout=limit))
        self.attempt, name = join_attempt(dist.PrefixStore("monsoon/", store), rank, world,
                                          timeout)
        store = dist.PrefixStore(f"monsoon/attempt-{name}/", store)
        dist.init_process_group(self.backend, store=store, rank=rank, world_size=world,
                                timeout=limit,
                                **({"device_id": self.device} if self.device is not None else {}))
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def tensor(self, array):
        """A torch view of ``array`` (no copy; a tensor is itself): what
        ``all_reduce`` takes."""
        if isinstance(array, self.torch.Tensor):
            return array
        return self.torch.from_numpy(array)

    def all_reduce(self, t, async_op: bool = False):
        """Sum ``t`` (a CPU tensor, see ``tensor``, or one on this group's
        GPU) over the ranks, in place."""
        if self.device is None or t.device == self.device:
            return self.dist.all_reduce(t, async_op=async_op)
        on_device = t.to(self.device)
        work = self.dist.all_reduce(on_device, async_op=True)
        pending = _Pending(work, t, on_device)
        if async_op:
            return pending
        pending.wait()
        return None

    def all_gather(self, array: np.ndarray) -> np.ndarray:
        """Every rank's ``array`` (the same length on each), as rows in rank
        order: what a compressed collective moves (``rank.py``)."""
        t = self.tensor(array)
        if self.device is not None:
            t = t.to(self.device)
        rows = [self.torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(rows, t)
        return np.stack([r.cpu().numpy() for r in rows])

    def broadcast_array(self, array: np.ndarray, src: int = 0) -> None:
        t = self.tensor(array)
        if self.device is None:
            self.dist.broadcast(t, src)
        else:
            on_device = t.to(self.device)
            self.dist.broadcast(on_device, src)
            t.copy_(on_device)

    def broadcast_object(self, obj, src: int = 0):
        box = [obj]
        self.dist.broadcast_object_list(box, src)
        return box[0]

    def gather_object(self, obj, dst: int = 0):
        out = [None] * self.world if self.rank == dst else None
        self.dist.gather_object(obj, out, dst)
        return out

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()

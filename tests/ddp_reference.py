"""PyTorch DDP on gloo, the reference for ``sync`` (tests/test_user_model.py).

``run_ddp(module, X, y, ...)`` trains copies of ``module`` in ``world``
spawned processes with DDP (``broadcast_buffers=True``, its default) and plain
SGD, each step on the same halves monsoon's ``sync`` gives its workers
(``epoch_permutation`` and ``part_bounds``), and returns rank 0's state_dict.
"""
from __future__ import annotations

import copy
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from monsoon.strategies.batches import epoch_permutation, part_bounds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, module, loss_fn, X, y, lr, steps, seed, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # the spawned ranks received the module through shared memory: each
    # trains its own copy, as separate DDP processes do
    model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(module))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n = len(X)
    for step in range(steps):  # full batch: each step is one epoch
        order = torch.from_numpy(epoch_permutation(n, seed, step))
        a, b = part_bounds(n, world, rank)
        mine = order[a:b]
        opt.zero_grad()
        loss_fn(model(X[mine]), y[mine]).backward()
        opt.step()
    if rank == 0:
        torch.save(model.module.state_dict(), path)
    dist.barrier()
    dist.destroy_process_group()


def run_ddp(module, loss_fn, X, y, lr: float, steps: int, seed: int, path, world: int = 2):
    try:
        tmp.start_processes(_worker, args=(world, _free_port(), module, loss_fn, X, y, lr, steps,
                                           seed, str(path)),
                            nprocs=world, join=True, start_method="spawn")
    except tmp.ProcessExitedException:
        # gloo sometimes aborts while tearing down; the state was saved first
        if not os.path.exists(path):
            raise
    return torch.load(path, weights_only=True)

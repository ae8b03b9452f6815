"""The peer: PyTorch DistributedDataParallel on gloo, one process per worker.

``ddp_examples_per_s(make_model, make_data, ...)`` trains ``make_model()`` on
``make_data() -> (X, y)`` with plain SGD for ``steps`` steps of a global batch
split evenly among ``world`` processes (one torch thread each), and returns
examples per second over the steps after the first few (the warm-up steps
train too: ``steps`` in all, as monsoon's runs take). ``make_model`` and
``make_data`` must be module-level functions (spawned processes import them).
``ddp_run`` is the same with its final loss on all of ``make_data()`` too,
and optionally PyTorch's own PowerSGD communication hook
(``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``).
``one_process_examples_per_s`` is the other peer: one process, plain SGD.
"""
from __future__ import annotations

import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp


def epoch_batches(n: int, batch: int, seed: int = 0):
    """Batches of ``batch`` indices walking a fresh permutation of ``n``
    each epoch (what ``DistributedSampler(shuffle=True)`` gives a DDP
    user), forever: monsoon's own permutations for ``seed``
    (``strategies/batches.epoch_permutation``), so that a peer and a
    monsoon sync run of the same seed take the same batches, each rank the
    same part of each."""
    from monsoon.strategies.batches import epoch_permutation

    epoch = 0
    while True:
        order = epoch_permutation(n, seed, epoch)
        for a in range(0, n - batch + 1, batch):
            yield torch.from_numpy(order[a:a + batch])
        epoch += 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, make_model, make_data, loss_fn, batch, lr, steps, warmup, out,
            powersgd_rank=0):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    X, y = make_data()
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    torch.manual_seed(0)
    # PowerSGD: one bucket for the whole gradient. With several buckets on gloo,
    # torch 2.x's hook aborted ("Received data size doesn't match expected
    # size"), likely its callbacks' all-reduces of Q racing the next bucket's.
    model = torch.nn.parallel.DistributedDataParallel(
        make_model(), **({"bucket_cap_mb": 1024} if powersgd_rank else {}))
    if powersgd_rank:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        # from the third step (the earliest the hook allows with error feedback:
        # steps 0 and 1, iter < start_powerSGD_iter, are plain all-reduces)
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=powersgd_rank,
                                            start_powerSGD_iter=2, use_error_feedback=True,
                                            warm_start=True, random_seed=0)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    batches = epoch_batches(len(X), batch)
    per = batch // world

    def step():
        mine = next(batches)[rank * per:(rank + 1) * per]
        opt.zero_grad(set_to_none=False)
        loss_fn(model(X[mine]), y[mine]).backward()
        opt.step()

    for i in range(steps):  # the warm-up steps train too: ``steps`` in all, as monsoon's
        if i == warmup:
            dist.barrier()
            t0 = time.perf_counter()
        step()
    dist.barrier()
    if rank == 0:
        speed = (steps - warmup) * batch / (time.perf_counter() - t0)
        with torch.no_grad():
            final = float(loss_fn(model.module(X), y))
        out.put({"examples_per_s": speed, "final_loss": final})
    dist.barrier()
    dist.destroy_process_group()


def ddp_run(make_model, make_data, loss_fn, batch: int, lr: float, steps: int,
            world: int = 2, warmup: int = 3, powersgd_rank: int = 0) -> dict:
    """``{"examples_per_s", "final_loss"}`` of DDP (with PyTorch's PowerSGD
    hook at ``powersgd_rank`` when given), rank 0's."""
    out = tmp.get_context("spawn").SimpleQueue()
    try:
        tmp.start_processes(_worker, args=(world, _free_port(), make_model, make_data, loss_fn,
                                           batch, lr, steps, warmup, out, powersgd_rank),
                            nprocs=world, join=True, start_method="spawn")
    except tmp.ProcessExitedException:
        # gloo sometimes aborts while tearing down ("terminate called without
        # an active exception"); the measurement was already taken.
        if out.empty():
            raise
    return out.get()


def ddp_examples_per_s(make_model, make_data, loss_fn, batch: int, lr: float, steps: int,
                       world: int = 2, warmup: int = 3) -> float:
    return ddp_run(make_model, make_data, loss_fn, batch, lr, steps, world,
                   warmup)["examples_per_s"]


def one_process_examples_per_s(make_model, make_data, loss_fn, batch: int, lr: float, steps: int,
                               threads: int, warmup: int = 3) -> float:
    """The other peer: one process, ``threads`` torch threads, plain SGD on
    ``epoch_batches`` of ``batch``; examples per second after ``warmup`` steps."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        X, y = make_data()
        X, y = torch.as_tensor(X), torch.as_tensor(y)
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        batches = epoch_batches(len(X), batch)
        for i in range(steps):
            if i == warmup:
                t0 = time.perf_counter()
            chosen = next(batches)
            opt.zero_grad()
            loss_fn(model(X[chosen]), y[chosen]).backward()
            opt.step()
        return (steps - warmup) * batch / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)

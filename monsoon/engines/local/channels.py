"""Shared-memory channels: the local engine's activation transport between
pipeline stages (``pipeline.py``).

One channel carries one direction between two neighbouring stages (a
stage's activations forward, or their gradients back): a ring of K slots in
one shared-memory block (``monsoon/shared_memory.py``) with one writer and
one reader. ``send`` waits for a free slot, copies the array's bytes into it,
writes its header (micro-batch, dtype, shape) and only then advances the
write counter; ``recv`` waits for the counter, copies the bytes out (the
stage keeps them for its backward) and advances the read counter. No
pickling, no pipe, no sender thread: one copy in, one copy out.

Slots are sized before the run from a dry forward of one example (each
stage boundary's activation per example) times the largest micro-batch;
K = M slots hold a whole batch, so a GPipe sender never waits for space.
Every wait has the run's timeout and stops when the run is aborted. A
receiver spins a few turns, then sleeps with back-off (``waiting.py``): on
a shared machine a stage spinning through its bubble would take the core
its neighbour computes on.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...errors import ConfigError
from ...strategies.pipeline.stages import layers_of, untouched
from ...shared_memory import SharedArrays
from ...monitor.waiting import wait_until

# A stage waits a lot (the bubble): it spins only briefly, then sleeps, so
# that a waiting stage does not take the core a computing one needs.
HOT_TURNS = 64

MAX_DIMS = 8
HEAD = 3  # m, nbytes, ndim, then the shape
_DTYPES = [np.dtype(t) for t in ("float32", "float64", "float16", "int64", "int32", "bool")]


class Channel:
    def __init__(self, slots: int, slot_bytes: int):
        self.shared = SharedArrays({"data": ((slots, max(slot_bytes, 8)), "uint8"),
                                    "meta": ((slots, HEAD + 1 + MAX_DIMS), "int64"),
                                    "ctr": ((2,), "int64")})
        self.slots = slots

    def attach(self, timeout: float, aborted) -> "Channel":
        """Bind the waiting policy (in the worker that uses this end)."""
        self.timeout, self.aborted = timeout, aborted
        self.data, self.meta, self.ctr = self.shared["data"], self.shared["meta"], self.shared["ctr"]
        return self

    def send(self, m: int, array: np.ndarray, what: str) -> None:
        ctr, K = self.ctr, self.slots
        wait_until(lambda: ctr[0] - ctr[1] < K, self.timeout, self.aborted,
                   f"a free slot to send {what}", spin=False)
        array = np.ascontiguousarray(array)
        slot = int(ctr[0] % K)
        if array.nbytes > self.data.shape[1] or array.ndim > MAX_DIMS:
            raise ConfigError(f"{what} of micro-batch {m} has shape {array.shape} "
                              f"({array.nbytes} bytes), more than its channel was sized for "
                              f"({self.data.shape[1]} bytes): the pipeline needs each layer's "
                              "output size per example to be fixed")
        self.data[slot, :array.nbytes] = array.reshape(-1).view(np.uint8)
        head = self.meta[slot]
        head[0], head[1], head[2], head[3] = m, array.nbytes, array.ndim, _DTYPES.index(array.dtype)
        head[HEAD + 1:HEAD + 1 + array.ndim] = array.shape
        ctr[0] += 1  # published after the bytes and the header (x86/ARM: a release store suffices)

    def recv(self, m: int, what: str) -> np.ndarray:
        ctr, K = self.ctr, self.slots
        if not ctr[0] > ctr[1]:
            for _ in range(HOT_TURNS):
                if ctr[0] > ctr[1]:
                    break
            else:
                wait_until(lambda: ctr[0] > ctr[1], self.timeout, self.aborted, what, spin=False)
        slot = int(ctr[1] % K)
        head = self.meta[slot]
        if head[0] != m:
            raise RuntimeError(f"{what}: expected micro-batch {m}, got {head[0]}")
        nbytes, ndim, dtype = int(head[1]), int(head[2]), _DTYPES[int(head[3])]
        shape = tuple(int(d) for d in head[HEAD + 1:HEAD + 1 + ndim])
        out = self.data[slot, :nbytes].copy().view(dtype).reshape(shape)
        ctr[1] += 1
        return out

    def close(self) -> None:
        self.shared.close()


def boundary_bytes(problem, specs) -> list[int]:
    """Bytes per example of the activation leaving each stage but the last
    (a dry forward of one example, no gradients, in eval mode: BatchNorm
    takes one example then, and its running statistics stay as they were)."""
    layers = layers_of(problem)
    out = []
    with untouched(layers), torch.no_grad():
        for layer in layers:
            layer.eval()
        x = problem.X[:1]
        for spec in specs[:-1]:
            for layer in layers[spec.layers[0]:spec.layers[1]]:
                x = layer(x)
            if not isinstance(x, torch.Tensor):
                raise ConfigError(f"stage {spec.index} returns a {type(x).__name__}; pipeline "
                                  "stages must pass one tensor to the next")
            out.append(x.numel() * x.element_size())
    return out


def largest_micro_batch(batch_size: int, replicas: int, micro: int) -> int:
    return max(1, math.ceil(math.ceil(batch_size / replicas) / micro))

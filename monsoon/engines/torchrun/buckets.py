"""Sync's all-reduce overlapped with backward, in buckets, as DDP does
(Li et al., "PyTorch Distributed", VLDB 2020).

A torch problem's gradient lands in one flat buffer (``TorchProblem``), its
parameters in order. Backward produces the last parameters' gradients
first, so the buffer is cut, from its end, into buckets of contiguous
ranges: the first of ``first_bytes`` (DDP: 1 MB), the others of ``cap_bytes``
(DDP's ``bucket_cap_mb``, 25 MB). A post-accumulate-grad hook on every
parameter counts the bucket's parameters down; when a bucket is complete
its part of the buffer is scaled by this rank's examples n_k and an
asynchronous all-reduce starts, while backward goes on with the earlier
layers. After backward the buckets not started yet (a parameter the loss
did not use) start, every one is waited for, and the buffer holds
sum_k n_k g_k, its flags (``FLAGS`` slots after the gradient, in the first
bucket) sum_k n_k and the other flags.

Invariant: buckets start in one fixed order on every rank (a bucket starts
only after the one before it), so the ranks' collectives always match,
whatever order the hooks fire in. An empty contribution (``grad=None``)
runs the same collectives with zeros.
"""
from __future__ import annotations

import numpy as np

DEFAULT_FIRST_BYTES = 1 << 20


def bucket_ranges(sizes: list[int], itemsize: int, cap_bytes: int,
                  first_bytes: int = DEFAULT_FIRST_BYTES) -> list[tuple[int, int, list[int]]]:
    """(lo, hi, parameter indices) per bucket, in launch order (last
    parameters first); together they cover the flat buffer exactly."""
    out = []
    hi = lo = sum(sizes)
    members: list[int] = []
    cap = first_bytes
    for i in reversed(range(len(sizes))):
        lo -= sizes[i]
        members.append(i)
        if (hi - lo) * itemsize >= cap or i == 0:
            out.append((lo, hi, members))
            hi, members, cap = lo, [], cap_bytes
    return out


class Buckets:
    def __init__(self, problem, buf: np.ndarray, n_flags: int, comm, cap_bytes: int,
                 first_bytes: int = DEFAULT_FIRST_BYTES):
        n = problem.n_params
        self.comm = comm
        self.n = n
        ranges = bucket_ranges(problem._sizes, buf.itemsize, cap_bytes, first_bytes)
        self.count = len(ranges)
        # the flags travel in the first bucket to start
        self.whole = [comm.tensor(buf[lo:hi + (n_flags if k == 0 else 0)])
                      for k, (lo, hi, _) in enumerate(ranges)]
        self.grads = [comm.tensor(buf[lo:hi]) for lo, hi, _ in ranges]
        self.sizes = [len(members) for _, _, members in ranges]
        self.grad_all = comm.tensor(buf[:n])
        self.left = list(self.sizes)
        self.next = 0
        self.armed = False
        self.scale = 1
        self.handles = []
        self.hooks = []
        for k, (_, _, members) in enumerate(ranges):
            for i in members:
                self.hooks.append(problem._params[i].register_post_accumulate_grad_hook(
                    self._hook(k)))

    def _hook(self, k: int):
        def ready(_param):
            if self.armed:
                self.left[k] -= 1
                if self.left[k] == 0:
                    while self.next < self.count and self.left[self.next] == 0:
                        self._start(self.next)
        return ready

    def _start(self, k: int) -> None:
        if self.scale != 1:
            self.grads[k].mul_(self.scale)
        self.handles.append(self.comm.all_reduce(self.whole[k], async_op=True))
        self.left[k] = -1  # started
        self.next = k + 1

    def begin(self, examples: int) -> None:
        """Before backward: zero the gradient (autograd adds into it) and arm
        the hooks; the caller has written the flags."""
        self.grad_all.zero_()
        self.left = list(self.sizes)
        self.next = 0
        self.scale = examples
        self.armed = True

    def finish(self) -> None:
        """After backward: start what has not started, wait for everything."""
        self.armed = False
        while self.next < self.count:
            self._start(self.next)
        handles, self.handles = self.handles, []
        for h in handles:
            h.wait()

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

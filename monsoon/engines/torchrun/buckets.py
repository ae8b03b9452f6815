"""Sync's all-reduce overlapped with backward, in buckets, as DDP does
(Li et al., "PyTorch Distributed", VLDB 2020).

The rank's contribution lands in one flat buffer, its parameters in order
(``TorchProblem``'s layout). Backward produces the last parameters'
gradients first, so the buffer is cut, from its end, into buckets of
contiguous ranges: the first of ``first_bytes`` (DDP: 1 MB), the others of
``cap_bytes`` (DDP's ``bucket_cap_mb``, 25 MB). A post-accumulate-grad hook
on every parameter takes autograd's fresh gradient, writes it scaled by the
rank's weight n_k / B into the parameter's view of the buffer (one pass: no
zeroing, no copy afterwards) and counts the bucket down; a complete bucket
starts an asynchronous all-reduce while backward goes on with the earlier
layers. After backward the parameters the loss did not use get zeros, the
buckets not started yet start, and every one is waited for: the buffer
holds sum_k (n_k / B) g_k, and its flags (``FLAGS`` slots after the
gradient, sent with the first bucket) sum_k n_k and the other flags: the
rank's own examples and loss of this step too, the loss written between
forward and backward (``on_loss``), before any bucket starts.

The buffer is a NumPy array in host memory, or a tensor on the rank's
device (``rank.py``: the ranks' arrays on a GPU): then each hook's scaled
write lands in the parameter's device view and the all-reduces run on the
device, with no copy to the host.

Invariant: buckets start in one fixed order on every rank (a bucket starts
only after the one before it), so the ranks' collectives always match,
whatever order the hooks fire in. An empty contribution (``grad=None``)
runs the same collectives with zeros.
"""
from __future__ import annotations

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
    def __init__(self, problem, buf, n_flags: int, comm, cap_bytes: int,
                 first_bytes: int = DEFAULT_FIRST_BYTES):
        import torch

        self.torch = torch
        self.problem = problem
        self.comm = comm
        n = problem.n_params
        ranges = bucket_ranges(problem._sizes, buf.itemsize, cap_bytes, first_bytes)
        self.count = len(ranges)
        # the flags travel in the first bucket to start
        self.whole = [comm.tensor(buf[lo:hi + (n_flags if k == 0 else 0)])
                      for k, (lo, hi, _) in enumerate(ranges)]
        self.views = list(problem._views(buf[:n]))  # each parameter's part of the buffer
        self.members = [members for _, _, members in ranges]
        self.sizes = [len(members) for members in self.members]
        self.left = list(self.sizes)
        self.done = [False] * len(self.views)
        self.next = 0
        self.armed = False
        self.weight = 1.0
        self.handles = []
        self.hooks = []
        for k, members in enumerate(self.members):
            for i in members:
                self.hooks.append(problem._params[i].register_post_accumulate_grad_hook(
                    self._hook(k, i)))

    def _hook(self, k: int, i: int):
        def take(param):
            if not self.armed:
                return
            if param.grad.device == self.views[i].device:
                self.torch.mul(param.grad, self.weight, out=self.views[i])
            else:  # a model on a GPU: the contribution comes to the host buffer
                self.views[i].copy_(param.grad.mul_(self.weight))
            param.grad = None
            self.done[i] = True
            self.left[k] -= 1
            if self.left[k] == 0:
                while self.next < self.count and self.left[self.next] == 0:
                    self._start(self.next)
        return take

    def _start(self, k: int) -> None:
        for i in self.members[k]:
            if not self.done[i]:  # the loss did not use it (or nothing was computed)
                self.views[i].zero_()
        self.handles.append(self.comm.all_reduce(self.whole[k], async_op=True))
        self.left[k] = -1  # started
        self.next = k + 1

    def gradient(self, w, indices, weight: float, on_loss=None):
        """Backward at ``w`` over ``indices``, all-reducing as it goes; the
        caller has written the flags, ``on_loss(loss)`` (the loss tensor,
        before any bucket starts) may add to them. Returns the loss tensor;
        ``finish`` completes the step."""
        self.begin(weight)
        try:
            return self.problem._backward(w, indices, True, on_loss)
        except BaseException:
            self.armed = False
            raise

    def begin(self, weight: float) -> None:
        self.left = list(self.sizes)
        self.done = [False] * len(self.views)
        self.next = 0
        self.weight = weight
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

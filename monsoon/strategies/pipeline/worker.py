"""One pipeline stage's worker: its layers, its parameters, its rule state.

The loop, the same on every engine (``link`` is the engine's transport):

    for each batch t (the batches serial visits, from the seed):
        mine = this replica's part of the batch (R replicas: sizes differ by <= 1)
        cut mine into M micro-batches
        for (F|B, m) in the schedule:
            F m: x = data (first stage) or link.recv_act(m); out = layers(x)
                 last stage: loss_m = loss_fn(out, y) * |m| / |batch|
                 else: link.send_act(m, out)
            B m: last stage: loss_m.backward()
                 else: out.backward(link.recv_grad(m))
                 not first: link.send_grad(m, x.grad)
        g = link.reduce(sum of the accumulated .grad)   # over replicas, rank order (add_replicas)
        rule.apply(w_stage, g, state_stage, step=t)

Weighting each micro-batch's mean loss by |m| / |batch| makes the summed
gradient the full batch's mean gradient (an epoch's short last batch
divides by a full batch's size instead, as ``batches.tail_weight`` weighs
it), so the update equals serial's up to
floating-point reduction order (tested to 1e-9 in float64). The worker
holds only its stage's layers, parameters, gradient and rule state.

``busy_s`` is the time spent computing (forward, backward, update), not in
the transport (waiting for a neighbour, copying a message in or out: the sim
models that as the message's time); the bubble is 1 - sum(busy) / (S * wall).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from ...rules import UpdateInfo
from ..batches import part_bounds
from .schedules import peak_activations, schedule
from .stages import stage_buffers


class StageWorker:
    def __init__(self, spec, module, rule, dtype, replica: int, replicas: int, micro: int,
                 schedule_name: str, X=None, y=None, loss_fn=None, full_batch: int = 0):
        self.spec, self.module, self.rule = spec, module, rule
        # a full batch's size: an epoch's short last batch divides by it
        # (``batches.tail_weight``), so each of its examples weighs as in a full one
        self.full_batch = full_batch
        self.replica, self.replicas, self.micro = replica, replicas, micro
        self.schedule_name = schedule_name
        self.X, self.y, self.loss_fn = X, y, loss_fn
        self.dtype = np.dtype(dtype)
        self._params = [p for p in module.parameters() if p.requires_grad]
        n = sum(p.numel() for p in self._params)
        self.params = np.empty(n, dtype=self.dtype)
        flat = torch.from_numpy(self.params)
        offset = 0
        for p in self._params:  # the layers view one flat vector: the rule's array
            size = p.numel()
            flat[offset:offset + size].copy_(p.data.reshape(-1))
            p.data = flat[offset:offset + size].view(p.shape)
            offset += size
        self.grad = np.zeros(n, dtype=self.dtype)
        self._grad_flat = torch.from_numpy(self.grad)
        self.state = rule.init(n, self.dtype)
        self.busy_s = 0.0
        self.steps = self.dropped = 0
        self.dropped_steps: list[int] = []  # the steps whose gradient was not finite here
        self.peak_in_flight = 0
        self.loss_sum = 0.0
        # per step, on real transports: wall, compute, and when it ended
        # (time.perf_counter: one monotonic clock for every process of a machine)
        self.step_times, self.step_busy, self.step_ends = [], [], []

    def memory(self) -> dict:
        """Bytes of the arrays this worker holds for its stage."""
        return {"param_bytes": int(self.params.nbytes),
                "rule_state_bytes": int(sum(a.nbytes for a in self.state)),
                "grad_bytes": int(self.grad.nbytes)}

    def micro_batches(self, batch: np.ndarray) -> list:
        lo, hi = part_bounds(len(batch), self.replicas, self.replica)
        mine = batch[lo:hi]
        k = min(self.micro, len(mine))
        return [mine[a:b] for a, b in (part_bounds(len(mine), k, m) for m in range(k))]

    # -- one step, op by op (the sim and ray engines order them: dependency_order)
    def begin(self, batch: np.ndarray) -> None:
        self._total = max(len(batch), self.full_batch)
        self._parts = self.micro_batches(batch)
        self.plan = schedule(self.schedule_name, self.spec.index, self.spec.count,
                             len(self._parts))
        self._pos = 0
        self._saved = {}
        self.peak_in_flight = max(self.peak_in_flight, peak_activations(self.plan))
        for p in self._params:
            p.grad = None

    def run_op(self, link) -> float:
        """Run the next op; returns the seconds spent in ``link`` (waiting,
        receiving, sending: the transport's time, not compute)."""
        spec, parts = self.spec, self._parts
        kind, m = self.plan[self._pos]
        self._pos += 1
        waited = 0.0
        if kind == "F":
            if spec.first:
                x = self.X.index_select(0, torch.from_numpy(parts[m]))
            else:
                t0 = time.perf_counter()
                x = torch.from_numpy(link.recv_act(m)).requires_grad_(True)
                waited += time.perf_counter() - t0
            out = self.module(x)
            if spec.last:
                target = self.y.index_select(0, torch.from_numpy(parts[m]))
                out = self.loss_fn(out, target) * (len(parts[m]) / self._total)
                self.loss_sum += float(out.detach())
            else:
                t0 = time.perf_counter()
                link.send_act(m, out.detach().numpy())
                waited += time.perf_counter() - t0
            self._saved[m] = (x, out)
        else:
            x, out = self._saved.pop(m)
            if spec.last:
                out.backward()
            else:
                t0 = time.perf_counter()
                g = torch.from_numpy(link.recv_grad(m))
                waited += time.perf_counter() - t0
                out.backward(g)
            if not spec.first:
                t0 = time.perf_counter()
                link.send_grad(m, x.grad.numpy())
                waited += time.perf_counter() - t0
        return waited

    def apply(self, t: int) -> None:
        """The step's update, on the (replica-summed) gradient in ``grad``."""
        if not self.params.size:  # a stage of parameter-free layers (an activation)
            pass
        elif _finite(self.grad):
            self.rule.apply(self.params, self.grad, self.state, UpdateInfo(step=t))
        else:
            self.dropped += 1
            self.dropped_steps.append(t)
        self.steps += 1

    def step(self, batch: np.ndarray, t: int, link) -> None:
        """One whole step on a real transport (the local and ray engines)."""
        start = time.perf_counter()
        self.begin(batch)
        waited = 0.0
        while self._pos < len(self.plan):
            waited += self.run_op(link)
        self.gather()
        t0 = time.perf_counter()
        link.reduce(self.grad)
        waited += time.perf_counter() - t0
        self.apply(t)
        took = time.perf_counter() - start
        self.busy_s += took - waited
        self.step_times.append(took)
        self.step_busy.append(took - waited)
        self.step_ends.append(start + took)

    def gather(self) -> None:
        """The accumulated ``.grad`` of every parameter into the flat ``grad``."""
        grads = [p.grad for p in self._params]
        if grads and all(g is not None for g in grads):
            torch.cat([g.reshape(-1) for g in grads], out=self._grad_flat)
            return
        offset = 0
        for p, g in zip(self._params, grads):  # no micro-batch, or an unused parameter
            size = p.numel()
            if g is None:
                self._grad_flat[offset:offset + size].zero_()
            else:
                self._grad_flat[offset:offset + size].copy_(g.reshape(-1))
            offset += size

    def buffers(self) -> dict:
        """Its layers' buffers (BatchNorm's running statistics, trained by its
        forwards), named as in the whole model ({}: none)."""
        return stage_buffers(self.spec, self.module)

    def stats(self, wall_s: float) -> dict:
        out = {"stage": self.spec.index, "replica": self.replica, "busy_s": self.busy_s,
               "wall_s": wall_s, "steps": self.steps, "dropped": self.dropped,
               "dropped_steps": list(self.dropped_steps),
               "peak_micro_batches_in_flight": self.peak_in_flight, **self.memory()}
        if self.step_times:  # medians resist the spikes of a shared machine
            out["step_s_median"] = float(np.median(self.step_times))
            out["busy_s_median"] = float(np.median(self.step_busy))
        if len(self.step_times) > 1:  # the first step warms torch up (lazy initialisation)
            out["first_step_end"], out["last_step_end"] = self.step_ends[0], self.step_ends[-1]
            out["busy_s_steady"] = float(np.sum(self.step_busy[1:]))
        return out


def _finite(g: np.ndarray) -> bool:
    """One pass, no allocation: NaN and Inf propagate through the sum (Inf
    and -Inf make NaN silently: the run reports the divergence)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return math.isfinite(float(np.add.reduce(g, axis=None)))

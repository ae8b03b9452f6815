"""One rank of the torch engine: it runs its strategy program (the one the
local and Ray engines run) and carries out each op with torch.distributed.

Every rank holds a replica of the parameters and the server rule's state;
every collective is one sum all-reduce of a buffer ``[payload (n
parameters), examples, active, stop, signalled, loss_k, examples_k, count_k ...]``
(rank k's losses' sum, examples, losses' count since its last collective, its
step's included; rank 0 sums them: rows' examples, losses; ``flag_width``):

- ``AllReduce`` (sync): payload (n_k / B) g_k, B the batch size; every rank
  rescales by B / sum_k n_k where a batch is short, which gives the
  example-weighted mean gradient (the full-batch gradient), and applies
  the rule to its replica: as after DDP's all-reduce, the replicas stay
  identical because the all-reduce hands every rank the same sum. Torch
  problems: in buckets during backward, the flags in the first (``buckets.py``).
- ``Average`` (local SGD, DiLoCo): payload n_k (theta - theta_k), the
  drift; the server's (outer) rule applies the mean drift to the replica,
  and the working copy is reset to it. An inner rule's sums (AdaGrad's)
  follow an applied round by one all-gather of each rank's additions,
  whose rank-order mean every rank adds to its shared sums (Local
  AdaAlter, ``server/summed.py``).
- ``Elastic`` (EASGD, synchronous form of Zhang, Choromanska, LeCun 2015):
  payload d_k = alpha (x_k - x~); x_k -= d_k, x~ += sum_k d_k.
- ``LocalApply``, ``Fetch``: local, no communication.

``--compress``: one all-gather of packed messages instead (``_gather``).
The arrays are tensors on the problem's device where the process group
reduces tensors there (NCCL; a ``resident`` problem on gloo) and nothing
reads the buffer on the host: ``RankWorker.to_device``. Else NumPy arrays.

``active``: a rank whose program has ended joins the others' collectives
with zeros until none is active. ``stop`` is rank 0's (the recorder's
verdict, a stop signal): every rank ends its program after that collective.

Rank 0 records the loss curve from its replica (and stops a run whose own
local steps are mostly dropped: the ranks share the parameters every
round) and, for sync, writes an exact checkpoint every ``checkpoint_every``
steps, with every rank's traffic, buffers and compressor state (one gather);
a restarted attempt (``--max-restarts``) resumes from the newest one, which
rank 0 reads and broadcasts, and ends bit-identical to an uninterrupted run.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections import Counter

import numpy as np

from ... import arrays
from ...errors import ConfigError, Interrupted, WorkerError
from ...problems.base import seed_worker
from ...strategies import WorkerJob
from ...strategies.ops import AllReduce, Average, Fetch
from ...record import checkpoints
from ...record.live import LOSS_CELLS, add_loss
from ...record.progress import counts
from ...monitor.due import Due
from ...monitor.lifecycle import STOP_SIGNALS, sigterm_deferred, stop_reason, stop_requested
from ...monitor.tally import EngineResult, RunTally, local_totals, run_folder_extra, run_totals
from ...compressors.messages import Sender, compressing, receive
from ...server.reduce import finite
from ...server.core import ServerCore
from ...server.summed import SharedSums
from ...server.worker import Worker
from .buckets import Buckets
from .collectives import Collectives, agent_restarts, launch_id, rank_env
from .shm_reduce import open_shm_reduce, uses_shm

EXAMPLES, ACTIVE, STOP, SIGNALLED = 0, 1, 2, 3  # SIGNALLED: a slot per stop signal
# the flags, then per rank: its losses' sum, its examples, its losses' count
LOSS = FLAGS = SIGNALLED + len(STOP_SIGNALS)


def flag_width(world: int) -> int:
    """The buffer's slots past the payload: the flags, then the ranks'
    loss sums, their examples, their loss counts (rank k writes its own,
    the others zeros there; the drain at the end carries a rank's last ones)."""
    return FLAGS + 3 * world


def _zero(a) -> None:
    if arrays.is_tensor(a):
        a.zero_()
    else:
        a.fill(0)


def reduced_device(problem, rule, comm):
    """The device a rank keeps its arrays on (see the module docstring), or
    None for host memory: where the problem computes, if the process group
    reduces tensors there and the rule runs on tensors."""
    device = problem.array_device()
    if device is None or not rule.device_arrays:
        return None
    reducible = device.type == "cpu" if comm.device is None else device == comm.device
    return device if reducible else None


class _Stop(Exception):
    """Rank 0 asked every rank to stop (the recorder's verdict)."""


class RankWorker(Worker):
    """This rank's interpreter of its program (the module docstring).

    A stop signal (SIGTERM, SIGINT) is rank 0's to act on (``stop``): under
    torchrun, its own (torchrun's agent hands the signal it gets to every
    rank), or one that reached another rank alone (a scheduler's SIGTERM to
    one process), which that rank hands to rank 0 in the next collective's
    flags (``signalled``: one slot per stop signal, each rank that got it
    adds 1; rank 0 then stops every rank one collective later, as on its
    own); under monsoon's own agent (``launch.py``), the one the agent
    writes to the job folder. Rank 0 then writes the final checkpoint where
    every rank stopped (sync: exact, also with ``checkpoint_every`` 0), and
    its result is marked ``interrupted``."""
    engine_name = "torch"

    def __init__(self, comm, problem, rule, strategy, w0, job, recorder, engine, start,
                 shm=None, stop=None):
        super().__init__(comm.rank, problem, strategy, None)  # the working copy: below
        self.comm = comm
        self.world = comm.world
        self.job = job
        self.recorder = recorder if comm.rank == 0 else None
        self.due = Due(recorder) if comm.rank == 0 else None  # rows and live updates, on rank 0
        self.engine = engine
        n = w0.size
        self.n = n
        self.server = np.array(w0, copy=True)
        self.state = rule.init(n, w0.dtype) if start.state is None else start.state
        self.work = self.server if strategy.shared_params else np.array(w0, copy=True)
        self.buf = np.zeros(n + flag_width(self.world), dtype=w0.dtype)
        # this rank's mini-batch losses since it last wrote its flags: their sum, their count
        self.loss_sum, self.loss_n = 0.0, 0
        self.read_loss = 0.0  # the bucket path, host flags: this step's loss (``_own_loss``)
        self.own = LOSS + self.world + self.rank  # this rank's examples slot
        self.examples_sent = 0  # this rank's examples its collectives have carried
        self.rank_examples = np.zeros(self.world)  # rank 0: every rank's, as they carried them
        # rank 0: every rank's losses (``add_loss``'s cells), once a collective carried them
        self.rank_losses = None
        self.grad, self.flags = self.buf[:n], self.buf[n:]
        self.whole = comm.tensor(self.buf)
        self.xp = np  # the arrays' functions (``arrays.namespace``)
        self.dflags = None  # the flags in a device buffer (``to_device``)
        self.step = start.step  # collectives done (sync: steps) since the run began
        self.updates = self.updates_before = start.updates
        self.dropped = start.dropped  # collective steps not applied (every rank's count)
        self.local = [0, 0]  # this rank's own local steps (LocalApply), applied and dropped
        self.examples = 0  # this rank's, this attempt
        self.examples_before = start.examples
        self.carried = start.totals  # the counts of the run this one resumed (tally.py)
        self.time_before = start.time_s
        self.want_stop = False
        self.stopped = None
        # rank 0's source of a stop signal: this process's (torchrun), or the agent's
        self.stop = stop_requested if stop is None else stop
        self.interrupted = None  # the stop signal that ended the run, on rank 0
        # sync's contributions are n_k / B g_k (B: the batch size), so a full
        # batch's sum is already the mean, as DDP's grad / world is
        self.unit = float(job.batch_size)
        self.exact = bool(engine.checkpoint_dir) and checkpoints.exact_checkpoints(strategy)
        self.every = engine.checkpoint_every if self.exact else 0
        self.keeper = checkpoints.Checkpointer(engine.checkpoint_dir, self.every, None,
                                               engine.identity, self.recorder)
        self.sender = Sender(engine.compression, self.rank)
        if start.senders:  # this rank's compressor state at the checkpoint resumed
            self.sender.restore(start.senders[self.rank])
        if start.buffers:  # and its model's buffers
            checkpoints.load_buffers(problem, start.buffers[self.rank])
        self.compressed = self.sender.compression.active
        # every rank's sender state and buffers go into each checkpoint (``gather_ranks``)
        self.senders = self.exact and self.sender.compression.stateful
        self.buffers = self.exact and any(k.startswith("buffer.") for k in engine.held_shapes)
        if self.compressed:
            self.wire = self.sender.compression.wire_nbytes(n, w0.dtype)
            self.gathered = np.zeros(self.wire + self.flags.nbytes, dtype=np.uint8)
        self.buckets = None
        self.shm = shm
        if shm is None and not self.compressed:
            device = reduced_device(problem, rule, comm)
            if device is not None:
                self.to_device(device)
        if shm is None and not self.compressed and strategy.raw_gradients \
                and problem.backward is not None \
                and engine.bucket_mb > 0:
            self.buckets = Buckets(problem, self.buf, flag_width(self.world), comm,
                                   int(engine.bucket_mb * 2**20))
        # the step's update (``server/core.py``), on the replica where it lives now
        self.core = ServerCore(self.server, rule, self.state)
        # Local AdaAlter: this rank's replica of the shared sums, on the host
        self.shared_sums = SharedSums.of(strategy.local_rule, n, w0.dtype) \
            if Average in strategy.uses else None
        if self.shared_sums is not None:
            self.shared_sums.start(self.local_rule, self.work)
        self.handlers.update({AllReduce: self.all_reduce, Average: self.average,
                              Fetch: self.fetch})
        self.t0 = time.perf_counter()

    def to_device(self, device) -> None:
        """Keep the replica, the working copy, the rule state (restored
        already) and the buffer as tensors on ``device``: the module computes
        on the replica itself, the gradient is scaled into the buffer (by the
        bucket hooks, or one multiply), the all-reduce and the rule run on
        the device. The flags are written and read in ``readback``, a host
        copy of the buffer's tail (pinned on a GPU): one small copy in, and
        one out after each collective, with the payload's sum (its
        finiteness check) in one slot past the reduced part; that copy is
        the step's one wait for the device. Snapshots, checkpoints and the
        result are host copies."""
        import torch

        width = flag_width(self.world)
        self.server = torch.from_numpy(self.server).to(device)
        self.work = self.server if self.strategy.shared_params else self.server.clone()
        self.state = type(self.state)(*(torch.from_numpy(a).to(device) for a in self.state))
        self.buf = torch.zeros(self.n + width + 1, dtype=self.server.dtype, device=device)
        self.grad, self.dflags = self.buf[:self.n], self.buf[self.n:self.n + width]
        self.whole = self.buf[:self.n + width]  # the last slot: the payload's sum
        self.readback = torch.zeros(width + 1, dtype=self.server.dtype,
                                    pin_memory=device.type == "cuda")
        self.tail = self.readback.numpy()
        self.flags = self.tail[:width]
        self.xp = torch

    def _landed(self) -> None:
        """Device arrays, after a collective: the summed flags and the
        payload's sum come to the host in one copy (the step's one wait)."""
        self.xp.sum(self.grad, dim=0, keepdim=True, out=self.buf[-1:])
        self.readback.copy_(self.buf[self.n:])

    def _finite(self, scale: float) -> bool:
        """The payload, scaled by ``scale``, is finite (device arrays: from
        the sum ``_landed`` read)."""
        if self.dflags is None:
            return finite(self.grad)
        return math.isfinite(float(self.tail[-1]) * scale)

    # -- the program -------------------------------------------------------
    def run(self) -> None:
        self.program = compressing(self.strategy.program(self.job), self.sender,
                                   arrays.nbytes(self.server),
                                   packed=True, fetch_bytes=0)  # a Fetch reads the rank's replica
        try:
            self.advance()
        except _Stop:  # the program is closed
            pass
        self._drain()

    def _drain(self) -> None:
        """Join the others' collectives with nothing until none is active."""
        while True:
            _zero(self.buf)
            self.flags[:] = 0
            self._own_figures()
            if self.dflags is not None:
                self.dflags.copy_(self.readback[:-1], non_blocking=True)
            if self.compressed:
                self._gather(None, "the end of the run", ACTIVE, drain=True)
            else:
                self._reduce("the end of the run")
            self._count_figures()
            if self.flags[ACTIVE] == 0:
                return

    def _gather(self, wire, what: str, weight: int, unit: float = 1.0,
                drain: bool = False) -> None:
        """A compressed collective: all-gather each rank's packed message
        (``wire``; None: nothing, weight 0) and flags; then the payload is
        sum_k (flags_k[weight] / unit) D_k, in rank order, and the flags
        are summed, as the all-reduce would have left them.

        A sum all-reduce cannot add top-k messages (their indices differ),
        packed codes or two ranks' PowerSGD factors. Every rank decodes the
        same bytes (``messages.receive``), so the replicas stay identical.
        The message is g_k (sync), the drift (local SGD) or D_k = C(alpha
        (x_k - x~) + e_k) (EASGD: x_k -= D_k, x~ += sum_k D_k), each with
        its rank's residual. PowerSGD all-gathers each rank's P and Q (the
        mean may have rank up to N R), not the paper's all-reduce of P,
        then Q. No buckets, no shared-memory reduce. A rank counts its own
        message as sent and the others' as received."""
        mine = self.gathered
        mine[:self.wire] = 0 if wire is None else wire
        mine[self.wire:] = self.flags.view(np.uint8)
        with self._collective(what, "all-gather"):
            rows = self.comm.all_gather(mine)
        dtype = self.server.dtype
        self.grad.fill(0)
        flags = np.zeros_like(self.flags)
        for row in rows:
            theirs = row[self.wire:].view(dtype)
            flags += theirs
            if theirs[weight]:
                self.grad += (theirs[weight] / unit) * receive(
                    self.sender.compression, row[:self.wire], self.n, dtype)
        self.flags[:] = flags
        if not drain:  # the others' messages came in (the wrapper counted n values)
            self.sender.received_bytes += (self.world - 1) * self.wire - self.server.nbytes

    def _reduce(self, what: str) -> None:
        with self._collective(what):
            if self.shm is not None:
                self.shm.all_reduce(self.buf)
            else:
                self.comm.all_reduce(self.whole)
                if self.dflags is not None:
                    self._landed()

    @contextlib.contextmanager
    def _collective(self, what: str, op: str = "all-reduce"):
        """A collective's gloo/NCCL error, said as what it means (``_failed``)."""
        began = time.perf_counter()
        try:
            yield
        except Interrupted:  # a second stop signal, raised inside the collective: as is
            raise
        except Exception as exc:  # noqa: BLE001
            self._failed(what, exc, op, time.perf_counter() - began)

    def _failed(self, what: str, exc, op: str = "all-reduce", waited: float = 0.0) -> None:
        """``waited``: the seconds the collective ran. Well within --timeout,
        the other side went (it exited, its connection closed); else it may
        also have stalled or been cut off past the timeout."""
        # not monitor.pool.fail_if_lost: a collective cannot go on without every rank
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        others = [r for r in range(self.world) if r != self.rank]
        who = (f"rank {others[0]}" if len(others) == 1 else
               "another rank (torchrun's report names one that died)")
        timeout = self.engine.timeout
        why = (f"{who} died or its connection closed" if waited < timeout / 2 else
               f"{who} died, stalled or was cut off for longer than --timeout {timeout:g} s")
        err = WorkerError(f"rank {self.rank}: the {op} of {what} failed after {waited:.1f} s "
                          f"({msg}); {why}")
        err.worker = others[0] if len(others) == 1 else None
        err.after_peer = True  # a consequence of another rank's failure (child.rank_main)
        raise err from exc

    def _flags(self, examples: int) -> None:
        self.flags[EXAMPLES] = examples
        self.flags[ACTIVE] = 1
        self.flags[STOP] = 1 if self.want_stop else 0
        self.flags[SIGNALLED:] = 0
        own = stop_requested() if self.rank else None  # this process's own, for rank 0
        if own:
            self.flags[SIGNALLED + STOP_SIGNALS.index(own)] = 1
        self._own_figures()
        if self.dflags is not None:  # ordered before the collective on the device's stream
            self.dflags.copy_(self.readback[:-1], non_blocking=True)

    # -- ops (LocalApply: ``server/worker.py``) ---------------------------------
    def gradient(self, op):
        if self.buckets is None:
            return super().gradient(op)
        if op.next is not None and self.problem.prefetch is not None:
            self.problem.prefetch(op.next)
        # this step's examples and loss ride in its own flags (the first
        # bucket): the examples now, the loss once forward has computed it
        self.examples += len(op.indices)
        self.loss_n += 1
        self._flags(len(op.indices))
        loss = self.buckets.gradient(self.work, op.indices,
                                     len(op.indices) * op.weight / self.unit, self._own_loss)
        return (self.read_loss if self.dflags is None else float(loss)), self.grad

    def _own_loss(self, loss) -> None:
        """The bucket path: this step's loss (a tensor, after forward, before
        backward starts any bucket) into this rank's loss slot; device flags
        take it on the device (no read: the step's one read is after
        backward), host flags as a float, read once (``read_loss``)."""
        if self.dflags is None:
            self.read_loss = float(loss)
            self.flags[LOSS + self.rank] += self.read_loss
        else:
            self.dflags[LOSS + self.rank].add_(loss)

    def _own_figures(self) -> None:
        """This rank's slots of the flags: its losses since it last wrote
        them (their sum and count: sent now) and its examples not sent yet."""
        self.flags[LOSS + self.rank] = self.loss_sum
        self.flags[self.own] = self.examples - self.examples_sent
        self.flags[self.own + self.world] = self.loss_n
        self.loss_sum, self.loss_n = 0.0, 0

    def count_gradient(self, examples, loss):
        self.examples += examples
        self.loss_sum += float(loss)  # travels with the next flags (a NaN, an Inf: as they are)
        self.loss_n += 1

    def all_reduce(self, op):
        if self.compressed:
            self._flags(op.examples if op.grad is not None else 0)
            self._gather(op.grad, f"step {self.step}", EXAMPLES, self.unit)
        elif self.buckets is not None:
            if op.grad is None:
                self._flags(0)
                self.buckets.begin(0)
            with self._collective(f"step {self.step}"):
                self.buckets.finish()
                if self.dflags is not None:
                    self._landed()
        elif self.shm is not None:  # the contribution goes straight into its slot
            slot = self.shm.contribution()
            self._contribution(op, slot[:self.n])
            self._flags(op.examples)
            slot[self.n:] = self.flags
            with self._collective(f"step {self.step}"):
                self.shm.reduce(self.buf)
        else:
            self._contribution(op, self.grad)
            self._flags(op.examples)
            self._reduce(f"step {self.step}")
        self._apply_mean(self.unit)
        return 0

    def _contribution(self, op, out) -> None:
        """Sync's contribution (n_k / B) g_k into ``out``, or zeros where the
        op has none (0 times a stale NaN would still be NaN)."""
        if op.grad is None:
            _zero(out)
        else:
            self.xp.multiply(op.grad, op.examples / self.unit, out=out)

    def average(self, op):
        then = None if self.shared_sums is None else (
            lambda applied: self._sync_sums(applied, op.examples))
        self._flags(op.examples)
        if self.compressed:
            self._gather(self.sender.pack(self.server - self.work), f"round {self.step}",
                         EXAMPLES)
        else:
            self.sender.dense(arrays.nbytes(self.server))  # the drift, into the all-reduce
            self.xp.subtract(self.server, self.work, out=self.grad)
            self.grad *= op.examples
            self._reduce(f"round {self.step}")
        self._apply_mean(1, then)
        self.restart(self.server, self.shared_sums)  # the copy and its sums, from the round's
        return 0

    def _sync_sums(self, applied: bool, examples: int) -> None:
        """Local AdaAlter (the module docstring): after a round applied on
        every rank (each sees the same flags), gather each rank's
        [a_k, n_k], add their weighted mean to the shared sums (this
        rank's inner rule starts the next round from them: ``restart``)."""
        sums = self.shared_sums
        if applied and int(self.flags[ACTIVE]) == self.world:
            n, fields = self.n, len(sums.sums)
            row = np.empty(fields * n + 1, dtype=sums.sums[0].dtype)
            sums.added(self.local_rule, self.work,
                       [row[i * n:(i + 1) * n] for i in range(fields)])
            row[-1] = examples
            with self._collective(f"the sums of round {self.step}", "all-gather"):
                rows = self.comm.all_gather(row)
            sums.count(self.sender)
            acc, tmp = np.empty(n, dtype=row.dtype), np.empty(n, dtype=row.dtype)
            sums.add_mean([rows[:, i * n:(i + 1) * n] for i in range(fields)],
                          list(range(self.world)), [int(e) for e in rows[:, -1]], acc, tmp)

    def _apply_mean(self, unit, then=None) -> None:
        """The buffer holds sum_k (n_k / unit) x_k: divide by sum_k n_k / unit
        (nothing to do when that is 1: sync's full batches). ``then(applied)``
        runs before the collective's bookkeeping (which may stop the rank)."""
        total = self.flags[EXAMPLES]
        if total > 0 and total != unit:
            self.grad *= unit / total
        applied = self.core.apply_sum(self.grad, self.step, self.rank,
                                      ok=bool(total > 0 and self._finite(unit / total)))
        if applied:
            self.updates += 1
        else:
            self.dropped += 1
        if then is not None:
            then(applied)
        self._after_collective()

    def send_elastic(self, op, sends: bool = True):
        """EASGD's exchange: every rank's d_k in one collective; nothing from
        a rank whose copy is not finite (``skip_elastic``), which restarts
        from the centre. The EXAMPLES flag counts the ranks that send (an
        update each; every other active rank's exchange is dropped)."""
        self._flags(int(sends))
        if self.compressed:  # this rank's packed D_k (None: nothing), x_k -= D_k
            wire = self.elastic_difference(self.server, op.alpha, packed=True)[0] if sends \
                else None
            self._gather(wire, f"exchange {self.step}", EXAMPLES)
        else:
            if sends:
                self.xp.subtract(self.work, self.server, out=self.grad)
                self.grad *= op.alpha
                self.work -= self.grad  # x_k -= d_k, before the buffer holds the sum
            else:
                _zero(self.grad)  # no d_k (``_gather`` fills the buffer itself)
            self._reduce(f"exchange {self.step}")
        self.server += self.grad  # x~ += sum_k d_k
        self.updates += int(self.flags[EXAMPLES])
        self.dropped += int(self.flags[ACTIVE] - self.flags[EXAMPLES])
        if not sends:
            self.fetch(op)
        self._after_collective()

    def skip_elastic(self, op):
        """This rank's copy is not finite (``server/elastic.py``): it joins
        the exchange with nothing."""
        self.send_elastic(op, False)

    def count_local(self, applied: bool):
        self.local[0 if applied else 1] += 1

    def own_local(self) -> tuple[int, int] | None:
        """This rank's local steps (applied, dropped), where the strategy
        takes any; else None."""
        return local_totals(self.strategy, *self.local)

    def fetch(self, op):
        self.work[:] = self.server
        return np.zeros(1, dtype=np.int64)

    # -- after every collective ---------------------------------------------
    def _count_figures(self) -> None:
        """After a collective: the examples it carried are sent (each rank's
        slot holds its own alone: the others wrote zeros there); rank 0 adds
        every rank's examples and losses to its totals."""
        self.examples_sent += int(self.flags[self.own])
        if self.due is None:
            return
        world = self.world
        self.rank_examples += self.flags[LOSS + world:LOSS + 2 * world]
        if self.rank_losses is None:
            self.rank_losses = np.zeros((world, LOSS_CELLS))
        for k, (total, n) in enumerate(zip(self.flags[LOSS:LOSS + world],
                                           self.flags[LOSS + 2 * world:LOSS + 3 * world])):
            if n > 0:
                add_loss(self.rank_losses[k], total, int(n))

    def _after_collective(self) -> None:
        self.step += 1
        self._count_figures()
        stop = self.flags[STOP] > 0
        if self.every and self.step % self.every == 0:
            held = self.gather_ranks()  # every rank takes part
            if self.rank == 0:
                self.save_checkpoint(held=held)
        if self.due is not None:
            now, examples = self._now()
            reason = self.due.look(  # every rank's loss came with the collective
                now, examples, lambda: (self.server, self.updates, self.dropped, self.own_local()),
                lambda: (examples, self.updates, self.dropped), self._losses)
            signum = None if reason is not None or self.want_stop else \
                self.stop() or self._signalled()
            if signum:  # SIGTERM/SIGINT: every rank stops after the next collective
                self.interrupted, reason = signum, stop_reason(signum)
            if reason is not None and not self.want_stop:
                self.want_stop, self.stopped = True, reason
        if stop:
            raise _Stop()

    def _now(self) -> tuple[float, int]:
        """Rank 0: the run's time and examples so far (a resumed run's
        included): every rank's examples as the collectives carried them,
        those of the updates its replica holds (shards may be uneven)."""
        return (self.time_before + time.perf_counter() - self.t0,
                self.examples_before + int(self.rank_examples.sum()))

    def _losses(self) -> tuple[dict, None]:
        """Every rank's losses and examples so far, as the collectives
        carried them (the live row: its mean loss since the last row), and
        its updates: every rank applies each collective's update to its
        replica, so each has the run's. None before the first collective."""
        seen = [] if self.rank_losses is None else self.rank_losses
        return {k: {"losses": cells, "examples": int(self.rank_examples[k]),
                    "updates": self.updates} for k, cells in enumerate(seen)}, None

    def last_live(self) -> None:
        """Rank 0: the run's last live row, once its program has ended."""
        if self.due is not None:
            now, examples = self._now()
            self.due.live(now, lambda: (examples, self.updates, self.dropped), self._losses,
                          final=True)

    def _signalled(self) -> int | None:
        """A stop signal another rank handed on with this collective's flags."""
        return next((sig for i, sig in enumerate(STOP_SIGNALS)
                     if self.flags[SIGNALLED + i] > 0), None)

    def counted(self) -> dict:
        """What rank 0 counts for every rank, as a report: this attempt's
        staleness, 0 for each update (every step reads the parameters of
        the step before it); {} on the other ranks."""
        return {"staleness": {0: self.updates - self.updates_before}} if self.rank == 0 else {}

    def gather_ranks(self) -> tuple[dict, dict] | None:
        """At a checkpoint step: every rank's traffic (``Sender.stats``) and,
        where the checkpoints hold them, its sender state (``self.senders``)
        and model buffers (``self.buffers``) now, gathered on rank 0 in one
        collective that every rank takes part in, as a checkpoint's
        ``sender.<name>`` and ``buffer.<name>`` arrays (ranks first; {}
        where none are held) and {rank: traffic}; None on the other ranks.
        A stop rides in a step's collective and that step is applied
        (``_after_collective``), so no rank has encoded a message of a step
        that was not: the state is the one at this step boundary (no
        ``before_last``)."""
        state = self.sender.state(self.n, self.server.dtype) if self.senders else None
        buffers = self.problem.state() if self.buffers else None
        with self._collective(f"the checkpoint of step {self.step}", "gather"):
            rows = self.comm.gather_object((state, buffers, self.sender.stats()))
        if rows is None:
            return None
        return (self.held_arrays([row[0] for row in rows], [row[1] for row in rows]),
                {rank: traffic for rank, (_, _, traffic) in enumerate(rows)})

    def held_arrays(self, states: list, buffers: list) -> dict:
        """Every rank's sender ``states`` and model ``buffers`` (in rank
        order) as a checkpoint's arrays, those it holds (``gather_ranks``)."""
        held = checkpoints.worker_arrays(states, "sender.") if self.senders else {}
        if self.buffers:
            held.update(checkpoints.worker_arrays([checkpoints.held_buffers(b) for b in buffers]))
        return held

    def save_checkpoint(self, reason: str = "periodic", totals: dict | None = None,
                        held: tuple[dict, dict] | None = None) -> None:
        """``totals``: the run's counts (``RunTally.totals``; None: those
        known at this step: ``counted``, the carried ones and, where
        ``held`` has it, every rank's traffic); ``held``: what
        ``gather_ranks`` returned at this step (None: nothing gathered)."""
        now, examples = self._now()
        arrays, traffic = held or ({}, {})
        if totals is None:
            reports = {rank: {"traffic": figures} for rank, figures in traffic.items()}
            reports[0] = {**reports.get(0, {}), **self.counted()}
            totals = run_totals(self.carried, reports)
        self.keeper.save(self.step, now, self.server, self.state,
                         counts(reason, examples, self.dropped, step=self.step,
                                updates=self.updates, exact=True, totals=totals,
                                launch=launch_id()), arrays)


def _resume_point(engine, comm, rule, strategy, w0, recorder) -> checkpoints.Start:
    """Rank 0 reads the checkpoint to start from (``--resume``; after a
    restart the run folder's own where rank 0 sees one, also after a
    ``--resume`` of another folder: a rank on another node without the
    folder follows it), hands its rows to the recorder, and
    broadcasts it (its parameters, rule state and, where held, every rank's
    sender state and model buffers, of which each rank restores its own;
    not the file's arrays). It must hold the arrays the engine's
    checkpoints of this run hold (``TorchEngine.held_shapes``): one
    that does not (an older monsoon's) is passed over, named on stderr, for
    the newest that does (``checkpoints.load_latest``); ``--resume`` of a
    folder with none is refused before any rank starts (``check_resume``)."""
    directory = engine.resume_dir
    if comm.attempt > 0 and engine.checkpoint_dir:
        # this launch's own checkpoints, newer than --resume's; rank 0's
        # folder decides for every rank: another node may not see it
        held = bool(checkpoints.checkpoint_files(engine.checkpoint_dir)) if comm.rank == 0 \
            else None
        if comm.broadcast_object(held):
            directory = engine.checkpoint_dir
    if directory is None:
        return checkpoints.Start.fresh(w0, comm.world)
    if not checkpoints.exact_checkpoints(strategy):
        raise ConfigError(f"the torch engine resumes runs whose ranks share the parameters at "
                          f"every step (sync), not {strategy.name}; use --engine local or ray "
                          "to resume it")
    found = None
    if comm.rank == 0:
        try:
            keeper = checkpoints.Checkpointer(None, 0, directory, engine.identity, recorder)
            found = keeper.start(w0, rule, comm.world, engine.held_shapes, needs=("step",))
            found.buffers = checkpoints.worker_rows(found.saved.arrays, "buffer.", comm.world)
            found.saved.arrays = {}  # sent as its params and state
        except ConfigError as exc:
            found = str(exc)
    found = comm.broadcast_object(found)
    if isinstance(found, str):
        raise ConfigError(found)
    return found


def run_rank(engine, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder,
             stop=None, launched_at=None):
    """This process's part of the run; rank 0 returns the run's EngineResult,
    the others one marked ``follower``. ``stop``: rank 0's source of a stop
    signal (``RankWorker``; default this process's own). ``launched_at``:
    when monsoon's launcher started (``launch.launch``, time.time()): its
    agent's start, rendezvous and forks count in the first attempt's
    startup, as the other engines count their workers' start."""
    import torch  # noqa: F401 - before the rank's own clock: it counts joining, not this

    t_begin = time.perf_counter()
    if launched_at is not None and agent_restarts() == 0:
        t_begin -= max(0.0, time.time() - launched_at)
    problem = problem.for_worker(rank_env()["rank"], workers)  # the instance a worker uses
    env, comm = _join(engine, problem, workers)
    worker = shm = None
    try:
        start = _resume_point(engine, comm, rule, strategy, w0, recorder)
        w = start.params
        comm.broadcast_array(w)  # every rank starts from rank 0's parameters, as DDP does
        rank = comm.rank
        job = WorkerJob(rank, workers, problem.n_examples, batch_size, seed, budget,
                        start_step=start.step if checkpoints.exact_checkpoints(strategy) else 0)
        seed_worker(problem, seed, rank, strategy.gradients_before(job))
        compressed = engine.compression.active
        if not compressed and uses_shm(engine.reduce_via, comm.backend, env):
            shm = open_shm_reduce(comm, w.size + flag_width(comm.world), w.dtype, engine.timeout,
                                  required=engine.reduce_via == "shm")
        worker = RankWorker(comm, problem, rule, strategy, w, job, recorder, engine, start, shm,
                            stop)
        if rank == 0:
            recorder.start(worker.server)
        startup = time.perf_counter() - t_begin
        worker.t0 = t0 = time.perf_counter()
        worker.run()
        wall = time.perf_counter() - t0
        worker.last_live()
        tally = _finish(worker, comm)
    finally:
        if shm is not None:
            shm.close()
        comm.close()
    if rank != 0:
        return EngineResult(arrays.to_host(worker.server), startup, wall, worker.examples,
                            worker.updates, worker.dropped, Counter(), follower=True)
    return _run_result(engine, comm, worker, start, tally, startup, wall, shm is not None)


def _join(engine, problem, workers):
    """Joins torchrun's process group: checks its world size against
    ``--workers``, shares the node's cores among its ranks (unless
    OMP_NUM_THREADS is set) and places the problem on the rank's device.
    Returns the rank's environment and its ``Collectives``."""
    import os

    import torch

    from ...devices import rank_device
    from ...monitor.lifecycle import set_death_signal
    from ...monitor.processes import limit_threads, torch_threads_per_worker

    env = rank_env()
    set_death_signal()  # torchrun starts ranks in sessions of their own: die with the agent
    if env["world_size"] != workers:
        raise ConfigError(f"--workers {workers}, but torchrun started {env['world_size']} "
                          f"ranks (WORLD_SIZE); pass --workers {env['world_size']}")
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(torch_threads_per_worker(env["local_world_size"]))
    if problem.uses_torch:  # one BLAS thread beside torch's (limit_threads)
        limit_threads(torch.get_num_threads(), torch_problem=True)
    comm = Collectives(engine.dist_backend, engine.timeout, env)
    device = rank_device(problem, env["local_rank"], comm.device)
    if device is not None:  # --device cuda: the model computes on the rank's GPU
        problem.use_devices([device])
    return env, comm


def _finish(worker, comm) -> RunTally | None:
    """After the program: rank 0 first writes the checkpoint where every
    rank stopped, with the counts known at its step (``_final_checkpoint``;
    every rank's traffic taken as its own, the same in a sync step),
    before anything else can fail: a rank lost meanwhile or in the gather
    that follows is named (``RankWorker._failed``), and the agent's SIGTERM
    to rank 0 waits for the write (``sigterm_deferred``), so the run resumes
    from there. Then every rank's figures, own parameters, problem state and
    traffic are gathered on rank 0 and added to the resumed run's counts
    (the tally, returned there; None on the other ranks), and rank 0 writes
    that checkpoint again, holding them (a second write where the step was
    not a periodic one's), also under ``sigterm_deferred``. Where the
    checkpoints hold every rank's sender state or buffers (``gather_ranks``),
    the buffers come with the reports, the sender states too where that
    write is made (``_writes_final``), and the first write is not made:
    without them it could not resume exactly, so a rank lost before the
    gather leaves the newest periodic checkpoint."""
    if comm.rank == 0 and not (worker.senders or worker.buffers):
        # every rank's traffic as rank 0's: a sync step sends and receives
        # the same bytes on every rank
        traffic = dict.fromkeys(range(comm.world), worker.sender.stats())
        with sigterm_deferred():  # the agent's SIGTERM, once another rank is lost
            _final_checkpoint(worker, None, ({}, traffic))
    report = worker.report(examples=worker.examples, local=worker.local[0],
                           local_dropped=worker.local[1], **worker.counted())
    states = worker.senders and _writes_final(worker, comm)
    state = worker.sender.state(worker.n, worker.server.dtype) if states else None
    with worker._collective("the end-of-run reports", "gather"):
        gathered = comm.gather_object((report, state))
    tally = None
    if comm.rank == 0:
        tally = RunTally.resumed(comm.world, worker.engine.compression, worker.carried,
                                 {rank: report for rank, (report, _) in enumerate(gathered)})
        held = (worker.held_arrays([s for _, s in gathered], [r["state"] for r, _ in gathered]),
                {}) if states or not worker.senders else None
        with sigterm_deferred():
            _final_checkpoint(worker, tally.totals(), held)
    if worker.buckets is not None:
        worker.buckets.remove()
    with worker._collective("the end of the run", "barrier"):  # a rank lost here: named too
        comm.dist.barrier()
    return tally


def _writes_final(worker, comm) -> bool:
    """Whether rank 0 writes the checkpoint after the end-of-run gather
    (``_final_checkpoint``, sync), on every rank: always where the run
    writes periodic ones; else where it was interrupted, which rank 0 alone
    knows and broadcasts (a stop signal may come with the last step)."""
    if worker.every:
        return True
    with worker._collective("the end of the run", "broadcast"):
        return bool(comm.broadcast_object(bool(worker.interrupted)))


def _final_checkpoint(worker, totals: dict | None, held=None) -> None:
    """Rank 0's checkpoint where every rank stopped (``_finish``): an
    interrupted run's (sync: exact, also with no periodic ones), else a run's
    that writes periodic ones. ``totals`` None: before the gather, the
    counts known at the step (``save_checkpoint``; reason "periodic" or
    "interrupted"), not written where a periodic one holds the step (it
    holds the same); else the whole run's (reason "final", as Ray's, or
    "interrupted"), written also where a periodic one holds the step (it
    replaces that one); ``held``: every rank's sender and buffer arrays, as
    ``RankWorker.save_checkpoint`` takes them."""
    if (worker.interrupted and worker.exact) or (
            worker.every and (totals is not None or worker.step % worker.every)):
        worker.save_checkpoint("interrupted" if worker.interrupted
                               else "final" if totals is not None else "periodic", totals,
                               held)


def _run_result(engine, comm, worker, start, tally, startup, wall, shm_used) -> EngineResult:
    """Rank 0's result of the run: its replica, the ranks' gathered reports
    added to the resumed run's (``tally``), and how the ranks communicated."""
    extra = {"world_size": comm.world, "dist_backend": comm.backend,
             "reduce_via": "shm" if shm_used else comm.backend,
             # every attempt after the first, and the agent's count of them
             # (what --max-restarts bounds; a membership change is not counted)
             "restarts": comm.attempt, "agent_restarts": agent_restarts(),
             "bucket_count": worker.buckets.count
             if worker.buckets is not None else None,
             **tally.extra(worker.updates),
             **run_folder_extra(worker.keeper.last_path, start.path)}
    if start.path:
        extra["resumed_at_step"] = start.step
    # dropped: the collective steps (every rank's count, rank 0's taken); the
    # local steps: each rank's own (its report); the staleness: rank 0's count
    # (``RankWorker.counted``), on the resumed run's
    return tally.result(arrays.to_host(worker.server), startup, start.time_s + wall,
                        start.examples + tally.examples, worker.updates, worker.dropped,
                        extra, local=tally.local_totals(worker.strategy),
                        stopped=worker.stopped, interrupted=worker.interrupted)

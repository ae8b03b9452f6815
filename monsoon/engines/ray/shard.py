"""A parameter-server shard for the Ray engine (run as a threaded Ray actor).

It holds its slice of the parameters and its rule state, updated in place
as NumPy arrays, and serves:

- ``read(worker)``: the slice and its version (Downpour's fetch; the rule's
  ``on_read`` runs here, so delay-aware state never travels to workers);
- ``push(worker, grad, read_version, dropped, examples)``: the rule applied, its
  examples counted (``snapshot``); both first tell the rule of unheard drops (``told``);
- ``contribute(step, worker, grad, examples, gen, whole_finite)``: a
  synchronous step. The first ``counted`` contributions of a step count, and
  the last of them sums them and applies the rule (``collective.apply_mean``,
  rank order, as every engine does). A step is dropped on every shard when any
  counted worker's whole contribution was not finite (``whole_finite``, the
  worker's own check), so a NaN in one slice never leaves the other slices
  stepped. With backup workers on several shards, shard 0 alone decides
  which arrivals count (``decide``); the others hold every part (``offer``)
  until told whom it counted (``settle``; ``sync_step.py``). A sum that
  overflows in one slice only (finite inputs) is still decided by that
  shard alone. Every caller blocks (with a timeout) until the step is
  applied and gets the new slice; a late caller is told how many it missed;
- ``regroup(gen, members)``: elastic sync: the step's workers changed; the
  step's contributions so far are dropped, and its callers and any caller
  of an older generation are answered ``("regroup", gen, members)``;
- ``elastic(worker, alpha, x)``: EASGD's exchange with the centre
  (``difference(d)``: compressed, the centre += the decoded D).

Local AdaAlter (``sums``): the shard also holds its slice of the shared
sums S; an Average's part is ``(drift, a_k's slice)``, and each caller gets
``(slice, S's slice)`` back (``server/summed.py``).

Compressed runs: a message arrives packed (``messages.Sender.pack``, put
once in Ray's object store); the shard decodes it and takes its slice.

Checkpoints: every ``every`` versions (updates of this shard) the shard
takes a copy of its slice, rule state and dropped count, inside its lock,
so a sync copy is the state after exactly that many steps. ``taken()``
hands the copies to the driver, which writes one checkpoint (the whole
parameters) once every shard has handed in the same version
(``engine.py``). At most ``TAKEN`` copies wait; older ones are dropped.
"""
from __future__ import annotations

import threading

import numpy as np

from ...compressors.messages import receive
from ...server.collective import apply_mean
from ...server.core import ServerCore, new_readers
from ...server.summed import SharedSums

TAKEN = 4  # copies a shard keeps until the driver collects them


class StepReply(tuple):
    """A synchronous step's reply, the tuple ``contribute``, ``decide`` and
    ``settle`` document, with ``stop``: the worker ends its program after
    this step; and ``applied``: the step was applied (not dropped) and this
    worker is the lowest rank it counted. That worker counts the step's
    update in its live figures, so that theirs sum to the steps applied and
    the same worker is credited whatever order the parts came in, as the
    local engine's first worker counts each.

    A stop (SIGTERM/SIGINT: ``Shard.stop`` from the driver): the first step
    a shard completes after it is the run's last there; its replies to that
    step, and to any later one, say so. A worker ends once any shard says
    so, after it has every shard's reply to the step, and sends no part of
    the next, so every worker ends after the same step on every shard. The
    step a shard names is fixed when it completes it, so every worker reads
    the same answer for a step."""

    def __new__(cls, items, stop: bool = False, applied: bool = False):
        reply = super().__new__(cls, items)
        reply.stop, reply.applied = stop, applied
        return reply

    def __reduce__(self):
        return StepReply, (tuple(self), self.stop, self.applied)

    def less_ranks(self) -> "StepReply":
        """``decide``'s reply without the workers counted: ``contribute``'s."""
        return StepReply(self[:3], self.stop, self.applied)


class Shard:
    def __init__(self, index: int, params: np.ndarray, rule, workers: int, counted: int,
                 timeout: float, every: int = 0, resume: dict | None = None,
                 compression=None, span: tuple = (0, None, None), elastic: bool = False,
                 sums: list | None = None):
        self.index = index
        self.compression = compression  # messages.Compression, or None: dense slices
        self.start, self.end, self.size = span  # this slice of the whole vector
        params = np.array(params, copy=True)
        # the update (``server/core.py``); its version counts the updates of this
        # slice (a synchronous step's, dropped or not, is one)
        self.core = ServerCore(params, rule,
                               readers=new_readers(rule, workers, params.size, params.dtype))
        self.params, self.state = params, self.core.state
        self.counted = counted
        self.timeout = timeout
        self.every = every
        self.taken_copies: dict[int, tuple] = {}
        self.lock = threading.Condition()
        self.step = 0
        # the step's parts: the counted ones (``contribute``), or every one
        # offered (``offer``: shard 1 and on, with backup workers)
        self.arrivals: dict[int, tuple[np.ndarray, int, bool]] = {}
        self.counted_ranks = (-1, ())  # (the last step applied, the workers it counted)
        self.gen = 0  # elastic: the membership generation (``regroup``)
        self.members = tuple(range(workers))
        self.regroups = elastic  # elastic sync: keeps the slice before each step
        self.before = None  # elastic: the slice before the last step, for a joining worker
        # Local AdaAlter's shared sums on this slice (``server/summed.py``), or None
        self.sums = None if sums is None else SharedSums([np.array(a, copy=True) for a in sums])
        self.told_drops: dict[int, int] = {}  # rank -> its drops the rule was told of
        self.examples = 0  # of the pushes applied here in this run (``snapshot``)
        # the ranks whose last count the driver told (``told``); elastic sync,
        # whose lost ranks come back, drops no push at a worker
        self.told_last: set[int] = set()
        # rank -> the step applied that it counts in its live updates (``StepReply``)
        self.credited: dict[int, int] = {}
        self.stopping = False  # the driver asked the run to stop (``stop``)
        self.last_step = None  # then: the step reached when the first step completed after it
        if resume is not None:  # {"version": V, "state": the rule state's slice}
            for arr, saved in zip(self.state, resume["state"]):
                arr[...] = saved
            self.core.version = self.step = int(resume["version"])

    # -- asynchronous ----------------------------------------------------------
    def read(self, worker: int, dropped: int = 0):
        with self.lock:
            self._tell(worker, dropped)
            return self.params.copy(), self.core.read(worker)

    def told(self, worker: int, dropped: int, last: bool = False) -> int:
        """The rule told of the pushes ``worker`` dropped (``dropped``: all
        it dropped so far) that it has not heard of: by the worker at its
        end, or by the driver for a worker that ended without (lost, or
        killed where the run stopped), ``last``: the driver's, after which a
        call of the worker's tells none (the worker may still run until
        killed); the driver's own are heard (``RayEngine._told_drops`` tells
        each shard the most any heard). Returns all it was told of."""
        with self.lock:
            self._tell(worker, dropped, last)
            if last:
                self.told_last.add(worker)
            return self.told_drops.get(worker, 0)

    def _tell(self, worker: int, dropped: int, driver: bool = False) -> None:
        # ``dropped`` counts all the worker's drops: a call that comes late, or
        # the driver's for a worker that ended without, tells none twice
        new = dropped - self.told_drops.get(worker, 0)
        if new > 0 and (driver or worker not in self.told_last):
            self.core.tell_dropped(new)
            self.told_drops[worker] = dropped

    def _take(self, message):
        """This shard's slice of a message (already a slice when uncompressed)."""
        if self.compression is None or not self.compression.active:
            return message
        return receive(self.compression, message, self.size, self.params.dtype)[
            self.start:self.end]

    def push(self, worker: int, grad: np.ndarray, read_version: int, dropped: int = 0,
             examples: int = 0) -> int:
        grad = self._take(grad)
        with self.lock:  # the worker dropped a non-finite gradient before sending it
            self._tell(worker, dropped)
            staleness = self.core.push(worker, grad, read_version, checked=True)
            self.examples += examples
            self._taken()
            return staleness

    def elastic(self, worker: int, alpha: float, x: np.ndarray) -> tuple[np.ndarray, int]:
        """EASGD's exchange: the worker's move and the version it landed at
        (before it: the worker counts its staleness, ``server/elastic.py``)."""
        with self.lock:
            version = self.core.version
            diff = self.core.elastic(x, alpha)
            self._taken()
            return diff, version

    def difference(self, message) -> int:
        """A compressed exchange's difference, added; the version it landed at."""
        d = self._take(message)
        with self.lock:
            version = self.core.version
            self.core.add(d)
            self._taken()
            return version

    # -- synchronous -----------------------------------------------------------
    def contribute(self, step: int, worker: int, grad, examples: int, gen: int = 0,
                   whole_finite: bool = True):
        """Returns (new slice, steps missed, counted?), or ("regroup", gen,
        members) when the step's workers changed (elastic)."""
        reply = self.decide(step, worker, grad, examples, gen, whole_finite)
        return reply[:3] if isinstance(reply[0], str) else reply.less_ranks()

    def decide(self, step: int, worker: int, grad, examples: int, gen: int = 0,
               whole_finite: bool = True):
        """``contribute``, whose reply adds the workers counted at ``step``
        for ``settle`` on the other shards (shard 0 of several, with backup
        workers), or None once this shard has applied a later step too (then
        every shard has applied ``step``: the later one began after that)."""
        part = self._part(grad, examples, whole_finite)
        with self.lock:
            if gen > self.gen:  # the driver's regroup is on its way here
                if not self.lock.wait_for(lambda: self.gen >= gen, self.timeout):
                    raise TimeoutError(f"shard {self.index} waited {self.timeout:g} s for "
                                       f"membership generation {gen}")
            if step >= self.step and gen != self.gen:
                return "regroup", self.gen, self.members
            if step < self.step or len(self.arrivals) >= self.counted:
                self._wait_applied(step)
                return self._reply(step, (self._slice(), self.step - (step + 1), False,
                                          self._counted_at(step)))
            self.arrivals[worker] = part
            if len(self.arrivals) == self.counted:
                self._complete()
            else:
                ok = self.lock.wait_for(lambda: self.step > step or self.gen != gen,
                                        self.timeout)
                if self.step <= step and self.gen != gen:
                    return "regroup", self.gen, self.members
                if not ok:
                    raise TimeoutError(f"shard {self.index} waited {self.timeout:g} s for "
                                       f"{self.counted} workers at step {step} (got "
                                       f"{len(self.arrivals)}); a worker is stuck or dead")
            return self._reply(step, (self._slice(), 0, True, self._counted_at(step)),
                               self.credited.pop(worker, None) == step)

    def offer(self, step: int, worker: int, grad, examples: int, whole_finite: bool = True):
        """A shard other than 0 of several, with backup workers: holds the
        worker's part of ``step`` until ``settle`` names the workers shard 0
        counted. A part for a step this shard has not reached yet (its
        worker skipped ahead) waits for it; one for a step applied is dropped."""
        part = self._part(grad, examples, whole_finite)
        with self.lock:
            if not self.lock.wait_for(lambda: self.step >= step, self.timeout):
                raise TimeoutError(f"shard {self.index} waited {self.timeout:g} s to reach "
                                   f"step {step} (at {self.step})")
            if step == self.step:
                self.arrivals[worker] = part

    def settle(self, step: int, worker: int, counted, behind: int = 0):
        """Applies ``step`` on the parts of ``counted``, the workers shard 0
        counted (``decide``), unless applied here already; returns what
        ``contribute`` does. Every worker of the step settles, a late one
        too, so the step is applied whichever of them is lost. A late worker
        that missed ``behind`` steps more on shard 0 waits for them here
        too, so that its next gradient is taken at one step's parameters."""
        with self.lock:
            if step == self.step and counted is not None:
                missing = sorted(set(counted) - set(self.arrivals))
                if missing:
                    raise RuntimeError(f"shard {self.index} holds no part of worker(s) "
                                       f"{missing} at step {step}, which shard 0 counted")
                self._complete(counted)
            self._wait_applied(step + behind)
            return self._reply(step, (self._slice(), self.step - (step + 1),
                                      worker in (counted or ())))

    def _part(self, grad, examples: int, whole_finite: bool) -> tuple:
        """A worker's part of a step, as the shard keeps it (None: no
        examples; a tuple: an Average's drift and its a_k's slice)."""
        added = None
        if isinstance(grad, tuple):
            grad, added = grad
        grad = np.zeros_like(self.params) if grad is None else self._take(grad)
        return grad, examples, whole_finite, added

    def _slice(self):
        """What a step's caller gets back: the slice, and S's slice where
        the shard holds the sums."""
        if self.sums is None:
            return self.params.copy()
        return self.params.copy(), [a.copy() for a in self.sums.sums]

    def _reply(self, step: int, items: tuple, applied: bool = False) -> StepReply:
        """The reply to a worker's part of ``step`` (``items``, whose second
        is the steps it missed), whether it stops there, and ``applied``
        (``StepReply``). ``last_step`` is set once, as a step completes, and
        only a later completion could set it after a reply's items were
        taken: then above the step reached, so read under the lock or not,
        the answer is the same."""
        reached = step + 1 + items[1]
        return StepReply(items, self.last_step is not None and reached >= self.last_step,
                         applied)

    def stop(self) -> int:
        """The driver asks the run to stop: the next step this shard
        completes is the last (``StepReply``). Returns its step now."""
        with self.lock:
            self.stopping = True
            return self.step

    def _wait_applied(self, step: int) -> None:
        if not self.lock.wait_for(lambda: self.step > step, self.timeout):
            raise TimeoutError(f"shard {self.index} waited {self.timeout:g} s for step "
                               f"{step} to complete")

    def _counted_at(self, step: int):
        """The workers counted at ``step`` when it is the last step applied, else None."""
        applied, ranks = self.counted_ranks
        return ranks if applied == step else None

    def _complete(self, ranks=None) -> None:
        """Applies the step on the parts of ``ranks`` (default: every part
        held); where applied (not dropped), the lowest of them is credited
        with it (``StepReply``)."""
        ranks = sorted(self.arrivals if ranks is None else ranks)
        examples = [self.arrivals[k][1] for k in ranks]
        grads = {k: self.arrivals[k][0] for k in ranks}
        if self.regroups:
            self.before = self.params.copy()
        sum_parts = None if self.sums is None else [  # each field's a_k slices
            {k: self.arrivals[k][3][i] for k in ranks} for i in range(len(self.sums.sums))]
        applied = apply_mean([self.core], grads, ranks, examples, [(0, self.params.size)],
                             np.empty_like(self.params), np.empty_like(self.params), self.step,
                             ok=all(self.arrivals[k][2] for k in ranks), sums=self.sums,
                             sum_parts=sum_parts)
        if applied:
            self.credited[ranks[0]] = self.step
        self.arrivals = {}
        self.counted_ranks = (self.step, tuple(ranks))
        self.core.version = self.step = self.step + 1
        if self.stopping and self.last_step is None:
            self.last_step = self.step
        self._taken()
        self.lock.notify_all()

    def regroup(self, gen: int, members: tuple) -> int:
        """Elastic sync: from now on the step's workers are ``members``;
        returns this shard's step."""
        with self.lock:
            self.gen, self.members, self.counted = gen, tuple(members), len(members)
            self.arrivals = {}
            self.lock.notify_all()
            return self.step

    def joining(self):
        """(slice, step, slice before that step): what a worker that joins
        needs to take part from the earliest step any shard is on."""
        with self.lock:
            return self.params.copy(), self.step, self.before

    # -- bookkeeping -----------------------------------------------------------
    def _taken(self):
        """Every ``every`` versions: a copy for the next checkpoint."""
        core = self.core
        if self.every and core.version % self.every == 0:
            params, state = core.copy()
            self.taken_copies[core.version] = (params, tuple(state), core.dropped)
            for old in sorted(self.taken_copies)[:-TAKEN]:
                del self.taken_copies[old]

    def taken(self) -> dict:
        """The copies taken since the last call: {version: (params, state, dropped)}."""
        with self.lock:
            out, self.taken_copies = self.taken_copies, {}
            return out

    def snapshot(self):
        """The slice, its version, the examples of the pushes applied here in
        this run and the dropped count, read together (a curve row's)."""
        with self.lock:
            return self.params.copy(), self.core.version, self.examples, self.core.dropped

    def whole(self):
        """The slice, its rule state, version and dropped count, at one instant."""
        with self.lock:
            params, state = self.core.copy()
            return params, tuple(state), self.core.version, self.core.dropped

"""Checkpoints of the ray engine: the driver writes them with the shared
``record/checkpoints.py`` ``Checkpointer`` (one ``ckpt-*.npz`` per
checkpoint in the run folder, the run's identity, atomic write with fsync,
retention, fallback to an older good file, one-line refusals).

Each shard takes a copy of its slice, rule state and dropped count every
``every`` versions, inside its lock (``shard.py``). The driver collects the
copies as it watches the run and, once every shard has handed in version V,
writes one checkpoint: the whole parameters and rule state, the counters
(the dropped updates as the rows and the result count them: the shards'
and the pushes the workers dropped themselves, ``dropped_so_far``), each
worker's position in its data plan, and the loss curve so far.

- sync: a shard's version V is its state after exactly V steps, so the
  checkpoint is exact: every worker resumes at step V and the run ends
  bit-identical to an uninterrupted one (the data order is a function of
  the seed and the step; see ``strategies/batches.py``).
- async: each shard's copy is taken after V pushes to it, and each worker's
  position comes from the examples it had done when the driver wrote (a
  racy read, as the local engine's snapshot checkpoints; a lost worker's,
  from its last figures, which may count a push or two it never landed):
  a resumed run carries on from there rather than replaying the run.
- strategies with private worker copies (local-sgd, easgd) write none and
  refuse ``--resume``.

When every worker has finished, a last checkpoint holds the final state;
when a stop signal ended the workers (``engine.py``: sync at one step on
every shard, the others between batches, their pushes in), it holds the
state they stopped at, written also with ``every`` 0 (``reason``
"interrupted"). Totals (updates, examples, dropped, time) and the loss
curve carry on, and the workers' own counts (``totals``, ``monitor/tally.py``
says which a periodic checkpoint holds).
"""
from __future__ import annotations

import numpy as np

from ...record import checkpoints
from ...record.checkpoints import Start, private_copies
from ...record.progress import counts, examples_after, positions_from_examples
from ...monitor.tally import run_totals, workers_dropped


def dropped_so_far(start: Start, parts, figures: dict) -> tuple[int, int]:
    """The updates dropped so far, with those of the run this one resumed
    (``start``): (the shards', all). A shard drops a synchronous step when
    any counted contribution was not finite (``Shard._complete``), so the
    shards agree and a step counts once (``parts``: one tuple a shard, its
    dropped count last). A push that was not finite never reached a shard:
    its worker dropped and counted it (``Worker.push``), and the workers'
    ``figures`` (by rank: their progress or their reports) add those, as
    the local engine's rows count its workers' drops. The curve's rows,
    the result and the checkpoints count them so."""
    shards = start.dropped + max(p[-1] for p in parts)
    return shards, shards + workers_dropped(figures)


class ShardCheckpoints:
    def __init__(self, keeper: checkpoints.Checkpointer, rule, strategy, bounds,
                 workers: int, n_examples: int, batch_size: int):
        self.keeper = keeper
        self.rule = rule
        self.exact = strategy.synchronous
        self.every = 0 if private_copies(strategy) else keeper.every
        # a run folder, and a state the checkpoint can hold: an interrupted run's
        # last one is written even with ``every`` 0
        self.keeps = bool(keeper.directory) and not private_copies(strategy)
        self.bounds = bounds
        self.workers = workers
        self.n = n_examples
        self.batch_size = batch_size
        self.pending: dict[int, dict[int, tuple]] = {}
        self.written = None   # the version of the last checkpoint written
        self.start = None

    def load(self, w0: np.ndarray) -> Start:
        """The checkpoint to start from (checked; its curve handed to the
        recorder), or the beginning."""
        self.start = self.keeper.start(w0, self.rule, self.workers, needs=("step",))
        # what a periodic checkpoint holds: the counts carried, not the running workers'
        self.carried = run_totals(self.start.totals, {})
        if self.start.saved is not None:
            self.written = self.start.step
        return self.start

    def shard_resume(self, s: int):
        """What shard ``s`` starts from (None: a fresh run)."""
        if self.start is None or self.start.saved is None:
            return None
        a, b = self.bounds[s]
        return {"version": self.start.step, "state": tuple(x[a:b] for x in self.start.state)}

    def collect(self, ray, shards, timeout: float, now: float, figures: dict,
                lost: dict | None = None) -> None:
        """Take the shards' copies; write each version all have handed in,
        oldest first. ``now``: the run's time, the resumed runs' included
        (the curve's clock). ``figures``: the workers' latest (by rank: their
        progress or their reports), whose examples place them and whose
        dropped pushes count (``dropped_so_far``); ``lost``: the lost
        workers' last ones, by rank, whose examples place them too."""
        if not self.every:
            return
        for s, copies in enumerate(ray.get([sh.taken.remote() for sh in shards],
                                           timeout=timeout)):
            for version, copy in copies.items():
                self.pending.setdefault(version, {})[s] = copy
        complete = sorted(v for v, parts in self.pending.items() if len(parts) == len(shards))
        for version in complete:
            parts = self.pending[version]
            self._write(version, [parts[s] for s in range(len(shards))], now, figures,
                        "periodic", self.carried, lost or {})
        if complete:  # an older version some shard has not handed in never will be
            self.pending = {v: p for v, p in self.pending.items() if v > complete[-1]}

    def final(self, ray, shards, timeout: float, now: float, figures: dict,
              reason: str = "final", totals: dict | None = None) -> None:
        """Every worker has finished: the state they ended at, unless already
        written with these ``totals``; or they stopped as asked (``reason`` "interrupted"): that
        state, said so, also where a periodic one holds it. ``figures``: the
        workers' reports (by rank); ``totals``: the run's counts, the
        workers' reports added (``RunTally.totals``)."""
        if not (self.every or reason == "interrupted" and self.keeps):
            return
        self.collect(ray, shards, timeout, now, figures)
        wholes = ray.get([sh.whole.remote() for sh in shards], timeout=timeout)
        versions = {v for _, _, v, _ in wholes}
        # the version written already holds the counts carried in: again, where
        # the workers' reports add to them (a run that ended on a periodic one)
        again = totals is not None and totals != self.carried
        if len(versions) == 1 and (versions != {self.written} or reason == "interrupted"
                                   or again):
            self._write(versions.pop(), [(p, st, d) for p, st, _, d in wholes], now,
                        figures, reason, totals)

    def _write(self, version: int, parts, now: float, figures: dict,
               reason: str, totals: dict | None, lost: dict | None = None) -> None:
        params = np.concatenate([p for p, _, _ in parts])
        state = self.rule.init(params.size, params.dtype)
        for (a, b), (_, piece, _) in zip(self.bounds, parts):
            for whole, arr in zip(state, piece):
                whole[a:b] = arr
        if self.exact:  # every worker walks the global plan, one batch a step
            positions = [version] * self.workers
            examples = examples_after(version, self.n, self.batch_size)
        else:  # batches before this attempt, and in it (a lost worker's: before it was lost)
            done = [int(figures.get(r, {}).get("examples", 0))
                    + int((lost or {}).get(r, {}).get("examples", 0)) for r in range(self.workers)]
            positions = positions_from_examples(done, self.n, self.batch_size,
                                                self.start.positions)
            examples = self.start.examples + sum(done)
        meta = counts(reason, examples, dropped_so_far(self.start, parts, figures)[1],
                      step=version, exact=self.exact, positions=positions, totals=totals)
        self.keeper.save(version, now, params, state, meta)
        self.written = version

"""Elastic sync's membership on the Ray engine (``sync --elastic``).

The driver keeps the list of workers that share each synchronous step and
its generation. When a worker is lost (its actor died: its node crashed or
was cut off), the driver drops it and regroups every shard: the step under
way is recomputed by the others on the same batch split among fewer
workers, so every step stays the full-batch mean gradient (Horovod
Elastic's model). A lost rank is started again, as a new actor, once the
cluster has room for it (its node came back, or another one joined); when
it is ready the driver regroups the shards with it and it takes part from
the earliest step a shard is on (``RemoteWorker.join``). The run fails
when every rank is out at once (``monitor.pool.fail_if_lost``).

Invariants: the shards see the same generations in the same order (the
driver is the only one to regroup, and waits for every shard each time);
a step is applied once, by each shard, on the contributions of one
generation; every change is recorded with the step it took effect at
(``events``, summary.json's ``membership``).
"""
from __future__ import annotations

import time

from ...monitor.pool import fail_if_lost
from .hosts import kill

RETRY_S = 1.0  # how often a lost rank's new actor is tried where the cluster had no room


class Membership:
    def __init__(self, ray, shards, strategy, workers: int, timeout: float,
                 start_timeout: float, spawn, cpus: float, gpus: float):
        self.ray, self.shards, self.timeout = ray, shards, timeout
        self.strategy, self.workers = strategy, workers
        self.start_timeout = start_timeout
        self.spawn, self.cpus, self.gpus = spawn, cpus, gpus
        self.members = list(range(workers))
        self.out: dict = {}           # rank -> why, for each rank not a member now
        self.gen = 0
        self.events: list[dict] = []
        self.lost: list[int] = []     # ranks waiting for room to start again
        self.joining: dict = {}       # rank -> (actor, its ready() ref, started at)
        self.next_try = 0.0

    def lose(self, rank: int, reason: str, actor=None) -> None:
        """A member's actor is gone: the others carry the step on. An actor
        whose run raised may still live (holding its CPU): it is killed, so
        its rank can start again where it was."""
        if actor is not None:
            kill(self.ray, actor)
        if rank not in self.members:
            return
        self.members.remove(rank)
        self.out[rank] = reason
        # elastic needs no rank in particular: it fails once no member is left to regroup
        fail_if_lost(self.out, self.strategy, self.workers, lost=rank)
        self._regroup("left", rank, reason)
        self.lost.append(rank)

    def _regroup(self, event: str, rank: int, reason: str | None = None) -> None:
        self.gen += 1
        steps = self.ray.get([sh.regroup.remote(self.gen, tuple(self.members))
                              for sh in self.shards], timeout=self.timeout)
        self.events.append({"event": event, "worker": rank, "step": int(min(steps)),
                            "members": list(self.members),
                            **({"reason": reason} if reason else {})})

    def rejoin(self, running: dict, actors: list, retired: list) -> None:
        """Once a poll: admit a restarted rank whose actor is ready (it joins
        the running step), and start one where the cluster has room."""
        ray = self.ray
        for rank, (actor, ref, since) in list(self.joining.items()):
            done, _ = ray.wait([ref], timeout=0)
            if not done and time.monotonic() - since < self.start_timeout:
                continue
            del self.joining[rank]
            try:
                ray.get(ref, timeout=0)
            except Exception:  # noqa: BLE001 - not started (yet): tried again later
                kill(ray, actor)  # not left pending: it would take the room a new try needs
                retired.append(actor)
                self.lost.append(rank)
                continue
            self.members = sorted(self.members + [rank])
            del self.out[rank]
            self._regroup("joined", rank)
            retired.append(actors[rank])
            actors[rank] = actor
            running[actor.join.remote(self.gen, tuple(self.members))] = rank
        now = time.monotonic()
        if not self.lost or now < self.next_try:
            return
        self.next_try = now + RETRY_S
        free = ray.available_resources()
        if free.get("CPU", 0) >= self.cpus and free.get("GPU", 0) >= self.gpus:
            rank = self.lost.pop(0)
            actor = self.spawn(rank, len(retired) + 1)
            self.joining[rank] = (actor, actor.ready.remote(), now)

    def close(self, retired: list) -> None:
        retired.extend(actor for actor, _, _ in self.joining.values())

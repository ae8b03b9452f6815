"""The Ray engine: the same strategies on a real cluster.

Parameter-server shards are threaded Ray actors holding their slice and
its rule state (``shard.py``); workers are Ray actors that load their data
once and run the strategy program, turning ops into calls on the shards
(``worker.py``). The driver (this process) watches them: it evaluates the
loss on the shards' parameters, counts progress, and names a worker actor
that dies in ``failed_workers``. async, local-sgd's and easgd's others carry
on; sync carries on while its backup workers cover the loss, and otherwise
fails fast with the worker's error. Every remote wait has a timeout.

``address=None`` starts a local Ray instance (and stops it after the run);
``"auto"`` or ``"HOST:PORT"`` joins a running cluster::

    ray start --head --port 6379                 # on the head node
    ray start --address HEAD_IP:6379             # on every other node
    monsoon train --engine ray --address auto ...   # on any node

Checkpoints: with ``checkpoint_every=K`` each shard writes its slice, rule
state and version atomically every K updates to ``checkpoint_dir``;
``resume_dir`` restarts from the newest version every shard has (a sync run
skips the steps already done, and ends as an uninterrupted run would).
"""
from __future__ import annotations

import os
import time
from collections import Counter

import numpy as np

from ...errors import ConfigError, WaitTimeout, WorkerError
from ...options import Option
from ...strategies import WorkerJob
from ...strategies.ops import (AllReduce, Average, Elastic, Fetch, Gradient, LocalApply,
                               LocalStep, Push)
from ..base import BACKUP_WORKERS, STAGES, Engine, EngineResult, shard_bounds, shard_count
from ..options import CHECKPOINT_EVERY, RESUME, SHARDS, TIMEOUT, checkpoint_paths
from .shard import Shard, latest_checkpoint
from .worker import RemoteWorker


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("the ray engine needs Ray: pip install 'monsoon[ray]'") from exc
    return ray


class RayEngine(Engine):
    name = "ray"
    ops = frozenset({Gradient, Fetch, Push, LocalStep, LocalApply, AllReduce, Average, Elastic})
    meets = frozenset({BACKUP_WORKERS, STAGES})
    device_placement = "assigned"  # --device cuda: Ray gives each worker actor its GPU
    virtual_time = False
    backend_used = "actors"
    options = (
        Option("address", str, None, "join this Ray cluster (auto or HOST:PORT); default: start "
               "a local Ray instance"),
        TIMEOUT, SHARDS, CHECKPOINT_EVERY, RESUME,
        Option("run_name", str, None, "names the actors monsoon-NAME-worker-K (default random)"),
    )

    @classmethod
    def from_options(cls, run, address=None, timeout=60.0, shards=None,
                     checkpoint_every=CHECKPOINT_EVERY.default,
                     resume=None, run_name=None):
        return cls(address=address, timeout=timeout, shards=shards, run_name=run_name,
                   **checkpoint_paths(run.out, checkpoint_every, resume))

    def __init__(self, address: str | None = None, timeout: float = 60.0,
                 start_timeout: float = 120.0, shards: int | None = None,
                 checkpoint_dir: str | None = None, checkpoint_every: int = 0,
                 resume_dir: str | None = None, run_name: str | None = None,
                 poll_s: float = 0.05):
        self.address = address
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.shards = shards
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume_dir = resume_dir
        self.poll_s = poll_s
        # Actors are named monsoon-RUN-worker-K / monsoon-RUN-shard-S, so they
        # can be found (and killed) in the Ray dashboard or with ray.get_actor.
        import uuid

        self.run_name = run_name or uuid.uuid4().hex[:8]

    def describe(self) -> dict:
        return {"engine": self.name, "address": self.address, "run_name": self.run_name,
                "timeout_s": self.timeout,
                "checkpoint_every": self.checkpoint_every, "resumed_from": self.resume_dir}

    def run(self, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder):
        self.check(strategy, workers)
        if hasattr(strategy, "run_on"):  # a strategy with its own runner (pipeline)
            return strategy.run_on(self, problem, rule, w0, workers, batch_size, seed, budget,
                                   recorder)
        ray = import_ray()
        started = not ray.is_initialized()
        if started:
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                     num_cpus=None if self.address else os.cpu_count())
        try:
            return self._run(ray, problem, rule, strategy, w0, workers, batch_size, seed,
                             budget, recorder)
        finally:
            if started:
                ray.shutdown()

    def _run(self, ray, problem, rule, strategy, w0, workers, batch_size, seed, budget,
             recorder):
        t_begin = time.perf_counter()
        S = shard_count(self.shards, workers, w0.size)
        self.shards_used = S
        bounds = shard_bounds(w0.size, S)
        start, resume = 0, [None] * S
        w_start = np.array(w0, copy=True)
        if self.resume_dir:
            found = latest_checkpoint(self.resume_dir, S)
            if found is None:
                raise ConfigError(f"no complete checkpoint for {S} shards in {self.resume_dir}")
            start, resume = found
            for (a, b), data in zip(bounds, resume):
                w_start[a:b] = data["params"]
        if self.checkpoint_dir:
            os.makedirs(self.checkpoint_dir, exist_ok=True)
        counted = workers - strategy.backup_workers
        from ...devices import ray_gpus_per_worker

        gpus = ray_gpus_per_worker(problem, workers, ray.cluster_resources().get("GPU", 0))
        ShardActor, WorkerActor = ray.remote(Shard), ray.remote(RemoteWorker)
        shards = [ShardActor.options(name=f"monsoon-{self.run_name}-shard-{s}", num_cpus=0,
                                     max_concurrency=workers + 4).remote(
                      s, w_start[a:b], rule, workers, counted, self.timeout,
                      self.checkpoint_dir, self.checkpoint_every, resume[s])
                  for s, (a, b) in enumerate(bounds)]
        actors = [WorkerActor.options(name=f"monsoon-{self.run_name}-worker-{rank}", num_cpus=0,
                                      num_gpus=gpus, max_concurrency=2, scheduling_strategy="SPREAD").remote(
                      rank, problem.for_worker(rank, workers), strategy,
                                     WorkerJob(rank, workers, problem.n_examples, batch_size,
                                               seed, budget, start_step=start),
                                     shards, bounds, w_start, self.timeout)
                  for rank in range(workers)]
        try:
            return self._drive(ray, actors, shards, strategy, workers, t_begin, start, recorder,
                               w_start)
        finally:
            for actor in actors + shards:
                ray.kill(actor)

    def _drive(self, ray, actors, shards, strategy, workers, t_begin, start, recorder, w_start):
        from ray.exceptions import GetTimeoutError

        for rank, actor in enumerate(actors):
            try:
                ray.get(actor.ready.remote(), timeout=self.start_timeout)
            except GetTimeoutError as exc:
                raise WaitTimeout(f"Ray worker {rank} did not start within "
                                  f"{self.start_timeout:g} s") from exc
            except Exception as exc:  # noqa: BLE001 - reported by name, with Ray's reason
                reason = [line for line in str(exc).splitlines() if "Error" in line][-1:]
                err = WorkerError(f"Ray worker {rank} could not start: "
                                  f"{reason[0].strip() if reason else exc} (every node needs "
                                  "monsoon and the problem's code importable)")
                err.worker = rank
                raise err from exc
        startup = time.perf_counter() - t_begin
        recorder.start(w_start)
        t0 = time.perf_counter()
        running = {a.run.remote(): rank for rank, a in enumerate(actors)}
        results, failed = {}, {}
        examples, last_change = 0, time.monotonic()
        stopped = None
        while running:
            done, _ = ray.wait(list(running), num_returns=len(running), timeout=self.poll_s)
            for ref in done:
                rank = running.pop(ref)
                try:
                    results[rank] = ray.get(ref, timeout=self.timeout)
                except Exception as exc:  # noqa: BLE001 - a dead or failed worker, by name
                    failed[rank] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
            if len(failed) == workers or (strategy.needs_all_workers
                                          and len(failed) > strategy.backup_workers):
                rank = min(failed)
                why = ("every worker failed" if len(failed) == workers
                       else "this strategy needs every worker")
                err = WorkerError(f"worker {rank} failed, and {why}: {failed[rank]}")
                err.worker = rank
                raise err
            now = time.perf_counter() - t0
            live = [actors[r] for r in running.values()]
            counts = self._progress(ray, live) + sum(r["examples"] for r in results.values())
            if counts != examples:
                examples, last_change = counts, time.monotonic()
            elif time.monotonic() - last_change > 2 * self.timeout:
                raise WaitTimeout(f"no Ray worker made progress for {2 * self.timeout:g} s")
            if recorder.due(now, examples):
                params, version, dropped = self._params(ray, shards)
                reason = recorder.record(now, version - start, examples, params, dropped)
                if reason is not None:
                    stopped = reason
                    break
        wall = time.perf_counter() - t0
        params, version, dropped = self._params(ray, shards)
        staleness = Counter()
        for r in results.values():
            staleness.update({int(k): v for k, v in r["staleness"].items()})
        return EngineResult(
            params, startup, wall, sum(r["examples"] for r in results.values()),
            version - start, dropped + sum(r["dropped"] for r in results.values()), staleness,
            [{"worker": r, "error": failed[r], "traceback": failed[r]} for r in sorted(failed)],
            stopped=stopped, late_gradients=sum(r["late"] for r in results.values()),
            worker_params={r: v["params"] for r, v in results.items() if v["params"] is not None},
            worker_states={r: v["state"] for r, v in results.items() if v.get("state")})

    def _progress(self, ray, live) -> int:
        if not live:
            return 0
        ready, _ = ray.wait([a.progress.remote() for a in live], num_returns=len(live),
                            timeout=min(1.0, self.timeout))
        total = 0
        for ref in ready:
            try:
                total += ray.get(ref)["examples"]
            except Exception:  # noqa: BLE001 - a dead worker: its run() reports why
                pass
        return total

    def _params(self, ray, shards):
        parts = ray.get([sh.snapshot.remote() for sh in shards], timeout=self.timeout)
        return (np.concatenate([p for p, _, _ in parts]), parts[0][1],
                sum(d for _, _, d in parts))

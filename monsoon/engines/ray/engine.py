"""The Ray engine: the same strategies on a real cluster.

Parameter-server shards are threaded Ray actors, on the driver's node
(``on_driver_node``), holding their slice and its rule state
(``shard.py``); workers are Ray actors that load their data once and run
the strategy program, turning ops into calls on the shards
(``worker.py``). The driver (this process) watches them: it evaluates the
loss on the shards' parameters, counts progress, and names a worker actor
that dies in ``failed_workers`` (its last figures, traffic too, count; its
drops as its shards were told). async, local-sgd's and easgd's others carry
on; sync carries on while its backup workers cover the loss, and otherwise
fails fast with the worker's error. Every remote wait has a timeout.

Compression (``--compress``): a worker puts its packed message
(``messages.Sender.pack``) in Ray's object store once and each shard
decodes its slice of it; every worker's bytes sent and received are in the
summary (``messages.summarize``).

Workers, shards and SSP's clock are built in pooled hosts (``hosts.py``):
where Ray was up before the run (a notebook, a sweep), the driver's next
run reuses the processes of one that ended normally.

``address=None`` starts a local Ray instance (no head process its driver
never uses: ``_head_unneeded``), even beside a ``ray start`` here, and
stops it after the run; ``"auto"`` or ``"HOST:PORT"`` joins one::

    ray start --head --port 6379                 # on the head node
    ray start --address HEAD_IP:6379             # on every other node
    monsoon train --engine ray --address auto ...   # on any node

Checkpoints (``checkpointing.py``): with a run folder, the driver writes one
every ``checkpoint_every`` updates from the shards' copies, through the
shared ``record/checkpoints.py``; ``resume_dir`` carries a sync run on
exactly (it ends as an uninterrupted run would) and an async run from its
workers' positions, and refuses another run's checkpoint in one line.

SIGTERM/SIGINT: the driver asks the workers to stop at a clean point
(``_stop``), writes the final checkpoint where they stopped and returns the
result marked ``interrupted`` (docs/faults.md), also where the signal
came while Ray was starting (``start_ray`` keeps the run's handlers).
"""
from __future__ import annotations

import logging
import math
import os
import time

import numpy as np

from ...errors import ConfigError
from ...options import Option
from ...strategies import WorkerJob
from ...strategies.ops import (AllReduce, Average, Clock, Elastic, Fetch, Gradient, LocalApply,
                               LocalStep, Push)
from ..base import BACKUP_WORKERS, ELASTIC, STAGES, Engine
from ...server.shards import MIN_PROCESS_SHARD, shard_bounds, shard_count
from ...record.checkpoints import Checkpointer
from ...server.summed import initial_sums
from ...monitor.due import Due
from ...monitor.lifecycle import reclaim_signals
from ...monitor.pool import fail_if_lost
from ..options import CHECKPOINT_EVERY, RESUME, SHARDS, TIMEOUT, refuse_unused_shards
from ...monitor.tally import (RunTally, local_totals, merged, run_folder_extra,
                              summed_staleness, workers_dropped)
from .checkpointing import ShardCheckpoints, dropped_so_far
from .address import check_address
from .clock import ClockServer
from .hosts import POOL, get_or_fail, kill
from .membership import Membership
from .shard import Shard
from .worker import RemoteWorker


# among the workers' figures, by rank: the lost workers' last ones, summed
# (the rows, checkpoints and live reports); the tally adds them by rank
LOST = -1


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("the ray engine needs Ray: pip install 'monsoon[ray]'") from exc
    return ray


def start_ray(ray, address) -> None:
    """``ray.init`` with the run's SIGTERM handler kept while Ray starts.

    ``ray.init`` first installs a handler that exits at once (status 15,
    silently, before anything that started can be shut down: Ray's agents
    then live on for a minute or more). With the run's handler kept, a
    SIGTERM during start-up only marks the run stopped, and the run stops
    as it would at its first step, Ray shut down by the engine. Whatever
    the start-up raises, what it started is shut down. Afterwards the
    run's handlers replace those Ray installed (``reclaim_signals``).

    The processes a local instance starts (GCS, raylet and, under it, the
    workers) run in a session of their own, as Spark's JVM does: a SIGTERM
    to monsoon's process group (GNU ``timeout``, a batch scheduler) then
    reaches the run alone, which stops its workers cleanly and Ray with
    them, instead of killing the raylet under the stop (the run failed with
    "ActorUnavailableError"). They still end with this process: Ray gives
    each the parent-death signal (its fate sharing), and Ctrl-C never
    reached them (Ray blocks SIGINT in them)."""
    private = getattr(ray, "_private", None)
    services = getattr(private, "services", None)
    # joining a cluster (also by RAY_ADDRESS, which ray.init joins for None)
    # takes its CPUs as they are; else "local", as ray.init's None would join
    # the cluster a `ray start` on this machine recorded (ray_current_cluster)
    joins = bool(address or os.environ.get("RAY_ADDRESS"))
    # Private hooks, each left alone where a Ray version lacks it: Ray's
    # Python SIGTERM handler, the C++ failure-signal handler of the
    # driver's core worker (a stack dump and abort on SIGTERM; Ray's
    # documented RAY_DISABLE_FAILURE_SIGNAL_HANDLER, for this process only),
    # the Popen that starts Ray's processes and, for a local instance, the
    # head processes its driver never uses
    hooks = [(getattr(private, "utils", None), "set_sigterm_handler", lambda handler: None),
             (getattr(private, "ray_constants", None), "RAY_DISABLE_FAILURE_SIGNAL_HANDLER",
              True),
             (services, "ConsolePopen", _in_own_session(ray)),
             *([] if joins else _head_unneeded(ray))]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in hooks
             if hasattr(owner, name)]
    for owner, name, value in hooks:
        if hasattr(owner, name):
            setattr(owner, name, value)
    try:
        ray.init(address=address if joins else "local", include_dashboard=False,
                 log_to_driver=False,
                 logging_level=logging.WARNING,  # no INFO lines among monsoon's
                 num_cpus=None if joins else os.cpu_count())
    except BaseException:
        ray.shutdown()
        raise
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        reclaim_signals()  # over any handler Ray installed all the same


# The head processes a local instance starts that its one driver never
# uses (``_head_unneeded``)
HEAD_UNNEEDED = ("start_api_server", "start_monitor", "start_log_monitor")


def _head_unneeded(ray) -> list:
    """Hooks that leave out, of the local instance a run starts for itself,
    the head processes its one driver never uses: the dashboard's server
    (``include_dashboard=False`` still starts it, for usage stats alone,
    and ``ray.init`` waits for it), the autoscaler's monitor (a local
    instance has no nodes to add) and the log monitor (it streams the
    workers' output to drivers, which ``log_to_driver=False`` ignores).
    Each is a Python process importing Ray: ~2 s of ``ray.init`` on 2 cores,
    ~1 s of ``ray.shutdown``. GCS, raylet and the raylet's agents start as
    before; a cluster joined (``--address``) is Ray's own, untouched."""
    node = getattr(getattr(ray, "_private", None), "node", None)
    cls = getattr(node, "Node", None)
    return [(cls, name, lambda self, *args, **kwargs: None) for name in HEAD_UNNEEDED
            if cls is not None]


def _in_own_session(ray):
    """Ray's ``ConsolePopen`` starting each process in a new session
    (``setsid``), where Ray makes its processes end with their parent (its
    kernel fate sharing: Linux); else Ray's own, whose reaper then finds
    them in this process's group."""
    private = getattr(ray, "_private", None)
    popen = getattr(getattr(private, "services", None), "ConsolePopen", None)
    fate_sharing = getattr(getattr(private, "utils", None), "detect_fate_sharing_support", None)
    if popen is None or fate_sharing is None or not fate_sharing():
        return popen

    class OwnSession(popen):
        def __init__(self, *args, **kwargs):
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    return OwnSession


def on_driver_node(ray):
    """Where the server's actors (shards, SSP's clock) live: on the driver's
    own node, never only on a node the run can lose. A worker node that is
    lost (a crash, a network partition) then takes only its workers, which
    async, ssp and easgd name in ``failed_workers`` and run on without; the
    driver's node lost is the run lost anyway. (The other choice, restoring
    a lost shard from the newest checkpoint, loses the updates since it.)"""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(),
                                          soft=False)


def cpus_per_worker(workers: int, cluster_cpus: float) -> float:
    """``num_cpus`` of each worker actor: one CPU each where the cluster has
    enough, else the largest share 1/2, 1/4, ... that fits them all. A
    worker computes all the time, so it reserves its core, and Ray then
    places workers where cores are free: one a node on nodes of one CPU,
    rather than all on one node. Shares of 1/2^k pack whole nodes, and runs
    of different worker counts (3 and 4 workers on 2 CPUs) reserve the same
    share, so the next run reuses the hosts the last one left (hosts.py)."""
    if cluster_cpus <= 0 or workers <= 0:
        return 0.0
    if workers <= cluster_cpus:
        return 1.0
    return 2.0 ** -math.ceil(math.log2(workers / cluster_cpus))


def server_threads(workers: int) -> int:
    """``max_concurrency`` of a shard or clock actor: a thread for each
    worker's waiting call plus the driver's, rounded up to a power of two
    (at least 8) so that runs of a few more or fewer workers reuse the same
    hosts (hosts.py keys a host by its options)."""
    return max(8, 1 << (workers + 3).bit_length())


class RayEngine(Engine):
    name = "ray"
    compresses = True  # a worker's packed message goes to the shards (worker.py)
    ops = frozenset({Gradient, Fetch, Push, LocalStep, LocalApply, AllReduce, Average, Elastic,
                     Clock})
    meets = frozenset({BACKUP_WORKERS, STAGES, ELASTIC})
    device_placement = "assigned"  # --device cuda: Ray gives each worker actor its GPU
    virtual_time = False
    stops_on_signal = True  # SIGTERM/SIGINT: the workers stop cleanly, a final checkpoint
    keeps_private_copies = False  # local SGD, EASGD: none written (refuse_checkpoints)
    backend_used = "actors"
    options = (
        Option("address", str, None, "join this Ray cluster (auto or HOST:PORT); default: start "
               "a local Ray instance"),
        TIMEOUT, SHARDS, CHECKPOINT_EVERY, RESUME,
        Option("run_name", str, None, "gives the run actors of its own, named "
               "monsoon-NAME-worker-K (default: unnamed actors, kept for the next run)"),
    )
    described = ("address", "run_name", "timeout", "checkpoint_every", "resume_dir")

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
        # A named run's actors are its own, named monsoon-RUN-worker-K /
        # monsoon-RUN-shard-S, to be found (and killed) in the Ray dashboard or
        # with ray.get_actor; an unnamed run's come from the pool (hosts.py).
        import uuid

        self.named = run_name is not None
        self.run_name = run_name or uuid.uuid4().hex[:8]

    def check(self, strategy, workers) -> None:
        super().check(strategy, workers)
        if strategy.elastic and self.compression.active:
            raise ConfigError("--elastic does not combine with --compress yet (a regrouped "
                              "step would compress twice into one residual); drop one of them")

    def preflight(self, problem, strategy, workers, batch_size) -> None:
        """A given ``--shards`` where the run has no server to split (the
        pipeline's stages) is refused, as on local and sim; every synchronous
        step goes through the shards here, small parameters too (no
        replicated step: ``device`` None)."""
        super().preflight(problem, strategy, workers, batch_size)
        refuse_unused_shards(self, problem, strategy, device=None)

    def run(self, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder):
        self.check(strategy, workers)
        t_begin = time.perf_counter()
        S = shard_count(self.shards, workers, w0.size, min_shard=MIN_PROCESS_SHARD)
        self.shards_used = S
        bounds = shard_bounds(w0.size, S)
        ckpts = ShardCheckpoints(
            Checkpointer.for_engine(self, problem, strategy, rule, workers, batch_size, seed,
                                    recorder),
            rule, strategy, bounds, workers, problem.n_examples, batch_size)
        start = ckpts.load(w0)  # checked (and refused in one line) before Ray starts
        ray = import_ray()
        started = not ray.is_initialized()
        if started:
            check_address(self.address, self.timeout)  # a dead one fails here, not in ray.init
            start_ray(ray, self.address)
        try:
            if STAGES in strategy.needs(workers):  # stage workers: this engine's pipeline runner
                from .pipeline import run_pipeline
                return run_pipeline(self, ray, strategy, problem, rule, w0, workers, batch_size,
                                    seed, budget, recorder)
            return self._run(ray, problem, strategy, workers, batch_size, seed, budget,
                             recorder, t_begin, rule, bounds, ckpts, start)
        finally:
            if started:
                ray.shutdown()

    def _run(self, ray, problem, strategy, workers, batch_size, seed, budget, recorder,
             t_begin, rule, bounds, ckpts, start):
        counted = workers - strategy.backup_workers
        from ...devices import ray_gpus_per_worker

        gpus = ray_gpus_per_worker(problem, workers, ray.cluster_resources().get("GPU", 0))
        named = self.named  # a named run's actors are its own (hosts.py), else pooled ones
        clock = self._clock_server(ray, strategy, workers)
        elastic = strategy.elastic
        # Local AdaAlter's shared sums, sliced among the shards (``server/summed.py``)
        sums = (initial_sums(strategy.local_rule, start.params.size, start.params.dtype)
                if Average in strategy.uses else None)
        shards = [POOL.take(ray, Shard, (s, start.params[a:b], rule, workers, counted,
                                         self.timeout, ckpts.every, ckpts.shard_resume(s),
                                         self.compression, (a, b, start.params.size), elastic,
                                         None if sums is None else [x[a:b] for x in sums]),
                            {"num_cpus": 0, "max_concurrency": server_threads(workers),
                             "scheduling_strategy": on_driver_node(ray)},
                            name=f"monsoon-{self.run_name}-shard-{s}" if named else None)
                  for s, (a, b) in enumerate(bounds)]
        cpus = cpus_per_worker(workers, ray.cluster_resources().get("CPU", 0))

        def spawn(rank, incarnation=0):
            name = f"monsoon-{self.run_name}-worker-{rank}" + (
                f"-{incarnation}" if incarnation else "")
            return POOL.take(ray, RemoteWorker, (
                rank, problem.for_worker(rank, workers), strategy,
                WorkerJob(rank, workers, problem.n_examples, batch_size, seed, budget,
                          start_step=start.positions[rank]),
                shards, bounds, start.params, self.timeout, clock, self.compression, sums),
                {"num_cpus": cpus, "num_gpus": gpus, "max_concurrency": 2,
                 "scheduling_strategy": "SPREAD"},
                name=name if named or incarnation else None)

        actors = [spawn(rank) for rank in range(workers)]
        retired = []  # elastic: actors replaced, and restarts that did not start
        membership = (Membership(ray, shards, strategy, workers, self.timeout,
                                 self.start_timeout, spawn, cpus, gpus) if elastic else None)
        servers = shards + ([clock] if clock is not None else [])
        ended = False
        try:
            result = self._drive(ray, actors, shards, strategy, workers, t_begin, start,
                                 recorder, ckpts, clock, membership, retired)
            # every worker's run answered: its hosts (and the servers') serve the next run
            ended = not retired and result.stopped is None and not result.failed_workers
        finally:
            if membership is not None:
                membership.close(retired)
            if ended:
                POOL.give_back(ray, actors + servers)
            else:
                for actor in actors + retired + servers:
                    kill(ray, actor)
        result.extra.update(run_folder_extra(ckpts.keeper.last_path, start.path))
        return result

    # -- SSP's clock (ops.Clock) ------------------------------------------------
    def _clock_server(self, ray, strategy, workers):
        if Clock not in strategy.uses:
            return None
        return POOL.take(ray, ClockServer, (workers, self.timeout),
                         {"num_cpus": 0, "max_concurrency": server_threads(workers),
                          "scheduling_strategy": on_driver_node(ray)},
                         name=f"monsoon-{self.run_name}-clock" if self.named else None)

    def _drive(self, ray, actors, shards, strategy, workers, t_begin, start, recorder, ckpts,
               clock=None, membership=None, retired=()):
        """Watches the started workers until every one has ended or the
        recorder stops the run: each poll collects the ended workers' results
        (naming the ones that failed), their progress, a due checkpoint, curve
        row and live report; it fails the run when too many workers are lost
        or none made progress for twice the timeout."""
        self._await_ready(ray, actors)
        startup = time.perf_counter() - t_begin
        recorder.start(start.params)
        # the run's clock carries on from the resumed checkpoint's time: the rows,
        # the checkpoints and the wall time each count the earlier attempts once
        t0 = time.perf_counter() - start.time_s
        running = {a.run.remote(): rank for rank, a in enumerate(actors)}
        results, failed = {}, {}
        seen, lost = {}, {}  # each rank's last figures; the lost workers', by rank
        due = Due(recorder, timeout=self.timeout)  # rows, live reports, the no-progress backstop
        stopped = stop_by = None
        shards_dropped = {"at_row": start.dropped}  # the live reports' count between rows
        while running:
            done, _ = ray.wait(list(running), num_returns=len(running), timeout=self.poll_s)
            gone = {}  # the ranks lost now: their last figures
            for ref in done:
                rank = running.pop(ref)
                try:
                    results[rank] = ray.get(ref, timeout=self.timeout)
                except Exception as exc:  # noqa: BLE001 - a dead or failed worker, by name
                    failed[rank] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
                    gone[rank] = seen.pop(rank, {})
                    if clock is not None:  # it no longer holds the others to the bound
                        clock.retire.remote(rank)
                    if membership is not None:  # elastic sync: the others regroup
                        membership.lose(rank, failed[rank], actors[rank])
            for rank, last in self._told_drops(ray, shards, gone).items():
                lost[rank] = merged(lost.get(rank), last)  # an elastic rank: each incarnation
                results[LOST] = merged(results.get(LOST), last)
            if membership is not None:
                membership.rejoin(running, actors, retired)
            live = {r: actors[r] for r in running.values()}
            figures = {**self._progress(ray, live), **results}  # finished: their final figures
            seen.update(figures)
            by_rank = {r: f.get("examples", 0) for r, f in figures.items()}  # LOST may have none
            ckpts.collect(ray, shards, self.timeout, time.perf_counter() - t0, figures, lost)
            if membership is None:  # elastic: Membership.lose asks it of the ranks out now
                fail_if_lost(failed, strategy, workers)
            now = time.perf_counter() - t0
            examples = start.examples + sum(by_rank.values())
            due.progress(examples, f"no Ray worker made progress for {2 * self.timeout:g} s")
            stopped = due.look(now, examples,
                               lambda: self._row(ray, shards, start, strategy, figures,
                                                 shards_dropped),
                               lambda: _totals(examples, figures, shards_dropped["at_row"]),
                               lambda: ({r: f for r, f in figures.items() if r != LOST},
                                        summed_staleness(figures.values())))
            if due.signal():  # the workers stop at a clean point, then the checkpoint
                stop_by = time.monotonic() + self.timeout
                self._stop(ray, strategy, shards, [actors[r] for r in running.values()])
            if stopped is not None or (stop_by is not None and time.monotonic() > stop_by):
                break
        wall = time.perf_counter() - t0
        stopped = due.stop_reason if due.interrupted else stopped
        ended = not running
        if running:  # stopped: the workers still running report what they did so far
            results.update(self._told_drops(ray, shards, self._reports_now(
                ray, {r: actors[r] for r in running.values()}, seen)))
        _last_live(due, wall, start.examples, results, shards_dropped["at_row"])
        # the lost workers' last figures and the finished ones' reports, added to
        # what the resumed run had counted
        tally = _by_rank(RunTally.resumed(workers, self.compression, start.totals,
                                          ssp=clock is not None), lost, results)
        # an elastic run that lost workers still ran every step (Membership.lose
        # fails the run when no member is left)
        if ended and (stopped is None or due.interrupted) and \
                (not failed or membership is not None):
            ckpts.final(ray, shards, self.timeout, wall, results,
                        "interrupted" if due.interrupted else "final", tally.totals())
        return self._result(ray, shards, start, results, failed, startup, wall, stopped,
                            tally, membership, strategy, due.interrupted)

    def _stop(self, ray, strategy, shards, live) -> None:
        """Ask the run to stop at a clean point: a synchronous step's
        workers after the next step every shard completes (``shard.py``),
        the others before their next op that lands nothing (``worker.py``);
        each then ends its ``run`` as at a normal end."""
        if strategy.synchronous:
            ray.get([sh.stop.remote() for sh in shards], timeout=self.timeout)
        else:
            for actor in live:
                actor.stop.remote()

    def _await_ready(self, ray, actors) -> None:
        """Waits for each worker actor to have loaded its data, within
        ``start_timeout``; a worker that cannot start fails the run by rank,
        with the line of Ray's reason that names the error."""
        for rank, actor in enumerate(actors):
            get_or_fail(ray, actor.ready.remote(), self.start_timeout,
                        f"Ray worker {rank} did not start",
                        f"Ray worker {rank} could not start: {{error}} (every node needs "
                        "monsoon and the problem's code importable)", rank)

    def _result(self, ray, shards, start, results, failed, startup, wall, stopped, tally,
                membership, strategy, interrupted=None):
        """The run's result: the shards' parameters, and the ``tally`` of the
        finished workers' reports (``results``, with the lost workers' last
        figures) and the resumed run's; each failed worker is listed with
        its error."""
        tally.failed.update(failed)
        params, updates, dropped, _ = self._params(ray, shards, start, strategy.synchronous,
                                                   results)
        extra = {"membership": membership.events} if membership is not None else {}
        return tally.result(params, startup, wall, start.examples + tally.examples,
                            updates, dropped,
                            {**extra, **tally.extra(updates)},
                            local=tally.local_totals(strategy), stopped=stopped,
                            interrupted=interrupted)

    def _ask(self, ray, live: dict, method: str, timeout: float, standing=None) -> dict:
        """The answers of the ``live`` workers (rank -> actor) to ``method``
        that come within ``timeout``, by rank; a worker that does not answer
        in time, or died meanwhile, keeps what ``standing`` holds for it."""
        answers = {r: standing[r] for r in live if standing and r in standing}
        if not live:
            return answers
        refs = {getattr(a, method).remote(): r for r, a in live.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        for ref in ready:
            try:
                answers[refs[ref]] = ray.get(ref)
            except Exception:  # noqa: BLE001 - a dead worker: its run() reports why
                pass
        return answers

    def _reports_now(self, ray, live: dict, seen: dict) -> dict:
        """The reports of the workers still running when the run stopped
        (``RemoteWorker.report_now``), by rank; a worker that does not answer
        in time counts its last progress figures (``seen``)."""
        return self._ask(ray, live, "report_now", self.timeout, seen)

    def _told_drops(self, ray, shards, figures: dict) -> dict:
        """The last ``figures`` (by rank) of workers that ended without
        telling their shards of their last drops (lost, or killed where the
        run stopped), each with ``dropped`` as every shard's rule heard it:
        the shards are told of those its figures count (``Shard.told``),
        then each shard that heard fewer than another (the worker's own
        last call reached the other before the driver's tell) is told the
        most any heard, so that every rule hears the count the run reports,
        once. A shard that fails or does not answer the first tells in time
        leaves the figures' own count (the run's error, a lost worker's or a
        stopped run's result, is what the run reports); one that fails the
        second leaves the most heard (the tells sent still land)."""
        from ray.exceptions import RayError

        if not figures:
            return {}
        ranks = list(figures)
        try:
            heard = self._tell_shards(ray, shards, [
                (r, s, figures[r].get("dropped", 0)) for r in ranks for s in range(len(shards))])
        except RayError:  # a shard lost or stuck: its own error comes later
            return figures
        most = {r: max(heard[r]) for r in ranks}
        try:
            self._tell_shards(ray, shards, [(r, s, most[r]) for r in ranks
                                            for s, n in enumerate(heard[r]) if n < most[r]])
        except RayError:
            pass
        return {r: {**figures[r], "dropped": most[r]} for r in ranks}

    def _tell_shards(self, ray, shards, tells) -> dict:
        """Tells each shard ``s`` of worker ``r``'s ``dropped`` (``tells``:
        (r, s, dropped)) in one wait; what each heard, by rank, in shard order."""
        heard = {}
        if tells:
            answers = ray.get([shards[s].told.remote(r, n, True) for r, s, n in tells],
                              timeout=self.timeout)
            for (r, _, _), n in zip(tells, answers):
                heard.setdefault(r, []).append(n)
        return heard

    def _progress(self, ray, live: dict) -> dict:
        """The running workers' figures that answer (``RemoteWorker.progress``:
        examples, losses, updates, staleness), by rank."""
        return self._ask(ray, live, "progress", min(1.0, self.timeout))

    def _row(self, ray, shards, start, strategy, figures: dict, seen: dict) -> tuple:
        """A curve row's snapshot (``Due.look``): the parameters, updates and
        dropped updates (``_params``), the workers' local steps, and where
        the workers push, the examples of the updates read with them: a
        push lands on shard 0 with its examples under the shard's lock, so
        the examples of the pushes its version counts are read with it (the
        workers' figures, read before, would miss those landed since and
        count those still on their way), and the pushes the workers dropped
        add theirs, as they add to the dropped updates. Updates are shard
        0's version: the other shards may have applied a few more or fewer."""
        params, updates, dropped, applied = self._params(ray, shards, start,
                                                         strategy.synchronous, figures, seen)
        local = _local_totals(strategy, figures)
        if Push not in strategy.uses:  # examples counted as computed: the workers' figures
            return params, updates, dropped, local
        return params, updates, dropped, local, start.examples + applied + sum(
            f.get("dropped_examples", 0) for f in figures.values())

    def _params(self, ray, shards, start, synchronous: bool, figures: dict, seen=None):
        """The shards' parameters, the updates applied and the updates
        dropped, with those of the run this one resumed (for the curve's rows
        and the result alike): the shards' drops and those of the workers'
        ``figures`` (by rank: their progress or their reports), as the
        checkpoints count them (``dropped_so_far``). A shard's version
        counts its synchronous steps, dropped ones too, so the shards' drops
        are taken off it. ``seen["at_row"]`` (where given) keeps the shards'
        count, which the live reports until the next row add to the
        workers' (``_totals``: no call of their own). Last, the examples of
        the pushes shard 0 applied in this run (``Shard.snapshot``)."""
        parts = ray.get([sh.snapshot.remote() for sh in shards], timeout=self.timeout)
        version, applied = parts[0][1:3]
        shards_dropped, dropped = dropped_so_far(start, parts, figures)
        if seen is not None:
            seen["at_row"] = shards_dropped
        return (np.concatenate([p[0] for p in parts]),
                version - shards_dropped if synchronous else version, dropped, applied)


def _by_rank(tally: RunTally, lost: dict, results: dict) -> RunTally:
    """``tally`` with the lost workers' last figures (``lost``) and then the
    ``results`` added by rank (``LOST`` left out: its ranks are in
    ``lost``), so that a lost worker's traffic and SSP clock report are its
    own entries (an elastic rank's incarnations one entry) and its
    staleness and counts up to its last progress are in the summary."""
    for rank, figures in [*lost.items(), *results.items()]:
        if rank != LOST:
            tally.add(rank, figures)
    return tally


def _local_totals(strategy, figures: dict) -> tuple | None:
    """The workers' local steps (applied, dropped) from their latest
    figures, where the strategy takes any; else None."""
    return local_totals(strategy, sum(f.get("local", 0) for f in figures.values()),
                        sum(f.get("local_dropped", 0) for f in figures.values()))


def _last_live(due, wall: float, examples_before: int, results: dict,
               shards_dropped: int) -> None:
    """The run's last live row, from every worker's final report (``results``)."""
    examples = examples_before + sum(f.get("examples", 0) for f in results.values())
    due.live(wall, lambda: _totals(examples, results, shards_dropped),
             lambda: ({r: f for r, f in results.items() if r != LOST},
                      summed_staleness(results.values())), final=True)


def _totals(examples: int, figures: dict, shards_dropped: int) -> tuple:
    """(examples, updates, dropped) for a live report, from the workers'
    latest figures (by rank); the dropped ones as the rows count them, the
    shards' (a synchronous step's: ``shards_dropped``, as of the last row)
    and the workers' own."""
    return (examples, sum(f.get("updates", 0) for f in figures.values()),
            shards_dropped + workers_dropped(figures))


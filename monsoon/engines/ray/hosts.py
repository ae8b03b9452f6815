"""Ray actors kept between the runs of one driver: a pool of hosts.

A Ray actor is a process of its own. Starting one costs about 2 s of CPU
(Ray's worker start), and importing monsoon and the problem's libraries
costs more (torch: another 1.5 s). A driver that trains again (a notebook,
``monsoon compare``, a sweep, a test suite) would pay that for every
worker, shard and clock of every run. Instead each of them lives in a
``Host``, a threaded actor that builds one run's object (a ``RemoteWorker``,
a ``Shard``, a ``ClockServer``), serves its calls, and, once the run has
ended normally, drops the object and waits for the next run's.
``Hosted`` is the driver's handle on a hosted object:
``hosted.method.remote(*args)`` calls the object's method, as the handle
of an actor of the object's own class would.

Invariants:

- a host serves one run's object at a time. Each object has its own
  generation, and a call meant for an earlier one is refused (a late
  fire-and-forget call never reaches the next run's object);
- a host goes back to the pool only when its run ended with every worker's
  ``run`` answered; otherwise it is killed, as an unpooled actor would be;
- an idle host still holds what it was made with (a worker's CPU, its GPU),
  so an idle host is killed after ``IDLE_S`` seconds, and when a run needs
  a new host that holds resources (a worker's CPU or GPU) and the idle one
  is of another shape (other resources, placement or concurrency); a new
  host that holds none (a shard's, a clock's) ends no idle host;
- the pool belongs to the driver's Ray job on one Ray instance: after a new
  ``ray.init`` the old handles are forgotten (a new local instance numbers
  its first job as the last one did, so the job is told by its id and the
  driver's node's, which is new with each instance), and the driver's exit
  ends its hosts (Ray ends a job's actors with it);
- a named run (``run_name``) gets hosts of its own, named
  ``monsoon-NAME-worker-K`` and so on, found by name in the dashboard or
  with ``ray.get_actor`` (``host.ask.remote("progress")`` calls the object it
  holds), and killed at its end.
"""
from __future__ import annotations

import gc
import itertools
import threading
import time

from ...errors import WaitTimeout, WorkerError

IDLE_S = 10.0   # an idle host is killed after this long (it holds its CPU and GPU)
MADE_S = 300.0  # the most a call waits for its object to be built


class Host:
    """The actor: it builds an object and serves calls on it."""

    def __init__(self):
        self.obj = None
        self.gen = None
        self.made = threading.Event()

    def build(self, gen: int, cls, args: tuple) -> bool:
        self.obj, self.gen = None, gen
        self.obj = cls(*args)
        self.made.set()
        return True

    def call(self, gen: int, method: str, *args):
        # a threaded actor may start a call before the build sent ahead of it ends
        if not self.made.wait(MADE_S) or self.gen != gen:
            raise RuntimeError(f"call {method} for a run that ended (object {gen}, "
                               f"this host holds {self.gen})")
        return getattr(self.obj, method)(*args)

    def ask(self, method: str, *args):
        """A call on the object this host holds now, whatever its run (for
        someone who found a named host with ``ray.get_actor``)."""
        if not self.made.wait(MADE_S):
            raise RuntimeError(f"call {method}: this host holds no object")
        return getattr(self.obj, method)(*args)

    def pid(self) -> int:
        """This host's process id (to watch it, or end it)."""
        import os

        return os.getpid()

    def drop(self) -> bool:
        self.made.clear()
        self.obj, self.gen = None, None
        gc.collect()
        return True


class _Method:
    def __init__(self, hosted: "Hosted", name: str):
        self.hosted, self.name = hosted, name

    def remote(self, *args):
        if self.name == "ready":  # built: the object's constructor has returned
            return self.hosted.built
        return self.hosted.handle.call.remote(self.hosted.gen, self.name, *args)


class Hosted:
    """A handle on one run's object in a host; picklable, so workers get
    the shards' and the clock's."""

    def __init__(self, handle, gen: int, built, key: tuple, named: bool):
        self.handle, self.gen, self.built = handle, gen, built
        self.key, self.named = key, named

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Method(self, name)

    def __getstate__(self):
        return {"handle": self.handle, "gen": self.gen, "built": None, "key": self.key,
                "named": self.named}

    def __setstate__(self, state):
        self.__dict__.update(state)


class Pool:
    """This driver's idle hosts, by shape (``key``)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.job = None
        self.idle: list[tuple[float, tuple, object]] = []  # (since, key, actor handle)
        self.lent: dict = {}  # the hosts of runs under way: id(handle) -> handle
        self.gens = itertools.count(1)

    def _same_job(self, ray) -> None:
        context = ray.get_runtime_context()
        job = (context.get_job_id(), context.get_node_id())
        if job != self.job:  # a new ray.init: the old handles are gone with their job
            self.job, self.idle, self.lent = job, [], {}

    def take(self, ray, cls, args: tuple, options: dict, name: str | None = None) -> Hosted:
        """A host of this shape (``options``: num_cpus, num_gpus,
        max_concurrency, scheduling_strategy) building ``cls(*args)``: an
        idle one, or a new one. ``name``: a new named host, never pooled."""
        key = _key(options)
        handle = None
        with self.lock:
            self._same_job(ray)
            if name is None:
                for i, (_, k, h) in enumerate(self.idle):
                    if k == key:
                        handle = self.idle.pop(i)[2]
                        break
            if handle is None and (_holds(key) or name is not None):
                # idle hosts of other shapes hold resources the new one may need (a
                # host that holds none, a shard's, needs none freed: the run's
                # workers may yet take the idle ones of their shape)
                self._kill_where(ray, lambda k: _holds(k) and (name is not None or k != key))
            gen = next(self.gens)
        if handle is None:
            handle = ray.remote(Host).options(
                **({"name": name} if name else {}), **options).remote()
        with self.lock:
            self.lent[id(handle)] = handle
        return Hosted(handle, gen, handle.build.remote(gen, cls, args), key, name is not None)

    def give_back(self, ray, hosted: list) -> None:
        """The run ended normally: its hosts drop their objects and wait in
        the pool for ``IDLE_S``; named hosts are killed."""
        keep = [h for h in hosted if not h.named]
        for h in hosted:
            if h.named:
                self.kill(ray, h)
        if not keep:
            return
        try:
            ray.get([h.handle.drop.remote() for h in keep], timeout=MADE_S)
        except Exception:  # noqa: BLE001 - a host that cannot drop is not kept
            for h in keep:
                self.kill(ray, h)
            return
        now = time.monotonic()
        with self.lock:
            self._same_job(ray)
            for h in keep:
                self.lent.pop(id(h.handle), None)
            self.idle.extend((now, h.key, h.handle) for h in keep)
        timer = threading.Timer(IDLE_S + 0.5, self.expire, args=(ray,))
        timer.daemon = True
        timer.start()

    def expire(self, ray) -> None:
        """Kill the hosts idle for ``IDLE_S`` or longer."""
        if not ray.is_initialized():
            return
        with self.lock:
            self._same_job(ray)
            old = time.monotonic() - IDLE_S
            self._kill_where(ray, lambda k: True, before=old)

    def kill(self, ray, actor) -> None:
        """Kill a host (a ``Hosted``'s) or a plain actor."""
        handle = actor.handle if isinstance(actor, Hosted) else actor
        with self.lock:
            self.lent.pop(id(handle), None)
        ray.kill(handle)

    def clear(self, ray, idle: bool = True) -> None:
        """Kill the hosts of runs still under way (a caller that gave up on
        a run training in a thread) and, with ``idle``, the idle ones."""
        with self.lock:
            self._same_job(ray)
            if idle:
                self._kill_where(ray, lambda k: True)
            lent, self.lent = list(self.lent.values()), {}
        for handle in lent:
            try:
                ray.kill(handle)
            except Exception:  # noqa: BLE001 - it is gone already
                pass

    def _kill_where(self, ray, which, before: float | None = None) -> None:
        kept = []
        for since, key, handle in self.idle:
            if which(key) and (before is None or since <= before):
                try:
                    ray.kill(handle)
                except Exception:  # noqa: BLE001 - it is gone already
                    pass
            else:
                kept.append((since, key, handle))
        self.idle = kept

    def idle_count(self) -> int:
        with self.lock:
            return len(self.idle)


def _key(options: dict) -> tuple:
    strategy = options.get("scheduling_strategy")
    where = (getattr(strategy, "node_id", None), getattr(strategy, "soft", None)) \
        if strategy is not None and not isinstance(strategy, str) else strategy
    return (options.get("num_cpus", 0), options.get("num_gpus", 0),
            options.get("max_concurrency", 1), where)


def _holds(key: tuple) -> bool:
    return bool(key[0]) or bool(key[1])


POOL = Pool()


def kill(ray, actor) -> None:
    """Kill a host (a ``Hosted``'s) or a plain actor."""
    POOL.kill(ray, actor)


def error_line(exc) -> str:
    """The line of a Ray error that names the actor's own error (Ray's text
    around it is many lines), or the whole text where none does."""
    lines = [line for line in str(exc).strip().splitlines() if "Error" in line]
    return lines[-1].strip() if lines else str(exc)


def get_or_fail(ray, refs, timeout: float, late: str, failed: str, rank: int | None = None):
    """``ray.get(refs)`` within ``timeout``, a failure said in one line:
    past ``timeout``, ``WaitTimeout`` ("``late`` within T s"); an actor's
    error, ``WorkerError`` with ``failed``, where ``{error}`` is the line of
    Ray's reason that names it (``error_line``), and the worker ``rank``
    whose call it was (None: refs of several actors)."""
    from ray.exceptions import GetTimeoutError

    try:
        return ray.get(refs, timeout=timeout)
    except GetTimeoutError as exc:
        raise WaitTimeout(f"{late} within {timeout:g} s") from exc
    except Exception as exc:  # noqa: BLE001 - an actor's error, reported in one line
        err = WorkerError(failed.format(error=error_line(exc)))
        err.worker = rank
        raise err from exc

"""Spark jobs with a timeout, all under one job group per run.

``sc.runJob`` blocks with no timeout of its own, so every job is run by a
driver thread (which joins the run's job group: Spark's job groups are
per thread) and waited for with the run's timeout. ``cancel()`` cancels
the whole group: the engine calls it when a wait times out, when a run
fails or stops early, and always before it returns, so no Spark job
outlives its run. A group whose jobs have all finished is left alone
(Spark would log a warning for it).
"""
from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

from ...errors import WaitTimeout, WorkerError


# Up to this many bytes, parameters travel in the task's closure (shipped
# with every task anyway) instead of a broadcast variable, whose creation
# and first read cost a round trip to Spark's block manager: ~0.15 s a job
# on a loaded 2-core machine. PySpark sends a closure as it is up to
# spark.broadcast.UDFCompressionThreshold (1 MiB) and broadcasts it itself
# above, so values up to that (less room for the rest of the closure) ride
# free: a torch MLP of 85k float32 parameters (340 KB) ran its sync steps
# 1.5x faster inline than broadcast. Larger values are broadcast, once per
# executor.
INLINE_MAX_BYTES = (1 << 20) - (1 << 16)


class Inline:
    """A small value that rides in the closure; reads like a broadcast."""

    def __init__(self, value):
        self.value = value

    def destroy(self, blocking: bool = False) -> None:
        pass


def share(sc, value, nbytes: int):
    """``value`` for the tasks of one job: a broadcast variable, or inline
    when it is at most ``INLINE_MAX_BYTES``. Call ``destroy`` after the job."""
    return Inline(value) if nbytes <= INLINE_MAX_BYTES else sc.broadcast(value)


def every_slot_at_once(sc, workers: int) -> bool:
    """Whether the executors hold a slot for each of ``workers`` tasks at
    once (a barrier stage's ranks, or each worker's long task), with no
    dynamic allocation to take one away."""
    return (int(sc.defaultParallelism) >= workers
            and sc.getConf().get("spark.dynamicAllocation.enabled", "false") != "true")


def short_error(exc: BaseException) -> str:
    """The line of a Spark/Py4J error that says what went wrong."""
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for marker in ("Error:", "Exception:"):
        found = [ln for ln in lines if marker in ln and not ln.startswith("at ")]
        if found:
            return found[-1][:500]
    return (lines[-1] if lines else type(exc).__name__)[:500]


class Jobs:
    def __init__(self, sc, timeout: float, label: str):
        self.sc = sc
        self.timeout = timeout
        self.group = f"monsoon-{label}-{uuid.uuid4().hex[:8]}"
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="monsoon-spark",
                                        initializer=self.join_group)

    def join_group(self, worker: int | None = None) -> None:
        """Make the calling thread's jobs part of this run's group (or of
        worker ``worker``'s own group within it, which ``cancel(worker)``
        cancels alone)."""
        self.sc.setJobGroup(self.group_of(worker), "monsoon training run",
                            interruptOnCancel=True)

    def group_of(self, worker: int | None) -> str:
        return self.group if worker is None else f"{self.group}-worker-{worker}"

    def run(self, rdd, func, partitions=None, what: str = "a Spark job"):
        """``sc.runJob(rdd, func, partitions)``, waited for at most ``timeout``."""
        future = self._pool.submit(self.sc.runJob, rdd, func, partitions)
        try:
            return future.result(timeout=self.timeout)
        except FutureTimeout:
            self.cancel()
            raise WaitTimeout(f"waited {self.timeout:g} s for {what}; an executor is stuck or "
                              "lost (raise --timeout if a step is genuinely that slow)") from None
        except Exception as exc:  # noqa: BLE001 - Spark gave up after its retries
            self.cancel()
            raise WorkerError(f"{what} failed after Spark's retries: {short_error(exc)}") from exc

    def submit(self, rdd, func, partitions=None):
        """``sc.runJob`` in the run's job thread, not waited for: a Future
        (the caller waits, with its own timeouts, and cancels)."""
        return self._pool.submit(self.sc.runJob, rdd, func, partitions)

    def cancel(self, worker: int | None = None, workers: int = 0) -> None:
        """Cancel worker ``worker``'s jobs, or (None) every job of the run,
        the ``workers`` workers' own groups included."""
        groups = [self.group_of(worker)] if worker is not None else \
            [self.group] + [self.group_of(k) for k in range(workers)]
        for group in groups:
            try:
                if self._unfinished(group):
                    self.sc.cancelJobGroup(group)
            except Exception:  # noqa: BLE001 - the context is already stopped
                pass

    def _unfinished(self, group: str) -> bool:
        """Whether ``group`` may hold a job Spark has not finished. Spark logs
        a warning for each group cancelled with no job left, which every
        run's end would print; a job Spark no longer describes is taken as
        unfinished, so it is cancelled all the same."""
        tracker = self.sc.statusTracker()
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            if info is None or info.status not in ("SUCCEEDED", "FAILED"):
                return True
        return False

    def close(self, workers: int = 0) -> None:
        self.cancel(workers=workers)
        self._pool.shutdown(wait=False, cancel_futures=True)

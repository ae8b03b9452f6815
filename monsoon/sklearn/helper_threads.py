"""The threads that run their share of an epoch beside the fit's own thread
(a probe's or the threads' part, or the last epoch's log-loss: ``plain_sgd``).

``threading.Thread.start`` returns only once the new thread runs; on a VM
whose other vCPU has been idle, that wait is the vCPU's wake-up, paid by
the fit's own thread. So these threads are started with
``_thread.start_new_thread``, which returns at once, as the first probe
begins: they wake while its first half runs on one thread. Each waits on
its own queue for a call; the fit's thread hands one to each and goes on
with its own share, and a helper joins when it is awake
(``kernel.sgd_run`` starts its judge's clock once all are in). A fit that
never probes, nor shares its log-loss, starts none. ``close`` ends them; a
helper that is idle when the interpreter exits is simply not joined, as a
daemon thread is.

Invariant: ``wait`` returns only once every handed call has returned, and
re-raises the first error any of them raised.
"""
from __future__ import annotations

import _thread
import queue
import threading

WAIT_S = 60.0  # a share is a few chunks of examples; this long means a helper is gone


class HelperThreads:
    def __init__(self, count: int):
        self._inboxes = [queue.SimpleQueue() for _ in range(count)]
        self._done = queue.SimpleQueue()
        self._pending = 0
        for inbox in self._inboxes:
            _thread.start_new_thread(self._serve, (inbox,))

    def _serve(self, inbox) -> None:
        while True:
            item = inbox.get()
            if item is None:
                return
            call, tracked = item
            try:
                call()
                outcome = None
            except BaseException as exc:  # noqa: BLE001 - re-raised by ``wait``
                outcome = exc
            if tracked:
                self._done.put(outcome)

    def start(self, calls) -> None:
        """Hand ``calls`` (at most one a helper) to the helpers."""
        for inbox, call in zip(self._inboxes, calls):
            inbox.put((call, True))
            self._pending += 1

    def offer(self, claimable: "Claimable") -> None:
        """Hand ``claimable`` to the first helper, untracked: ``wait`` does
        not wait for it (its own ``result`` does)."""
        self._inboxes[0].put((claimable, False))

    def wait(self) -> None:
        """Until every handed call has returned."""
        error = None
        while self._pending:
            try:
                outcome = self._done.get(timeout=WAIT_S)
            except queue.Empty:
                raise RuntimeError(f"a helper thread gave no answer in {WAIT_S:g} s") from None
            self._pending -= 1
            error = error or outcome
        if error is not None:
            raise error

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)


class Claimable:
    """A call run once, by a helper or by the thread that wants its result,
    whichever claims it first (``result``). Where the helper's core is busy
    (OpenBLAS's threads spin there after a large BLAS call), the fit's
    thread does the work itself instead of waiting for a time slice.

    Invariant: the call runs exactly once; ``result`` returns its value, or
    re-raises its error, once it has run."""

    def __init__(self, call):
        self._call = call
        self._claim = threading.Lock()
        self._ran = threading.Event()
        self._value = self._error = None

    def __call__(self) -> None:  # on a helper
        if self._claim.acquire(blocking=False):
            try:
                self._value = self._call()
            except BaseException as exc:  # noqa: BLE001 - re-raised by ``result``
                self._error = exc
            finally:
                self._ran.set()

    def result(self):
        if self._claim.acquire(blocking=False):  # no helper got to it: run it here
            return self._call()
        if not self._ran.wait(WAIT_S):
            raise RuntimeError(f"a helper thread gave no answer in {WAIT_S:g} s")
        if self._error is not None:
            raise self._error
        return self._value

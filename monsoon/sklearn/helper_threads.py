"""The threads that run their share of an epoch beside the fit's own thread
(a probe's or the threads' part, or the last epoch's log-loss: ``plain_sgd``).

``threading.Thread.start`` returns only once the new thread runs. On a VM
whose other vCPU has been idle a while, that wait is the vCPU's wake-up:
53 us after 10 ms idle, 321 us after 50 ms (a 2-vCPU host, 2026-11). A
thread pool starts its thread at the first task, which for a fit is its
first probe, after at least 50 ms of epochs on one thread: the fit's own
thread then waited ~0.4 ms in every fit that probed, half of what the
probe cost where the threads lose.

So these threads are started with ``_thread.start_new_thread``, which
returns at once, as the first probe begins: they wake while its first half
runs on one thread. Each waits on its own queue for a call; the fit's
thread hands one to each and goes on with its own share, and a helper
joins when it is awake (``kernel.sgd_run`` starts its judge's clock once
all are in). A fit that never probes, nor shares its log-loss, starts
none: with them started at the fit's beginning for nothing, fits of
16-33 ms that never probed were 1-2% slower.
``close`` ends them; a helper that is idle when the interpreter exits is
simply not joined, as a daemon thread is.

Invariant: ``wait`` returns only once every handed call has returned, and
re-raises the first error any of them raised.
"""
from __future__ import annotations

import _thread
import queue

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
            call = inbox.get()
            if call is None:
                return
            try:
                call()
                self._done.put(None)
            except BaseException as exc:  # noqa: BLE001 - re-raised by ``wait``
                self._done.put(exc)

    def start(self, calls) -> None:
        """Hand ``calls`` (at most one a helper) to the helpers."""
        for inbox, call in zip(self._inboxes, calls):
            inbox.put(call)
            self._pending += 1

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

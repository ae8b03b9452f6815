"""How workers report to the monitor, and how the monitor sleeps.

Every worker sends exactly one message when it stops: ``("done" | "aborted"
| "failed", rank, payload)``.

- Processes (``PipeInbox``): one pipe per worker. The monitor blocks in
  ``multiprocessing.connection.wait`` on the pipes and on the processes'
  sentinels of the workers still running, so it wakes at once for a
  message or a death, and otherwise sleeps for as long as it is told (when
  nothing is to be recorded, a second at a time). A monitor that wakes
  just to look preempts a worker on a machine whose cores the workers
  hold, and its peer waits at the barrier (``bench/seed_overhead.py``).
- Threads (``QueueInbox``): one queue; a thread cannot die without its
  ``finally`` sending the message.

A large message (local SGD's private parameters) blocks its sender until
the monitor reads it, which it does as soon as the pipe is readable.
"""
from __future__ import annotations

import queue
from multiprocessing.connection import wait


class Outbox:
    """A worker process's end of its pipe."""

    def __init__(self, conn):
        self.conn = conn

    def put(self, message) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the monitor is gone: nobody is left to tell

    def close(self) -> None:
        self.conn.close()


class PipeInbox:
    def __init__(self, ctx, workers: int):
        pipes = [ctx.Pipe(duplex=False) for _ in range(workers)]
        self.receivers = [r for r, _ in pipes]
        self.senders = [s for _, s in pipes]
        self.sentinels: list = [None] * workers

    def started(self, rank: int, process) -> None:
        """The child has its copy of the sender: close ours, so that its
        death reads as end-of-file rather than as silence."""
        self.sentinels[rank] = process.sentinel
        self.senders[rank].close()

    def receive(self, timeout: float, finished: set, wake=None) -> list:
        """The messages that arrive within ``timeout`` seconds (returning
        early on the first message or death, or when ``wake``, a socket a
        signal handler writes to, is readable) from workers not ``finished``."""
        watched = {}
        for rank, conn in enumerate(self.receivers):
            if rank not in finished:
                watched[conn] = rank
                if self.sentinels[rank] is not None:
                    watched[self.sentinels[rank]] = rank
        if not watched:
            return []
        messages = []
        for ready in wait(list(watched) + ([wake] if wake is not None else []), timeout):
            if ready is wake:
                try:
                    wake.recv(64)
                except OSError:
                    pass
                continue
            if ready is self.receivers[watched[ready]]:
                try:
                    messages.append(ready.recv())
                except (EOFError, OSError):
                    pass  # died mid-message: the sentinel and exit code tell
        return messages

    def close(self) -> None:
        for conn in self.receivers + self.senders:
            conn.close()


class QueueInbox:
    def __init__(self):
        self.queue = queue.Queue()

    def outbox(self, rank: int):
        return self.queue

    def receive(self, timeout: float, finished: set, wake=None) -> list:
        messages = []
        try:
            messages.append(self.queue.get(timeout=timeout) if timeout > 0
                            else self.queue.get_nowait())
            while True:
                messages.append(self.queue.get_nowait())
        except queue.Empty:
            pass
        return messages

    def close(self) -> None:
        pass

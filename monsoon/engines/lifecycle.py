"""Life and death of a run's processes: no worker outlives its monitor, and
SIGTERM or SIGINT stop a run cleanly instead of killing it.

Workers (``worker_started``, first thing in every worker process):

- ``PR_SET_PDEATHSIG`` (Linux, through ``prctl`` in libc): the kernel sends
  the worker SIGKILL the moment its parent dies, however it dies (SIGKILL,
  the OOM killer). The parent is the monitor, or the fork server the
  monitor started, which exits as soon as the monitor's process ends. The
  parent may die before the call: the worker then sees a changed parent
  pid and exits at once.
- elsewhere, and as a second guard, ``parent_alive()`` is checked in every
  wait of a worker (``waiting.wait_until``), so a worker stuck at a barrier
  notices within one check (about a millisecond when it sleeps).
- SIGINT is ignored: Ctrl-C reaches the whole process group, and it is the
  monitor's to handle (it stops the workers itself, at a step boundary).

The monitor (``StopSignals``, around a run, main thread only): the first
SIGTERM or SIGINT sets ``requested`` (and wakes the monitor through a
wake-up pipe); the engine then stops its workers, writes a final checkpoint
and returns what it has, and ``monsoon.train`` writes the run folder with
status "interrupted" before raising ``Interrupted``. A second signal raises
``Interrupted`` at once.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading

from ..errors import Interrupted

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_parent_pid = None


def set_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies
    (Linux). Returns whether the request was made."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def name_process(name: str) -> None:
    """Show ``name`` (at most 15 bytes) for this process in ps, top and
    ``/proc/PID/comm`` (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def worker_started(monitor_pid: int, name: str | None = None) -> None:
    """Called first in a worker process: die with the parent, leave Ctrl-C
    to the monitor. The parent is the monitor (spawn) or the fork server
    it started (``processes.start_context``), which exits when the
    monitor's process ends: either way the worker dies with the monitor."""
    global _parent_pid
    _parent_pid = os.getppid()
    set_death_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if name:
        name_process(name)
    if _parent_pid != monitor_pid and not _alive(monitor_pid):
        os._exit(1)  # the monitor died before the request
    if os.getppid() != _parent_pid:  # the parent died before the request
        os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parent_alive() -> bool:
    """False in a worker process whose monitor has died (always True in the
    monitor's own process and threads)."""
    return _parent_pid is None or os.getppid() == _parent_pid


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignals:
    """SIGTERM/SIGINT handlers for the duration of a run (a no-op outside the
    main thread, where Python cannot install handlers, and for engines that
    do not watch for them: ``enabled=False`` leaves the defaults)."""

    active: "StopSignals | None" = None

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.signum = None
        self._saved = {}
        self._wakeup = None
        self._saved_fd = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def fileno(self) -> int:
        """Readable once a signal has arrived (for ``connection.wait``)."""
        return self._wakeup[0].fileno()

    def waitable(self):
        return self._wakeup[0] if self._wakeup else None

    def _handle(self, signum, frame):
        if self.signum is not None:  # a second signal: stop now
            raise Interrupted(f"{signal_name(signum)} again: stopped at once, without a "
                              "checkpoint", signum)
        self.signum = signum

    def __enter__(self):
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            return self
        r, w = socket.socketpair()
        r.setblocking(False)
        w.setblocking(False)
        self._wakeup = (r, w)
        try:
            self._saved_fd = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        except ValueError:
            self._saved_fd = None
        for sig in STOP_SIGNALS:
            self._saved[sig] = signal.signal(sig, self._handle)
        StopSignals.active = self
        return self

    def __exit__(self, *exc):
        StopSignals.active = None
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()
        if self._wakeup is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._saved_fd if self._saved_fd is not None else -1)
            for s in self._wakeup:
                s.close()
            self._wakeup = None
        return False


def stop_requested() -> int | None:
    """The signal that asked the current run to stop, if one did."""
    active = StopSignals.active
    return active.signum if active is not None else None

"""Life and death of a run's processes: none outlives its monitor, and
SIGTERM or SIGINT stop a run cleanly instead of killing it.

Workers and pipeline stages (``worker_started``, first thing in each):

- ``PR_SET_PDEATHSIG`` (Linux ``prctl``): the kernel sends SIGKILL the
  moment the parent dies, however it dies; a parent that died before the
  request shows as a changed parent pid, and the worker exits at once.
- A forked worker's parent is the fork server (``processes.start_context``),
  which multiprocessing keeps alive while any of its children holds the
  pipe that tells it its clients are gone: after ``kill -9`` of the monitor
  the workers and the fork server kept each other alive. So each worker
  also watches a pipe only the monitor holds (``watch_monitor``: the data
  pipe it was started through): a thread blocked on it reads end-of-file
  when the monitor's process ends, already if it ended first, and the
  worker sends itself SIGKILL. No polling, no timeout.
- The fork server dies with the monitor too (``tie_fork_server``):
  ``PR_SET_PDEATHSIG`` where the main thread started it (the signal follows
  the starting thread), and a thread blocked on a pidfd of the monitor.
  The resource tracker, which unlinks what a killed monitor left in
  /dev/shm, exits once every process holding its pipe has.
  The fork server (and, of its own, the resource tracker) starts with
  SIGINT and SIGTERM blocked, and ignores them (``tie_fork_server``).
- ``parent_alive()`` is checked in every wait of a worker
  (``waiting.wait_until``), a further guard where there is no ``prctl``.
- SIGINT and SIGTERM are ignored: Ctrl-C, ``timeout`` and a batch
  scheduler signal the whole process group, and it is the monitor's to
  handle (it stops the workers itself, at a step boundary).

Torch ranks that the monitor starts as torchrun's agent (``torchrun/
launch.py``) are forked from that fork server, calling ``worker_started``.

The monitor (``StopSignals``, around a run, main thread only): the first
SIGTERM or SIGINT sets ``requested`` (and wakes the monitor through a
wake-up pipe); the engine then stops its workers, writes a final checkpoint
and returns what it has, and ``monsoon.train`` writes the run folder with
status "interrupted" before raising ``Interrupted``. A repeat within
``REPEAT_S`` is that stop; a second signal later raises ``Interrupted`` at
once. ``reclaim_signals`` takes them back from a library (Ray, Spark);
``on_stop`` hands the first on.
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import select
import signal
import socket
import sys
import threading
import time

from ..errors import Interrupted

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# One stop often arrives more than once, milliseconds apart: GNU ``timeout``
# (and a batch scheduler, a container runtime) signals the command, then its
# whole process group, the command again; under ``timeout`` a Ctrl-C comes
# from the terminal and again from ``timeout``. A stop signal this soon after
# the first is that stop again, not a second one (which stops at once, without
# a checkpoint): a person's deliberate second Ctrl-C comes later.
REPEAT_S = 1.0

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


def worker_started(monitor_pid: int | None = None, name: str | None = None,
                   ignore_sigterm: bool = True) -> None:
    """Called first in a worker process: die with the monitor, whoever the
    parent is; leave Ctrl-C, and SIGTERM unless ``ignore_sigterm`` is
    False, to the monitor. ``monitor_pid`` defaults to the process that
    created this one's ``Process`` object."""
    global _parent_pid
    _parent_pid = os.getppid()
    set_death_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A SIGTERM to the process group (``timeout``, a batch scheduler) reaches
    # the workers too: dead of it, a sync worker would take its trained
    # replica with it before the monitor stopped the run at a step boundary.
    # A torch rank takes the default back: its agent stops ranks by SIGTERM.
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else signal.SIG_DFL)
    if name:
        name_process(name)
    parent = multiprocessing.parent_process()
    if monitor_pid is None and parent is not None:
        monitor_pid = parent.pid
    if monitor_pid is not None and _parent_pid != monitor_pid and not alive(monitor_pid):
        os._exit(1)  # the monitor died before the request
    if os.getppid() != _parent_pid:  # the parent died before the request
        os._exit(1)
    if parent is not None and parent.sentinel is not None:
        watch_monitor(parent.sentinel)


def watch_monitor(fd: int) -> None:
    """Send this process SIGKILL once ``fd``, the read end of a pipe whose
    write end only the monitor holds, reads end-of-file: the monitor's
    process has ended, however it ended (the pipe carries no data after
    start-up)."""
    _die_when_ready(os.dup(fd), pipe=True)  # its own copy: closing ``fd`` cannot wake it


def _die_when_ready(fd: int, pipe: bool) -> None:
    """A daemon thread blocks on ``fd`` (no polling, no timeout) and sends
    this process SIGKILL when it is ready: a pipe at end-of-file, or a
    pidfd whose process has ended."""
    def watch():
        try:
            while True:
                select.select([fd], [], [])
                if not pipe or not os.read(fd, 4096):
                    break
        except OSError:
            return  # not something this thread can wait on: PR_SET_PDEATHSIG still holds
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="monsoon-monitor-watch", daemon=True).start()


FORK_SERVER_ENV = "MONSOON_FORK_SERVER_OF"


def fork_server_env(main_thread: bool) -> str:
    """What the monitor puts in ``FORK_SERVER_ENV`` while it starts its fork
    server: its pid, and whether the starting thread is the main thread."""
    return f"{os.getpid()},{int(main_thread)}"


def tie_fork_server() -> None:
    """In the fork server (``monitor.fork_server``, imported before it
    forks anything): die with the monitor that started it, when the
    monitor asked for it through ``FORK_SERVER_ENV``. ``PR_SET_PDEATHSIG``
    where the monitor's main thread started it (the signal follows the
    starting thread, and the main thread lives as long as the process),
    and a thread waiting on a pidfd of the monitor (Linux 5.3) either way."""
    value = os.environ.pop(FORK_SERVER_ENV, None)
    if value is None:
        return
    monitor, main_thread = (int(v) for v in value.split(","))
    if monitor == os.getpid():  # the monitor itself: not a fork server
        return
    # Ctrl-C reaches the whole process group; multiprocessing's fork server
    # ignores it only once it has imported its preload (torch: seconds), and
    # would die of it mid-import, with a traceback. It is the monitor's. The
    # monitor started this process with SIGINT and SIGTERM blocked
    # (``processes.start_context``): ignored now, they may be unblocked.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM to the process group likewise: dead of it, the fork server would
    # take every worker it forked with it (their PR_SET_PDEATHSIG) before the
    # monitor stopped them at a step boundary. Workers and stages keep
    # ignoring it; a torch rank takes the default back (``worker_started``).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))
    if main_thread:
        set_death_signal()
    try:
        pidfd = os.pidfd_open(monitor)
    except (AttributeError, OSError):  # not Linux, or the monitor is gone already
        pidfd = None
    if os.getppid() != monitor:
        os._exit(1)  # the monitor died before the requests
    if pidfd is not None:
        _die_when_ready(pidfd, pipe=False)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts)."""
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


def stop_reason(signum: int) -> str:
    """Why a run stopped on the stop signal ``signum``, for its result."""
    return f"interrupted by {signal_name(signum)}"


class StopSignals:
    """SIGTERM/SIGINT handlers for the duration of a run (a no-op outside the
    main thread, where Python cannot install handlers, and for engines that
    do not watch for them: ``enabled=False`` leaves the defaults). One may
    be nested in another: it hands the signals back to it at its end, and a
    repeat of the outer one's stop is not its first."""

    active: "StopSignals | None" = None
    first_at = None  # when the current stop's first signal came (time.monotonic)

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.signum = None
        self._outer = None  # the StopSignals this one is nested in, if any
        self._saved = {}
        self._wakeup = None
        self._saved_fd = None
        self._callbacks = []  # ``on_stop``'s, called with the first signal

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def waitable(self):
        """Readable once a signal has arrived (for ``connection.wait``)."""
        return self._wakeup[0] if self._wakeup else None

    def _handle(self, signum, frame):
        now = time.monotonic()
        first = StopSignals.first_at
        if first is not None and now - first < REPEAT_S:
            return  # the stop under way, delivered again (``REPEAT_S``)
        if self.signum is not None:  # a second signal: stop now
            raise Interrupted(f"{signal_name(signum)} again: stopped at once, without a "
                              "checkpoint", signum)
        StopSignals.first_at = now
        self.signum = signum
        for callback in list(self._callbacks):
            callback(signum)

    def reclaim(self) -> None:
        """Install this run's handlers again, over those a library installed
        since ``__enter__`` (``reclaim_signals``); what the run restores at
        its end stays what was there before it."""
        for sig in self._saved:
            signal.signal(sig, self._handle)

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
        self._outer = StopSignals.active
        if self._outer is None:  # a stop of an earlier run is not this one's
            StopSignals.first_at = None
        StopSignals.active = self
        return self

    def __exit__(self, *exc):
        if StopSignals.active is self:  # a nested one hands back to the one around it
            StopSignals.active, self._outer = self._outer, None
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


@contextlib.contextmanager
def sigterm_deferred():
    """Hold off a SIGTERM that would kill this process (its default action)
    while a write that must finish runs: a handler notes it, and it is
    raised again, with its default action, when the block ends. torch's
    agent SIGTERMs every rank as soon as one is lost, and rank 0's last
    checkpoint must not be cut short (it waits 30 s before SIGKILL). A
    handler set by someone else (``StopSignals``) is left as it is."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    held = []
    signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if held:
            signal.raise_signal(signal.SIGTERM)


def stop_requested() -> int | None:
    """The signal that asked the current run to stop, if one did."""
    active = StopSignals.active
    return active.signum if active is not None else None


def reclaim_signals() -> None:
    """Put the current run's SIGTERM/SIGINT handlers back (``StopSignals.
    reclaim``), after a library installed its own: ``ray.init`` installs
    Ray's C++ handler for SIGTERM (a stack dump, then abort), a new
    ``SparkContext`` PySpark's for SIGINT (cancel every job, raise
    KeyboardInterrupt). Nothing outside a run."""
    active = StopSignals.active
    if active is not None:
        active.reclaim()


@contextlib.contextmanager
def on_stop(callback):
    """For the duration of the block, ``callback(signum)`` runs (in the main
    thread, from the handler) with the current run's first stop signal, or
    at once if it has come already: for a party that cannot see this
    process's flag (the torch engine's ranks, through the job folder).
    Outside a run, nothing."""
    active = StopSignals.active  # set only where the run's handlers are installed
    if active is None:
        yield
        return
    active._callbacks.append(callback)
    try:
        if active.signum is not None:
            callback(active.signum)
        yield
    finally:
        active._callbacks.remove(callback)

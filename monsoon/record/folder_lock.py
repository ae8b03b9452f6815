"""One run at a time in a folder: a run holds its folder, for its whole life,
with an OS lock (``fcntl.flock``, exclusive, not waiting) on
``FOLDER/.monsoon.lock``, which holds its pid and command for the message
another run gets. ``api.train`` takes it (on the process that writes the
run folder: under torchrun, rank 0) before anything in the folder is
removed or written, and gives it back once the folder is written whole
(finished, failed, interrupted or refused); ``compare`` holds its own
folder the same way (``OUT/.monsoon.lock``; each strategy's run holds
``OUT/STRATEGY``). A second run on a held folder is refused in one line
(``ConfigError``: the command line exits 2), nothing in the folder touched.

The OS frees the lock with the process, ``kill -9`` too: a later run then
takes the folder and clears the killed run's leftovers, the lock file
included. A process forked while the lock is held closes its copy at once
(``os.register_at_fork``), so a worker that outlives a killed run never
holds its folder, and never lets it go for the run. A lock file is removed
while held; a run that opened it just before checks, once it holds the
lock, that the file is still the one at the path, and opens it again if
not.

Where ``flock`` is not available (not POSIX, or a file system that refuses
locks) a run carries on without a lock, as before: two runs on one folder
are then not told apart.
"""
from __future__ import annotations

import errno
import os
import shlex
import sys
from pathlib import Path

from ..errors import ConfigError

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None

LOCK_NAME = ".monsoon.lock"
_HELD: dict[int, int] = {}  # the lock's file descriptor -> the pid that took it
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def _forked() -> None:
    """In a forked child: its copies of the parent's locks closed (the
    parent's lock stays; closing a copy does not release it)."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _command() -> str:
    """This process's command, as the refused run's message shows it."""
    argv = list(sys.argv) or ["python"]
    first = Path(argv[0])
    name = f"python -m {first.parent.name}" if first.name == "__main__.py" else first.name
    text = " ".join([name, shlex.join(argv[1:])]).strip()
    return text if len(text) <= 200 else text[:197] + "..."


def _owner(path: Path) -> str:
    """Who holds the lock at ``path``: "pid N: COMMAND", as it wrote."""
    try:
        pid, _, command = path.read_text().partition("\n")
    except (OSError, UnicodeDecodeError):
        return "its pid unknown"
    pid, command = pid.strip(), command.strip()
    if not pid.isdigit():
        return "its pid unknown"
    return f"pid {pid}: {command}" if command else f"pid {pid}"


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


class FolderLock:
    """``folder`` held by this process until ``release`` (which may be
    called more than once); ``folder`` None holds nothing. ``what`` names
    the holder in the message another run gets ("run", "compare")."""

    def __init__(self, folder: Path | None, what: str = "run"):
        self.path = None if folder is None else Path(folder) / LOCK_NAME
        self.fd = None
        if self.path is not None and fcntl is not None:
            self.fd = self._take(what)

    def _take(self, what: str) -> int | None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ConfigError(
                    f"the folder {self.path.parent} is in use by another {what} "
                    f"({_owner(self.path)}); give another --out, or wait for it to end") from None
            except OSError as exc:
                os.close(fd)
                if exc.errno in _NO_LOCKS:  # a file system without locks: as before
                    return None
                raise
            if _same_file(fd, self.path):
                break
            os.close(fd)  # its owner removed it as we opened it: the one there now
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n{_command()}\n".encode())
        _HELD[fd] = os.getpid()
        return fd

    def release(self) -> None:
        """The lock file removed (while still held, so no run takes the
        removed one) and the lock given back; nothing in a forked child."""
        fd, self.fd = self.fd, None
        if fd is None or _HELD.get(fd) != os.getpid():
            return
        del _HELD[fd]
        try:
            if _same_file(fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)

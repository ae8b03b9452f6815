"""Named NumPy arrays in one block of shared memory.

The block is a file on a RAM-backed file system (``/dev/shm`` where there is
one) mapped by every process; it pickles as its path and layout, so a
spawned worker maps the same memory. This avoids
``multiprocessing.shared_memory``, whose resource tracker on Python < 3.13
unlinks or warns about blocks that children attach to.

A block in /dev/shm is registered with the creating process's resource
tracker (``multiprocessing.resource_tracker``) until the creator unlinks
it, which it does as soon as every worker has mapped it: a creator killed
before then (``kill -9`` during start-up) leaves the file to the tracker,
which removes it once every process holding the tracker's pipe has ended.

With ``in_process=True`` the arrays are ordinary private arrays, for
threads and the inline (serial) runner.
"""
from __future__ import annotations

import mmap
import os
import platform
import tempfile

import numpy as np

# x86 keeps stores in order (TSO): a counter seen raised implies the writes
# made before it are visible. Weaker CPUs (ARM) need a fence (a lock) around
# such a counter; what meets through shared memory checks this.
NEEDS_FENCE = platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686")

_ALIGN = 64  # one cache line: no two arrays share a line


def shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _track(path: str, register: bool) -> None:
    """(Un)register a file in /dev/shm with this process's resource tracker,
    as the POSIX shared-memory object it is (the tracker shm_unlinks it)."""
    if os.path.dirname(path) != "/dev/shm":
        return  # a temporary file elsewhere is not a POSIX shared-memory object
    from multiprocessing import resource_tracker

    name = "/" + os.path.basename(path)
    (resource_tracker.register if register else resource_tracker.unregister)(name,
                                                                             "shared_memory")


class SharedArrays:
    def __init__(self, layout: dict[str, tuple[tuple[int, ...], str]], in_process: bool = False):
        self.layout = {k: (tuple(shape), str(np.dtype(dt))) for k, (shape, dt) in layout.items()}
        self.path = None
        self._map = None
        self._owner = True
        if in_process:
            self.arrays = {k: np.zeros(shape, dtype=dt) for k, (shape, dt) in self.layout.items()}
            return
        offsets, size = self._offsets()
        fd, self.path = tempfile.mkstemp(prefix="monsoon-", dir=shm_dir())
        _track(self.path, True)
        try:
            os.ftruncate(fd, max(size, 1))
            self._map = mmap.mmap(fd, max(size, 1))
        finally:
            os.close(fd)
        self.arrays = self._views(offsets)

    def _offsets(self):
        offsets, pos = {}, 0
        for k, (shape, dt) in self.layout.items():
            offsets[k] = pos
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
            pos += -(-nbytes // _ALIGN) * _ALIGN
        return offsets, pos

    def _views(self, offsets):
        return {k: np.frombuffer(self._map, dtype=dt, count=int(np.prod(shape, dtype=np.int64)),
                                 offset=offsets[k]).reshape(shape)
                for k, (shape, dt) in self.layout.items()}

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def __getstate__(self):
        if self.path is None:
            raise TypeError("in-process arrays cannot be sent to another process")
        return {"layout": self.layout, "path": self.path}

    def __setstate__(self, state):
        self.layout = state["layout"]
        self.path = state["path"]
        self._owner = False
        with open(self.path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        self.arrays = self._views(self._offsets()[0])

    def unlink(self) -> None:
        """Remove the file now (the creator, once every worker has mapped
        it): the kernel frees the memory with the last mapping, so nothing
        is left in /dev/shm however the processes end."""
        if self._owner and self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            _track(self.path, False)
            self.path = None

    def close(self) -> None:
        """Unmap; the creating process also removes the file."""
        self.arrays = {}
        self.unlink()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a view is still alive somewhere; the OS unmaps at exit
            self._map = None

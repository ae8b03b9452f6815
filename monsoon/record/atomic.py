"""Files written whole or not at all: to a temporary name, synced, then
renamed into place (a reader never sees a half-written file). The
temporary name is the writing process's own, so that several processes may
write one file (the last rename wins); a write that fails removes it."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Callable


def atomic_write(path: Path, data: str | bytes | Callable[[IO[bytes]], None],
                 durable: bool = True) -> None:
    """Write ``data`` (text, bytes, or a function that writes to the open
    binary file: a pickle streamed, never held whole in memory) to ``path``.
    ``durable`` False: not synced to the disk, for a file that only
    processes of this run read, while it runs (a crash leaves nothing kept)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w" if isinstance(data, str) else "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise

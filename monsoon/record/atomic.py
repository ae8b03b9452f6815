"""Files written whole or not at all: to a temporary name, synced, then
renamed into place (a reader never sees a half-written file). The
temporary name is the writing process's own, so that several processes may
write one file (the last rename wins)."""
from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: str | bytes, durable: bool = True) -> None:
    """``durable`` False: not synced to the disk, for a file that only
    processes of this run read, while it runs (a crash leaves nothing kept)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)

"""Files written whole or not at all: to a temporary name, synced, then
renamed into place (a reader never sees a half-written file)."""
from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: str | bytes) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

"""Starting worker processes on this machine: what every engine that
spawns them shares (the local engine's workers, its pipeline's stages).

- ``torch_threads_per_worker``: workers x threads <= cores
  (oversubscription is a known 30x slowdown);
- ``blas_threads``: the same share for the BLAS a spawned child loads;
- ``main_module_hidden``: a spawned child does not re-run the parent's
  ``__main__`` script unless its payload needs it.
"""
from __future__ import annotations

import contextlib
import os
import sys


def torch_threads_per_worker(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


@contextlib.contextmanager
def main_module_hidden(needed: bool):
    """Spawned children re-run the parent's ``__main__`` script unless it is
    hidden; a script that calls ``monsoon.train`` without an
    ``if __name__ == "__main__":`` guard would then start workers from its
    workers. Workers need ``__main__`` only when the payload refers to
    something defined there (a user's own module class), so hide it otherwise."""
    main = sys.modules.get("__main__")
    if needed or main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)


@contextlib.contextmanager
def blas_threads(threads: int):
    """Spawned workers read these when NumPy loads its BLAS: give each the
    same share of the cores as its torch threads (the parent's are kept)."""
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update({k: str(threads) for k in names})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

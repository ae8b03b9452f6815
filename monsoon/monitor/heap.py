"""Keep a worker's freed memory for its next step (glibc ``mallopt``).

A training step allocates and frees the same large buffers every time: a
small CNN's activations for 64 examples are several blocks of 0.5-2.5 MB.
glibc serves a block above ``M_MMAP_THRESHOLD`` (128 KiB at start) with a
fresh ``mmap`` and gives it back with ``munmap``, and it trims the top of the
heap back to the system above ``M_TRIM_THRESHOLD`` (also small). Both
thresholds only rise after a large mmapped block is freed. A worker that
gets its data through shared memory never frees one early, so it pays the
kernel for every page of every activation, every step.

The page faults show on a small CNN's steps (bench/sync_sweep.py's
cnn-b128): a torchrun rank, whose dataset arrived pickled and was freed,
faulted rarely and stepped faster than local workers before this module.

``keep_freed_memory()`` is called once at the start of each worker process
that monsoon starts (never in the user's own process). It sets the mmap
threshold to glibc's own maximum (32 MiB on 64-bit) and the trim threshold
to 1 GiB, so a worker keeps at most its peak heap resident, which it needs
again at its next step anyway. Elsewhere (macOS, musl) it does nothing.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds in this process. Returns
    whether both were set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

"""Bounded waiting: every wait in monsoon has a timeout."""
from __future__ import annotations

import os
import time

from ..errors import WaitTimeout
from .lifecycle import parent_alive


class Aborted(Exception):
    """The engine asked this worker to stop (a peer failed, or the run ended)."""


SPIN_S = 0.05  # spin this long before sleeping
# Between processes, the first turns of a spin need not yield the core: a
# peer at a barrier is usually microseconds away, and a yield (a system
# call) on every turn slows the smallest models' steps (bench/seed_overhead.py). Threads always yield: a thread spinning flat out
# holds the GIL its peer needs.
HOT_TURNS = 256


def wait_until(ready, timeout: float, aborted, what: str, spin: bool = True,
               hot_turns: int = 0) -> None:
    """Return once ``ready()``; raise ``Aborted`` if ``aborted()`` (or the
    monitor process has died), and
    ``WaitTimeout`` after ``timeout`` seconds.

    With ``spin`` (a core per worker), first spin for up to ``SPIN_S``:
    ``hot_turns`` turns flat out, then yielding the core on each turn. A
    synchronous step's barrier then costs microseconds, where a sleep would
    cost its wake-up latency.
    After that, or without ``spin``, sleep with back-off up to a millisecond, so a long
    wait (a straggler, a slow start) costs no CPU."""
    if ready():
        return
    start = time.monotonic()
    deadline = start + timeout
    spin_until = start + (SPIN_S if spin else 0.0)
    turns = 0
    pause = 2e-5
    while not ready():
        turns += 1
        if turns & 255 == 0 or not spin:
            now = time.monotonic()
            if aborted() or not parent_alive():
                raise Aborted()
            if now > deadline:
                raise WaitTimeout(f"waited {timeout:g} s for {what}; a peer is stuck or dead "
                                  "(raise --timeout if steps are genuinely that slow)")
            if now > spin_until:
                spin = False
        if spin:
            if turns > hot_turns:
                os.sched_yield() if hasattr(os, "sched_yield") else time.sleep(0)
        else:
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

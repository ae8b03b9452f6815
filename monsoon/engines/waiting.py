"""Bounded waiting: every wait in monsoon has a timeout."""
from __future__ import annotations

import time

from ..errors import WaitTimeout


class Aborted(Exception):
    """The engine asked this worker to stop (a peer failed, or the run ended)."""


def wait_until(ready, timeout: float, aborted, what: str) -> None:
    """Spin, then yield, then sleep with back-off until ``ready()``; raise
    ``Aborted`` if ``aborted()`` and ``WaitTimeout`` after ``timeout`` s.

    Spinning first keeps a synchronous step's barrier in the microseconds
    when workers arrive together; backing off keeps a long wait cheap."""
    if ready():
        return
    deadline = time.monotonic() + timeout
    spins = 0
    pause = 1e-5
    while not ready():
        spins += 1
        if spins > 2000:
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        elif spins > 200:
            time.sleep(0)
        if spins % 64 == 0 or spins > 2000:
            if aborted():
                raise Aborted()
            if time.monotonic() > deadline:
                raise WaitTimeout(f"waited {timeout:g} s for {what}; a peer is stuck or dead "
                                  "(raise --timeout if steps are genuinely that slow)")

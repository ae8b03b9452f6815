"""Workers keep freed memory for their next step (monitor/heap.py)."""
import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import numpy as np
from monsoon.monitor.heap import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():  # a forward pass: 8 activations of 1 MB alive at once, then freed
    return [np.ones(1 << 17) for _ in range(8)]
for _ in range(3):  # warm up
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_step_sized_buffer_is_not_faulted_in_again_every_step():
    """Without the thresholds glibc hands the freed 8 MB back at the end of
    each step (its trim threshold follows the largest block, 1 MB, times
    two) and faults every page in again at the next (2,048 faults a step);
    with them the heap keeps it."""
    faults = {mode: int(subprocess.run([sys.executable, "-c", PROBE, mode], check=True,
                                       capture_output=True, text=True).stdout)
              for mode in ("keep", "default")}
    assert faults["default"] > 50 * 500, faults
    assert faults["keep"] < 500, faults

"""A worker forked from the fork server starts no BLAS threads it was not
given (``monitor/processes.py``, ``FORK_SERVER_BLAS``): with the fork
server's OpenBLAS at one thread per core, each worker's ``limit_threads``
rebuilt the pool after the fork, and those threads busy-waited on the cores
the workers were starting on."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import json
    import os
    import sys


    def threads() -> int:
        return len(os.listdir("/proc/self/task"))


    def worker(queue, given):
        from monsoon.monitor.processes import limit_threads

        import numpy as np
        from scipy.linalg import blas

        before = threads()
        limit_threads(given)  # as every local worker does first (engine._process_main)
        x = np.ones(100_000, dtype=np.float32)
        blas.saxpy(x, x, a=-0.5)  # long enough for OpenBLAS to split it where it may
        float(x @ x)
        queue.put((before, threads()))


    if __name__ == "__main__":
        from monsoon.monitor.processes import start_context

        ctx = start_context()
        if ctx.get_start_method() != "forkserver":
            print(json.dumps(None))
            sys.exit(0)
        out = {}
        for given in (1, 2):
            queue = ctx.Queue()
            p = ctx.Process(target=worker, args=(queue, given))
            p.start()
            out[given] = queue.get(timeout=60)
            p.join(30)
        print(json.dumps(out))
""")


def test_forked_worker_starts_only_the_blas_threads_it_is_given(tmp_path):
    """The parent's OpenBLAS has two threads (a user's process on two
    cores): a worker limited to one thread has no BLAS thread besides its
    own, and one given two still gets its second."""
    script = tmp_path / "fork_blas.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "GOTO_NUM_THREADS")}
    env.update(OPENBLAS_NUM_THREADS="2", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out is None:
        pytest.skip("no fork server on this platform: workers are spawned")
    before, after = out["1"]
    assert after == before, f"one BLAS thread given, {after - before} more threads started"
    before, after = out["2"]
    assert after > before  # the second thread it was given (NumPy's and SciPy's OpenBLAS)

"""A rank started by ``launch.py``'s elastic agent (``launch.RANK_BOOT``:
``main(FOLDER, AGENT_PID)``). It dies with the agent, the monitor's
process and its parent (``lifecycle.die_with``: the boot set it before
importing monsoon, this sets it again for a rank started otherwise, and
either exits at once if the agent is already gone), then loads the pickled
run, runs its part (``rank.run_rank``) and, as rank 0, writes the result
back; a failure is written to ``FOLDER/error-RANK.txt`` and the process
exits with status 1."""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from ..lifecycle import die_with
from .launch import child_failed, write_result
from .rank import run_rank


def main(folder: str, agent_pid: int) -> int:
    die_with(agent_pid)
    folder = Path(folder)
    rank = int(os.environ.get("RANK", -1))
    try:
        with open(folder / "job.pkl", "rb") as f:
            job = pickle.load(f)
        recorder = job.pop("recorder")
        engine = job.pop("engine")
        result = run_rank(engine, recorder=recorder, **job)
        recorder.close()
        if rank == 0:
            write_result(folder, result, recorder)
    except BaseException as exc:  # noqa: BLE001 - reported through the folder, then raised
        child_failed(folder, rank, exc)
        print(f"monsoon: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))

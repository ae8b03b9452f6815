"""A rank started by ``launch.py``'s elastic agent: ``rank_main(FOLDER,
AGENT_PID)``, forked from the fork server (``processes.start_context``),
which has imported torch and monsoon once, so a rank starts in milliseconds
instead of importing them (seconds). It dies with the agent, the monitor's
process, whoever its parent is (``lifecycle.worker_started``:
``PR_SET_PDEATHSIG``, and a thread watching the pipe only the agent holds),
takes its share of the cores, loads the pickled run, runs its part
(``rank.run_rank``) and, as rank 0, writes the result back; a failure is
written to ``FOLDER/error-RANK.txt`` and the process exits with status 1.
A refusal (ConfigError: the same on every attempt) is written to
``FOLDER/refused`` instead and the rank exits with status 0, so that the
agent does not restart the ranks for it (a rank of a later attempt, after
another rank failed, finds it and exits at once); ``launch.py`` raises it.

A rank runs in a session of its own (``leave_the_process_group``): Ctrl-C
or a SIGTERM to the run's process group reaches the agent's process, the
run's monitor, alone (a rank ignores SIGINT too, as a local worker does),
which stops the run: it writes the signal's number to
``FOLDER/stop`` (``launch.py``), which rank 0 reads between collectives
(``StopFile``) and hands on to every rank in the next one."""
from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

from ...errors import ConfigError
from ...monitor.lifecycle import worker_started
from ...monitor.processes import limit_threads
from ...record.atomic import atomic_write
from .rank import run_rank

STOP_FILE = "stop"  # the agent's stop signal, for rank 0 (``StopFile``)
REFUSED_FILE = "refused"  # a rank's ConfigError, for the agent's process (``refusal``)
RECORDER_SKIP = ("problem", "_bar", "live_writer")  # the driver keeps its own writer
# A rank whose collective failed because another rank died waits this long
# before it exits: the agent reports the first exit it sees, and that
# should be the rank that died (it ends this one with SIGTERM meanwhile).
AFTER_PEER_S = 2.0


class AgentStreams:
    """The agent's standard output and error as they are when it starts
    the ranks (a test's capture, a redirect), for a rank forked from a fork
    server started earlier: the descriptors travel with the rank's start
    (``multiprocessing.reduction.DupFd``), and ``rank_main`` writes to them."""

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        return _take_streams, (DupFd(1), DupFd(2))


def _take_streams(out, err) -> None:
    for fd, dup in ((1, out), (2, err)):
        taken = dup.detach()
        os.dup2(taken, fd)
        os.close(taken)


def rank_main(folder: str, agent_pid: int, streams=None) -> None:
    """The rank's whole life (``streams``: unpickled, ``AgentStreams`` has
    already put the agent's output and error in place)."""
    rank = int(os.environ.get("RANK", -1))
    leave_the_process_group()
    # SIGINT ignored: the agent's to handle
    worker_started(agent_pid, f"monsoon-rank{rank}", ignore_sigterm=False)
    # the agent's share of the cores; torch and BLAS were loaded before it was set
    limit_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    folder = Path(folder)
    if refusal(folder) is not None:  # an earlier attempt's: this one would be refused too
        sys.exit(0)
    try:
        with open(folder / "job.pkl", "rb") as f:
            job = pickle.load(f)
        recorder = job.pop("recorder")
        engine = job.pop("engine")
        result = run_rank(engine, recorder=recorder, stop=StopFile(folder / STOP_FILE), **job)
        recorder.close()
        if rank == 0:
            write_result(folder, result, recorder)
    except ConfigError as exc:  # refused: no restart would change it (``refusal``)
        write_refusal(folder, exc)
        sys.exit(0)
    except BaseException as exc:  # noqa: BLE001 - reported through the folder, then raised
        child_failed(folder, rank, exc)
        print(f"monsoon: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        if getattr(exc, "after_peer", False):
            time.sleep(AFTER_PEER_S)
        sys.exit(1)


def leave_the_process_group() -> None:
    """A session of its own, as torchrun starts a rank: a SIGTERM to the
    monitor's process group (``timeout``, a batch scheduler), which the rank
    must take by default from its agent (``worker_started``), would kill it
    before the agent's process stopped the run. Forked from the fork server,
    it ignores SIGTERM until here. (Not a group leader: always allowed.)"""
    try:
        os.setsid()
    except OSError:  # already a session's leader
        pass


class StopFile:
    """A rank's source of the agent's stop signal (``rank.RankWorker.stop``):
    the number in ``path`` once the agent has written it, read at most every
    ``every_s`` (a collective may take microseconds)."""

    def __init__(self, path: Path, every_s: float = 0.02):
        self.path, self.every_s, self.next_at = path, every_s, 0.0

    def __call__(self) -> int | None:
        now = time.monotonic()
        if now < self.next_at:
            return None
        self.next_at = now + self.every_s
        try:
            return int(self.path.read_text()) or None
        except (OSError, ValueError):  # not written yet
            return None


def write_stop(folder: Path, signum: int) -> None:
    """The agent's side of ``StopFile``: the signal's number, whole at once."""
    atomic_write(folder / STOP_FILE, str(int(signum)), durable=False)


def child_failed(folder: Path, rank: int, exc: BaseException) -> None:
    """A rank's error, for the agent's process to report."""
    msg = str(exc).strip().splitlines()
    (folder / f"error-{rank}.txt").write_text(f"{type(exc).__name__}: "
                                             f"{msg[0] if msg else ''}")


def write_refusal(folder: Path, exc: ConfigError) -> None:
    """A rank's ConfigError, whole at once (every rank may write it)."""
    atomic_write(folder / REFUSED_FILE, str(exc).strip(), durable=False)


def refusal(folder: Path) -> ConfigError | None:
    """The ConfigError a rank of this run wrote (``write_refusal``), or None."""
    try:
        return ConfigError((folder / REFUSED_FILE).read_text())
    except OSError:
        return None


def write_result(folder: Path, result, recorder) -> None:
    state = {k: v for k, v in recorder.__dict__.items() if k not in RECORDER_SKIP}
    payload = {"result": result, "recorder": state}
    atomic_write(folder / "result.pkl",
                 lambda f: pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL),
                 durable=False)

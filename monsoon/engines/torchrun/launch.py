"""``monsoon train --engine torch --workers N`` without torchrun: this
process becomes torchrun's elastic agent (``torch.distributed.launcher.api.
elastic_launch``, what torchrun itself calls) on this machine.

The run's pieces (problem, rule, strategy, initial parameters, recorder)
are pickled once into a private folder; the agent starts N ranks, each
``child.rank_main(FOLDER, PID)`` (PID: this process, which each rank dies
with), forked from the fork server that has imported torch and monsoon
(``processes.start_context``; spawned where there is none), with torchrun's
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, from a
c10d rendezvous on a free local port, as ``torchrun --standalone`` does).
Rank 0 pickles its EngineResult and its recorder's state back; a rank that
fails writes its error there, and the agent's ChildFailedError is turned
into one ``WorkerError`` naming the rank that died first (by a signal) or
failed. With ``max_restarts`` the agent restarts every rank after a failure;
not after a rank's refusal (a ConfigError: ``child.refusal``), which is
raised as it is, once.
The folder is removed in every case; one whose agent was killed with
``kill -9`` is removed by the next launch (``remove_stale_folders``).

SIGTERM/SIGINT stay the run's (``lifecycle.StopSignals``): torchrun's agent
is told to take SIGHUP and SIGQUIT only (``TORCHELASTIC_SIGNALS_TO_HANDLE``),
and the first stop signal is written to the folder (``child.write_stop``),
from which rank 0 stops every rank at one step; rank 0's result then says
``interrupted``. A second signal raises in the agent, which ends the ranks
(SIGTERM) before the error leaves.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

from ...errors import WorkerError


def launch(engine, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ...monitor.lifecycle import on_stop
    from ...monitor.processes import environment, main_module_hidden, torch_threads_per_worker
    from .child import AgentStreams, rank_main, refusal, write_stop

    launched_at = time.time()  # the ranks' start-up counts from here (``rank.run_rank``)
    remove_stale_folders()
    folder = Path(tempfile.mkdtemp(prefix=f"monsoon-torch-{os.getpid()}-"))
    try:
        job = pickle.dumps({"engine": engine, "problem": problem, "rule": rule,
                            "strategy": strategy, "w0": w0, "workers": workers,
                            "batch_size": batch_size, "seed": seed, "budget": budget,
                            "recorder": recorder, "launched_at": launched_at},
                           protocol=pickle.HIGHEST_PROTOCOL)
        (folder / "job.pkl").write_bytes(job)
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=workers,
                              run_id=uuid.uuid4().hex[:12], rdzv_backend="c10d",
                              rdzv_endpoint="127.0.0.1:0", max_restarts=engine.max_restarts,
                              monitor_interval=0.05, start_method=start_method(),
                              rdzv_configs={"join_timeout": max(30, int(engine.timeout))},
                              **agent_signals(LaunchConfig))
        # the ranks' share of the cores, unless the user set it (``child.rank_main``)
        threads = os.environ.get("OMP_NUM_THREADS", str(torch_threads_per_worker(workers)))
        try:
            with environment({"OMP_NUM_THREADS": threads}), \
                    main_module_hidden(b"__main__" in job), agent_log_without_tracebacks(), \
                    signals_left_to_the_run(), on_stop(lambda signum: write_stop(folder, signum)):
                elastic_launch(config, entrypoint=rank_main)(str(folder), os.getpid(),
                                                             AgentStreams())
        except ChildFailedError as exc:  # any rank lost: the collectives need every one
            raise refusal(folder) or failure_error(exc, folder, engine) from None
        refused = refusal(folder)
        if refused is not None:
            raise refused
        with open(folder / "result.pkl", "rb") as f:
            out = pickle.load(f)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    recorder.__dict__.update(out["recorder"])
    return out["result"]


class _NoTraceback(logging.Filter):
    """Keeps the agent's line about a failed rank, drops its traceback: the
    traceback is the agent's own poll loop (a rank reports its error through
    the folder and exits 1), and torch's log formatter imports
    ``torch._dynamo`` (seconds of CPU) to format one, after the rank died
    and before the run can fail."""

    def filter(self, record):
        record.exc_info, record.exc_text = None, None
        return True


@contextlib.contextmanager
def agent_log_without_tracebacks():
    log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    quiet = _NoTraceback()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
AGENT_SIGNALS = "SIGHUP,SIGQUIT"  # where the run handles SIGTERM and SIGINT itself


def agent_signals(config_class) -> dict:
    """``LaunchConfig``'s keyword for the signals torchrun's agent handles:
    where this run handles SIGTERM and SIGINT (``lifecycle.StopSignals``),
    the others it would (SIGHUP, SIGQUIT), not those two. (A torch whose
    LaunchConfig has no such field reads the environment:
    ``signals_left_to_the_run``.)"""
    import dataclasses

    from ...monitor.lifecycle import StopSignals

    fields = {f.name for f in dataclasses.fields(config_class)}
    if StopSignals.active is None or "signals_to_handle" not in fields:
        return {}
    return {"signals_to_handle": AGENT_SIGNALS}


def signals_left_to_the_run():
    """While the agent runs, ``agent_signals`` in the environment too (the
    agent sets it from its config, for the whole process): as it was after."""
    from ...monitor.lifecycle import StopSignals
    from ...monitor.processes import environment

    handled = AGENT_SIGNALS if StopSignals.active is not None else os.environ.get(SIGNALS_ENV)
    return environment({SIGNALS_ENV: handled})


def start_method() -> str:
    """How the agent starts its ranks: forked from the fork server (torch
    is imported by now, so the server preloads it), else spawned."""
    from ...monitor.processes import start_context

    return start_context().get_start_method()


def remove_stale_folders() -> None:
    """Remove the job folders of agents that no longer run: an agent killed
    with ``kill -9`` could not remove its own (its pid is in the name)."""
    from ...monitor.lifecycle import alive

    for path in Path(tempfile.gettempdir()).glob("monsoon-torch-*-*"):
        pid = path.name.split("-")[2]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def failure_error(exc, folder: Path, engine) -> WorkerError:
    """One line: the rank that died (a signal other than the agent's own
    SIGTERM) or failed first, with its error, then the others; the error's
    ``worker`` is that rank (summary.json's ``failed_worker``)."""
    failures = dict(exc.failures)
    parts = []

    def error_of(rank):
        path = folder / f"error-{rank}.txt"
        return path.read_text().strip() if path.exists() else None

    def why(rank, failure):
        if failure.exitcode < 0:
            try:
                name = signal.Signals(-failure.exitcode).name
            except ValueError:
                name = f"signal {-failure.exitcode}"
            return f"rank {rank} died ({name})"
        err = error_of(rank)
        return f"rank {rank} failed (exit code {failure.exitcode})" + (f": {err}" if err else "")

    killed = [r for r, f in failures.items() if f.exitcode < 0 and f.exitcode != -signal.SIGTERM]
    first = sorted(killed) or sorted(failures, key=lambda r: failures[r].timestamp)
    order = first + [r for r in sorted(failures) if r not in first]
    for rank in order:
        parts.append(why(rank, failures[rank]))
    restarts = (f" after {engine.max_restarts} restart(s)" if engine.max_restarts else
                " (--max-restarts 0)")
    err = WorkerError("torch engine: " + "; ".join(parts) + restarts)
    err.worker = order[0]
    return err

"""The torch engine: monsoon's strategies on torch.distributed, under torchrun.

Each worker is one torchrun rank (one process; on GPUs, one per device).
The ranks run the strategy's program and carry out its ops with
all-reduces (``rank.py``); there is no parameter server. Two ways to start:

- under torchrun, on any number of nodes (each rank runs the command)::

    torchrun --nproc-per-node 2 -m monsoon train --engine torch --workers 2 ...
    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:PORT -m monsoon train --engine torch --workers 2 ...

  ``--workers`` must equal torchrun's world size; rank 0 writes the run
  folder, the other ranks print nothing (``monsoon.train`` returns them a
  Result whose summary is ``{"follower": True}``);
- without torchrun, ``monsoon train --engine torch --workers N`` (from Python
  ``engine="torch"``) starts torchrun's elastic agent here (``launch.py``).

Ops (the contract, ``engines/base.py``): AllReduce (of sync's gradient),
Average (of local-sgd's and DiLoCo's drifts), Elastic (easgd), Gradient,
LocalApply, Fetch. The all-reduce: where every rank runs on one machine and
the backend is gloo, through shared memory (``shm_reduce.py``; bit-identical
to gloo's sum; see bench/torch_engine_vs_ddp.py); otherwise through the
backend's, for torch problems in buckets overlapped with backward
(``buckets.py``). ``--compress``: an all-gather of packed messages instead
(``rank.py``). No Push (async): Downpour's server answers each push the
moment it arrives, which collectives (every rank at once) cannot do soundly;
no Apply by several workers (hogwild): the ranks share no memory; no backup
workers: an all-reduce takes every rank.

Faults: every collective has ``--timeout``: a rank that dies or hangs fails
the others within it, not after torch's 30-minute default; under
``--max-restarts`` the agent restarts every rank and sync resumes from the
newest checkpoint, ending as the uninterrupted run would. SIGTERM/SIGINT:
rank 0 stops every rank after one collective, then writes the final
checkpoint (sync: exact) and the run folder ("interrupted"). Without
torchrun the run's process hands the signal to rank 0 through the job folder
(``launch.py``); under torchrun the agent hands it to every rank, then exits
with its ``SignalException`` (docs/faults.md); one reaching another rank
alone goes to rank 0 with the next collective.
"""
from __future__ import annotations

import os

from ...errors import ConfigError
from ...options import Option
from ...strategies.ops import AllReduce, Average, Elastic, Fetch, Gradient, LocalApply
from ...record import checkpoints
from ..base import Engine
from ..options import CHECKPOINT_EVERY, RESUME, TIMEOUT
from .collectives import agent_restarts, launch_id, pick_backend, rank_env, under_torchrun
from .shm_reduce import REDUCE_VIA, uses_shm


class TorchEngine(Engine):
    """The ``torch`` engine's contract and options; ``run`` hands the run
    to this process's rank under torchrun, else to ``launch``."""
    name = "torch"
    compresses = True  # an all-gather of every rank's packed message (rank.py)
    device_placement = "index"  # a rank computes on its LOCAL_RANK's GPU (NCCL: its group's)
    ops = frozenset({Gradient, AllReduce, Average, Elastic, LocalApply, Fetch})
    virtual_time = False
    stops_on_signal = True  # SIGTERM/SIGINT: every rank stops at one step (rank.py)
    keeps_private_copies = False  # local SGD, EASGD: none written (refuse_checkpoints)
    backend_used = "torch.distributed"
    options = (
        TIMEOUT, CHECKPOINT_EVERY, RESUME,
        Option("dist_backend", str, "auto", "torch.distributed backend (auto: nccl where CUDA "
               "is available, else gloo)", choices=("auto", "gloo", "nccl")),
        Option("bucket_mb", float, 25.0, "sync on torch problems, through the backend: "
               "all-reduce the gradient in buckets of this many MB while backward runs "
               "(0: one all-reduce after it); "
               "refused where no bucket runs (shared memory, --compress)",
               check=lambda v: None if v >= 0 else "0 or more"),
        Option("reduce_via", str, "auto", "how the ranks sum their buffers: shm (through shared "
               "memory; every rank on one machine), backend (the process group's all-reduce), "
               "auto (shm where every rank is on this machine, the backend is gloo and the CPU "
               "keeps stores in order: x86)",
               choices=REDUCE_VIA),
        Option("max_restarts", int, 0, "without torchrun: restarts of every rank after a "
               "failure (sync resumes from the newest checkpoint); under torchrun, use its "
               "own --max-restarts", check=lambda v: None if v >= 0 else "0 or more"),
    )
    described = ("timeout", "dist_backend", "bucket_mb", "max_restarts", "reduce_via",
                 "checkpoint_every", "resume_dir")

    def __init__(self, timeout: float = 60.0, dist_backend: str = "auto",
                 bucket_mb: float = 25.0, max_restarts: int = 0, reduce_via: str = "auto",
                 checkpoint_dir: str | None = None, checkpoint_every: int = 0,
                 resume_dir: str | None = None):
        self.timeout = timeout
        self.dist_backend = dist_backend
        self.bucket_mb = bucket_mb
        self.max_restarts = max_restarts
        self.reduce_via = reduce_via
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume_dir = resume_dir
        self.identity = {}
        self.held_shapes = {}  # ``checkpoint_shapes`` of the run, set by ``run``

    @staticmethod
    def keeps_compressor_state(strategy) -> bool:
        """Sync's exact checkpoints hold every rank's sender state, gathered
        at each checkpoint step (``rank.RankWorker.gather_ranks``)."""
        return checkpoints.exact_checkpoints(strategy)

    @staticmethod
    def keeps_buffers(strategy) -> bool:
        """And every rank's model buffers (BatchNorm's statistics)."""
        return checkpoints.exact_checkpoints(strategy)

    def checkpoint_shapes(self, problem, strategy, w0, workers: int) -> dict:
        """Sync's: every rank's sender state where the compression is
        stateful (``sender.<name>``) and model buffers (``buffer.<name>``),
        ranks first."""
        if not checkpoints.exact_checkpoints(strategy):
            return {}
        compression = self.compression
        layout = compression.sender_layout(w0.size, w0.dtype) if compression.stateful else None
        return checkpoints.held_shapes(workers, layout, checkpoints.buffer_arrays(problem),
                                       per_worker=True)

    @staticmethod
    def restarted_launch() -> str | None:
        """Under torchrun, its launch's id (``collectives.launch_id``), which
        rank 0 writes in every checkpoint's meta; but torchrun's default id,
        "none" (a static rendezvous, --master-port), is no launch's own, so
        with it only a restarted attempt (its agent's
        TORCHELASTIC_RESTART_COUNT > 0) keeps it, and a first attempt keeps
        no earlier checkpoint. None without torchrun: the run's process
        clears the folder before its launcher starts the ranks."""
        launch = launch_id() if under_torchrun() else None
        if launch == "none" and agent_restarts() < 1:
            return None
        return launch

    @property
    def writes_run_folder(self) -> bool:
        """Under torchrun only rank 0 writes the run folder, a failed run's
        too (on a shared file system the others would overwrite it); the
        others print their one line."""
        return not under_torchrun() or os.environ.get("RANK", "0") == "0"

    def compression_refused(self, strategy) -> str | None:
        if self.reduce_via == "shm":
            return ("--compress sends each rank's packed message through the backend's "
                    "all-gather, not the shared-memory reduce; drop --reduce-via shm")
        return None

    def preflight(self, problem, strategy, workers: int, batch_size: int) -> None:
        """Also ``--dist-backend nccl`` without CUDA here, which every rank
        would refuse once started (``collectives.pick_backend``)."""
        super().preflight(problem, strategy, workers, batch_size)
        backend = pick_backend(self.dist_backend)
        reason = self.buckets_refused(problem, strategy, workers, backend)
        if reason:
            raise ConfigError(reason)

    def buckets_refused(self, problem, strategy, workers: int, backend: str) -> str | None:
        """Why a ``--bucket-mb`` given would do nothing, or None: the ranks
        all-reduce in buckets only sync's gradient of a torch model, through
        the backend's all-reduce, uncompressed (``rank.RankWorker``)."""
        if "bucket_mb" not in self.given or not self.bucket_mb:
            return None
        given = f"--bucket-mb {self.bucket_mb:g}"
        if not strategy.raw_gradients:
            return (f"{given}: buckets carry sync's gradient during backward; strategy "
                    f"{strategy.name} all-reduces none: drop --bucket-mb")
        if problem.backward is None:
            return (f"{given}: buckets are filled by a torch model's backward, and problem "
                    f"{problem.name} has none: drop --bucket-mb")
        if self.compression.active:
            return (f"{given}: --compress all-gathers each rank's packed message after "
                    "backward, not in buckets: drop --bucket-mb")
        env = rank_env() if under_torchrun() else {"world_size": workers,
                                                   "local_world_size": workers}
        if not uses_shm(self.reduce_via, backend, env):
            return None
        how = ("--reduce-via shm" if self.reduce_via == "shm" else
               "--reduce-via auto here (every rank on this machine, on gloo)")
        return (f"{given}: the ranks sum through shared memory under {how}, after backward, "
                "not in buckets; add --reduce-via backend, or drop --bucket-mb")

    def run(self, problem, rule, strategy, w0, workers, batch_size, seed, budget, recorder):
        self.check(strategy, workers)
        self.identity = checkpoints.identity(problem, strategy, rule, workers, batch_size,
                                             seed, self.name, self.settings)
        if self.checkpoint_dir or self.resume_dir:  # the problem as given, not a rank's
            self.held_shapes = self.checkpoint_shapes(problem, strategy, w0, workers)
        if under_torchrun():
            from .rank import run_rank

            return run_rank(self, problem, rule, strategy, w0, workers, batch_size, seed,
                            budget, recorder)
        from .launch import launch

        return launch(self, problem, rule, strategy, w0, workers, batch_size, seed, budget,
                      recorder)

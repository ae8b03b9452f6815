"""Devices: where each worker of a torch problem computes (``--device``).

``--device`` is ``cpu`` (the default), ``cuda`` (every GPU this machine
has), ``cuda:N`` (that one GPU) or ``auto`` (``cuda`` where torch sees a
GPU and the run can use one, else ``cpu``). It is checked before any
worker starts, and refused in one line where it cannot hold: no CUDA
device here, a GPU index past the last one, a problem computed by NumPy,
an engine whose workers cannot hold a GPU, a rule written for NumPy only
(lbfgs), a strategy whose workers update one parameter array in place
(Hogwild!) on an engine whose workers do not share one process (Hogwild!
threads on a GPU update one device tensor in place: seed 002).

The device map (``device_map``): in one process, worker k computes on
``cuda:(k mod G)`` with ``cuda`` and G GPUs, so towers share a GPU when
there are more workers than GPUs; ``cuda:N`` puts every worker on GPU N.
Engines declare how their workers find their GPU (``Engine.device_placement``):
``"index"`` (local, torch: the map above; a torch rank uses its LOCAL_RANK's)
or ``"assigned"`` (ray: the GPU the scheduler gave the actor, ``cuda`` in
the actor). An engine that declares nothing runs its workers on the CPU.

Placement is lazy (``TorchProblem.place``): a worker's copy of the problem
carries its device and moves its module, buffers and data there at its
first computation, in the worker's own process or thread. Where the
workers share this process (the local engine's inline runner and threads),
the parameters, gradients and rule state live on the device too
(``Problem.array_device``, ``monsoon/arrays.py``); a host copy is made for
snapshots, checkpoints and the result. Elsewhere (worker processes, Ray,
a parameter server in host memory) they stay NumPy arrays in host memory,
and a worker uploads the parameters before each gradient and brings the
flat gradient back. ``monsoon.train`` moves the problem back
to the CPU when the run ends, so ``result.params``, ``model.pt`` and
``summary.json`` do not depend on the device; ``summary["devices"]``
records where the workers ran (one entry when they all shared one device).
See docs/gpu.md.
"""
from __future__ import annotations

import re
import threading

from .errors import ConfigError

CHOICES = "auto, cpu, cuda or cuda:N"
_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_spec(value: str) -> str | None:
    """None if ``value`` is a device spelling ``--device`` takes, else what it must be."""
    return None if _PATTERN.match(str(value)) else CHOICES


def cuda_count() -> int:
    """The CUDA devices torch sees here (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_map(device: str, workers: int, gpus: int) -> list[str]:
    """Each worker's device, for ``workers`` workers in one process group on
    ``gpus`` GPUs: ``cpu`` for all, ``cuda:N`` for all, or worker k on
    ``cuda:(k mod gpus)``."""
    if device == "cpu" or device.startswith("cuda:"):
        return [device] * workers
    if device != "cuda":
        raise ValueError(f"device_map takes cpu, cuda or cuda:N, not {device!r}")
    if gpus < 1:
        raise ValueError("device_map('cuda', ...) needs at least one GPU")
    return [f"cuda:{k % gpus}" for k in range(workers)]


def is_cuda(device) -> bool:
    return device is not None and str(device).startswith("cuda")


def _torch_problem(problem) -> bool:
    return problem.place is not None


def choose(spec: str, problem, strategy, engine, workers: int, gpus: int | None = None,
           rule=None) -> str:
    """The device the run uses (``cpu``, ``cuda`` or ``cuda:N``) for the
    ``--device`` given, checked against this machine and the run's
    components; raises ConfigError in one line."""
    spec = spec or "cpu"
    if check_spec(spec):
        raise ConfigError(f"unknown device {spec!r}; choose one of: {CHOICES} (--device)")
    if spec == "cpu":
        return "cpu"
    if spec == "auto" and not _torch_problem(problem):
        return "cpu"  # without counting GPUs, which would import torch for a NumPy run
    gpus = cuda_count() if gpus is None else gpus
    placement, name = engine.device_placement, engine.name
    needs = strategy.needs(workers)   # SHARED_MEMORY, STAGES: strategies/base.py
    # an engine instance whose workers share this process (an engine class: not known)
    one_process = not isinstance(engine, type) and engine.shares_device_arrays()
    shared = "shared memory" in needs and not one_process
    stages = "pipeline stages" in needs   # the engine runs the stages its own way (CPU)
    host_rule = rule is not None and not rule.device_arrays
    if spec == "auto":
        usable = (gpus > 0 and _torch_problem(problem) and placement and not shared
                  and not stages and not host_rule)
        return "cuda" if usable else "cpu"
    if gpus == 0:
        raise ConfigError(f"--device {spec} needs a CUDA GPU, and torch sees none on this "
                          "machine (torch.cuda.is_available() is False); use --device cpu "
                          "or --device auto")
    if spec.startswith("cuda:") and int(spec[5:]) >= gpus:
        raise ConfigError(f"--device {spec}, but this machine has {gpus} GPU(s): "
                          f"cuda:0 to cuda:{gpus - 1}; pick one of them, or --device cuda")
    if not _torch_problem(problem):
        raise ConfigError(f"--device {spec} applies to torch problems; problem "
                          f"{getattr(problem, 'name', problem)!r} is computed by NumPy on the "
                          "CPU: drop --device")
    if not placement:
        raise ConfigError(f"the {name} engine runs its workers on the CPU only; --device "
                          f"{spec} runs on engines local, ray and torch")
    if stages:
        raise ConfigError(f"{strategy.name} runs its stages on the CPU only; use "
                          "--device cpu with it")
    if shared:
        raise ConfigError(f"{strategy.name} has every worker update one parameter array in "
                          f"place, which GPU workers share only as threads of one process; "
                          f"use --backend threads (the default on a GPU), or --device cpu")
    if host_rule:
        raise ConfigError(f"rule {rule.name} runs on NumPy arrays in host memory; use "
                          f"--device cpu with it, or another rule on the GPU")
    return spec


def check_precision(precision: str, problem) -> None:
    """``--precision bf16`` applies to a float32 torch problem; raises
    ConfigError in one line otherwise."""
    if not _torch_problem(problem):
        raise ConfigError(f"--precision {precision} applies to torch problems; problem "
                          f"{getattr(problem, 'name', problem)!r} is computed by NumPy: drop "
                          "--precision")
    try:
        problem.use_precision(precision)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    finally:
        problem.use_precision("32")  # set for the run by ``assign``


def plan(device: str, engine, workers: int, gpus: int | None = None) -> list[str]:
    """Each worker's device for a run on ``device`` (from ``choose``)."""
    if device == "cpu":
        return ["cpu"] * workers
    if engine.device_placement == "assigned":
        return ["cuda"] * workers  # the GPU the scheduler gives each worker
    return device_map(device, workers, cuda_count() if gpus is None else gpus)


def summary_devices(devices: list[str]) -> list[str]:
    """What summary.json records: one entry when every worker shared one
    device, else one per worker, in rank order."""
    return devices[:1] if len(set(devices)) == 1 else list(devices)


def assign(problem, devices: list[str], precision: str = "32") -> None:
    """Give a torch problem the run's device map: worker k's copy
    (``for_worker``) computes on ``devices[k]``, the problem itself (serial,
    the monitor's evaluation) on worker 0's; and the run's precision."""
    if _torch_problem(problem):
        problem.use_devices(devices)
        problem.use_precision(precision)


def release(problem) -> None:
    """Back to the CPU after a run: the module, its buffers and the data,
    in the module's own precision."""
    if _torch_problem(problem):
        problem.use_devices(None)
        problem.use_precision("32")
        problem.place("cpu")


def rank_device(problem, local_rank: int, comm_device=None) -> str | None:
    """The device of a torch engine rank whose problem was given GPUs: the
    NCCL group's device where there is one, else the one GPU all ranks were
    given, else its LOCAL_RANK's modulo the GPUs; None on the CPU."""
    devices = problem.worker_devices or []
    if not any(is_cuda(d) for d in devices):
        return None
    if comm_device is not None:
        return str(comm_device)
    if len(set(devices)) == 1:
        return devices[0]
    return f"cuda:{local_rank % max(1, cuda_count())}"


_COPIES: dict = {}  # (id of a host tensor, device) -> weak reference to its device copy
_COPIES_LOCK = threading.Lock()


def to_device_once(tensor, device):
    """``tensor`` on ``device``, copied once per process while a copy is in
    use: the workers (threads) of one process that share a GPU share it."""
    import weakref

    if tensor.device == device:
        return tensor
    key = (id(tensor), str(device))
    with _COPIES_LOCK:
        ref = _COPIES.get(key)
        copy = ref() if ref is not None else None
        if copy is None:
            copy = tensor.to(device)
            _COPIES[key] = weakref.ref(copy, lambda _, key=key: _COPIES.pop(key, None))
            weakref.finalize(tensor, _COPIES.pop, key, None)  # an id may be reused later
    return copy


def ray_gpus_per_worker(problem, workers: int, cluster_gpus: float) -> float:
    """``num_gpus`` of each Ray worker actor: 0 on the CPU; a whole GPU each
    when the cluster has enough, else an equal share, so that every worker
    fits (5 workers on 2 GPUs: 1/3 each, at most 3 to a GPU)."""
    import math

    if not any(is_cuda(d) for d in problem.worker_devices or []):
        return 0
    if cluster_gpus < 1:
        raise ConfigError("--device cuda, but the Ray cluster has no GPU; add GPU nodes, "
                          "or use --device cpu")
    whole = int(cluster_gpus)
    return 1 if whole >= workers else 1 / math.ceil(workers / whole)

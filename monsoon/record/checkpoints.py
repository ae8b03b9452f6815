"""Checkpoints, one format and one identity check for every engine.

One checkpoint is one ``.npz`` file, ``ckpt-<updates, 12 digits>.npz``, in
the run folder's ``checkpoints/``: the arrays (``params``, ``state.<field>``
of the rule, ``counters``, the workers' private copies ``worker.<k>.<what>``)
and ``meta``, a JSON document stored as bytes beside them: which run it
belongs to (problem, a file by its absolute path, parameter count and
dtype, the model's buffers' names and shapes, ``buffers``, strategy, rule,
workers, batch size, seed, and ``settings``: every option that shapes the
run's trajectory, ``trajectory``; the data trained on, ``n_examples`` and
``data``, a digest of it where the problem gives one, ``data_identity``;
these absent in checkpoints written before they were recorded, which
resume as they did) and the engine that wrote it (``engine``, its registry
name; absent in checkpoints written before it was recorded), the position
in the data order (``step``: batches done; ``positions``: per worker), the
time and counters so far, and the recorder's rows, so the loss curve
carries on; where the engine's tally wrote them, ``totals``: the counts its
workers kept themselves (staleness, traffic, SSP's clocks) known when it was
written (every one in a run's final checkpoint; ``monitor/tally.py`` says
which in a periodic one), which the resumed run's tally counts on from, so
its summary counts the whole run.
How the counts, positions and counters are reckoned is ``progress.py``'s.

Invariants:

- Writes are atomic (temporary file, fsync, rename, fsync of the folder):
  a reader sees a whole checkpoint or none; none holds a NaN or Inf parameter.
- Loading unpickles nothing (``allow_pickle=False``; the metadata is JSON).
  Every member is read in full, so the zip's CRC-32 catches a corrupt
  file, and a partial one has no central directory.
- A checkpoint that is unreadable or incomplete (``ALWAYS``, ``WRITES``),
  from another run (another problem, other shapes, a model with other
  buffers) or written by another engine is refused in one line; the newest
  good one is used, and each refused one is named on stderr. None is ever
  half loaded: everything is read and checked before anything is returned.
- The newest ``KEEP`` checkpoints of the run that writes one are kept,
  its older ones are removed; another run's (another identity) and damaged
  ones are not this save's to prune (nor to write over: a damaged one is
  moved aside to ``<name>.damaged``), and the one just written is never
  removed: the checkpoint a message or summary names exists.
"""
from __future__ import annotations

import json
import operator
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..arrays import to_host
from ..errors import ConfigError
from ..strategies.ops import Average, Elastic

FORMAT = "monsoon-checkpoint"
VERSION = 1
KEEP = 3
PRIVATE = "worker.{}.params"  # worker k's private copy
_NAME = re.compile(r"^ckpt-(\d{12})\.npz$")
# What must match for a checkpoint to belong to this run.
IDENTITY = ("problem", "n_params", "dtype", "strategy", "rule", "workers", "batch_size", "seed",
            "plan")
# What must match of the data trained on (``data_identity``), where the
# checkpoint records it (older ones do not: they resume as they did).
DATA = ("n_examples", "data")
# The run's options that a --resume may change: the budget and stopping
# rules (the trajectory up to the checkpoint is the same under any), what is
# recorded and where, timeouts, checkpoint spacing, where the cluster or
# device is, and how the local engine runs its workers (threads or
# processes: the same steps either way). Every other option (the rule's and
# its lr and schedule, the strategy's, --compress, the problem's, the
# engine's shards...) shapes the trajectory, and a checkpoint records it in
# ``settings`` (``trajectory``).
RESUMABLE = frozenset({
    "epochs", "steps", "target_loss", "tol", "evals", "eval_share", "out", "progress",
    "live_every", "tensorboard", "mlflow", "timeout", "checkpoint_every", "resume", "device",
    "address", "run_name", "master", "max_restarts", "backend"})


# The meta keys every checkpoint of this version holds (besides format and
# version): the run's identity (``identity``), how far it got
# (``progress.counts``: every engine's writer), its time and rows
# (``Checkpointer.save``). ``engine``, ``settings`` and ``plan`` are compared
# where present (older checkpoints lack them); the rest are an engine's own:
ALWAYS = ("problem", "n_params", "dtype", "strategy", "rule", "workers", "batch_size", "seed",
          "updates", "time_s", "examples", "dropped", "reason", "rows")
# the meta keys and arrays each engine (the meta's ``engine``) always writes
# besides; and every checkpoint says where its workers are: ``step`` (every
# worker walks the global plan) or ``positions`` (in its meta or arrays).
WRITES = {"local": (("exact", "positions"), ("counters",)),
          "sim": (("exact", "positions", "events", "late", "rng"), ("counters",)),
          "ray": (("exact", "step", "positions"), ()),
          "torch": (("exact", "step"), ()),
          "spark": (("applied",), ())}


class CheckpointError(ConfigError):
    """A checkpoint cannot be used; the message says which and why."""


@dataclass
class Checkpoint:
    path: Path
    meta: dict
    arrays: dict

    def reproduced_by(self, params, state, arrays: dict, **meta) -> bool:
        """Whether a run's ``params``, rule ``state``, other ``arrays`` and
        ``meta`` values (as JSON keeps them, ``jsonable``) are this
        checkpoint's, bit for bit (NaN as NaN): a replay that reached it."""
        mine = {"params": params, **state_arrays(state), **arrays}
        return (all(jsonable(v) == self.meta.get(k) for k, v in meta.items())
                and all(k in self.arrays and np.array_equal(v, self.arrays[k], equal_nan=True)
                        for k, v in mine.items()))


def jsonable(value):
    """``value`` as plain JSON values, as a checkpoint's meta reads back
    (NumPy ints become ints): an RNG state."""
    return json.loads(json.dumps(value, default=int))


@dataclass
class Start:
    """Where a run starts: at the beginning (``saved`` is None), or at the
    checkpoint ``saved`` (``Checkpointer.start``).

    Every engine's checkpoint holds the parameters, the rule state and the
    meta keys ``examples``, ``dropped`` and ``time_s``. The others differ
    for real reasons, and an engine reads its own in ``saved.meta``:
    ``step`` (steps or versions done) is written by the engines that count
    steps (ray, spark's sync driver, torchrun), 0 here where absent;
    ``positions`` (each worker's batches done) by ray and the local engine,
    as an array by spark's server, here ``[step] * workers`` where absent
    (every worker walks the global plan); the private copies
    (``worker.<k>.params``) and compressor states (``sender.<name>``,
    workers first) where the run keeps them (``buffers``, each worker's
    model buffers: the torch engine fills them itself); ``totals``, the counts of the
    run so far that its engine's tally carries on (``RunTally.carry``: the
    meta key ``totals``, where the checkpoint holds them; {}: count from
    zero); ``local``, the local steps (applied, dropped) so far; ``updates``,
    the updates applied so far (the meta's ``applied`` where its
    ``updates`` counts dropped steps too: spark's server and driver)."""
    params: np.ndarray
    state: tuple | None          # the whole rule state (None: the rule's fresh one)
    step: int = 0
    positions: list = field(default_factory=list)
    examples: int = 0
    dropped: int = 0
    time_s: float = 0.0
    private: dict = field(default_factory=dict)   # rank -> private copy
    senders: dict = field(default_factory=dict)   # rank -> compressor state
    buffers: dict = field(default_factory=dict)   # rank -> model buffers, where each's is held
    saved: Checkpoint | None = None
    totals: dict = field(default_factory=dict)
    local: tuple = (0, 0)
    updates: int = 0

    @property
    def path(self) -> str | None:
        return None if self.saved is None else str(self.saved.path)

    def restore(self, params, state) -> None:
        """Copy the checkpoint's parameters and rule state into ``params``
        and ``state``, in place."""
        params[...] = self.params
        for mine, saved in zip(state, self.state):
            mine[...] = saved

    @classmethod
    def fresh(cls, w0, workers: int) -> "Start":
        return cls(np.array(w0, copy=True), None, positions=[0] * workers)

    @classmethod
    def at(cls, saved: Checkpoint, rule, workers: int, needs: tuple = ()) -> "Start":
        """The start at ``saved``; ``needs``: meta keys the resuming engine
        cannot do without (``step`` where it counts steps): a checkpoint
        without one was written by another engine, and is refused."""
        params, meta, arrays = saved.arrays["params"], saved.meta, saved.arrays
        for key in needs:
            if key not in meta:
                raise CheckpointError(
                    f"checkpoint {saved.path} holds no {key!r}: another engine wrote it; "
                    "resume with the engine that wrote it, or start a new run without "
                    "--resume")
        state = rule.init(params.size, params.dtype)
        restore_state(saved, state)
        step = int(meta.get("step", 0))
        positions = arrays["positions"] if "positions" in arrays else meta.get(
            "positions", [step] * workers)
        return cls(params, state, step,  # the load's own array: no copy
                   [int(p) for p in positions][:workers],
                   int(meta["examples"]), int(meta["dropped"]), float(meta["time_s"]),
                   {r: arrays[PRIVATE.format(r)] for r in range(workers)
                    if PRIVATE.format(r) in arrays},
                   worker_rows(arrays, "sender.", workers), {}, saved,
                   dict(meta.get("totals") or {}),
                   (int(meta.get("local_updates", 0)), int(meta.get("dropped_local_updates", 0))),
                   applied(meta))


def applied(meta: dict) -> int:
    """The updates applied up to a checkpoint (its meta): ``applied`` where
    its ``updates`` counts dropped steps too (spark's server and driver)."""
    return int(meta.get("applied", meta.get("updates", 0)))


def private_arrays(private: dict) -> dict:
    """Workers' private copies (rank -> copy) as a checkpoint's arrays
    (``worker.<k>.params``, which ``Start.private`` reads back)."""
    return {PRIVATE.format(rank): copy for rank, copy in private.items()}


def worker_arrays(rows: list[dict], prefix: str = "") -> dict:
    """Every worker's arrays (``rows``, in rank order, {name: array}) as a
    checkpoint's ``<prefix><name>`` arrays, workers first: the sender
    states (``Sender.state``, prefix ``sender.``), the torch engine's
    buffers (``held_buffers``). ``worker_rows`` reads them back."""
    return {prefix + name: np.stack([row[name] for row in rows]) for name in rows[0]}


def worker_rows(arrays: dict, prefix: str, workers: int) -> dict:
    """A checkpoint's ``worker_arrays`` of ``prefix``, as {rank: {name: its
    row}} ({}: none held)."""
    held = [k for k in arrays if k.startswith(prefix)]
    return {r: {k[len(prefix):]: arrays[k][r] for k in held}
            for r in range(workers)} if held else {}


def held_shapes(workers: int, sender: dict | None = None, buffers: dict | None = None,
                per_worker: bool = False) -> dict:
    """More arrays a checkpoint holds, as ``shapes``'s ``extra``: each
    worker's compressor state (``sender``: one worker's sender layout,
    {name: (shape, dtype)}) as ``sender.<name>``, workers first, and the
    model's buffers (``buffers``: ``buffer_arrays``), each worker's
    (workers first) where ``per_worker``."""
    extra = {"sender." + name: ((workers,) + tuple(shape), dtype)
             for name, (shape, dtype) in (sender or {}).items()}
    lead = (workers,) if per_worker else ()
    extra.update({name: (lead + arr.shape, arr.dtype) for name, arr in (buffers or {}).items()})
    return extra


def buffer_arrays(problem) -> dict:
    """The model's buffers as a checkpoint's ``buffer.<name>`` arrays ({}: none)."""
    return held_buffers(problem.state())


def model_buffers(problem) -> dict:
    """The model's buffers as every checkpoint's meta records them
    (``buffers``: {name: shape as stored}; {}: none), whether or not its
    engine's checkpoints hold their values: ``check`` refuses a checkpoint
    of a model whose buffers differ."""
    return {k[len("buffer."):]: list(v.shape) for k, v in buffer_arrays(problem).items()}


def held_buffers(state: dict | None) -> dict:
    """A model's buffers (``Problem.state()``) as a checkpoint's
    ``buffer.<name>`` arrays ({}: none); at least 1-d, as a checkpoint
    stores them (a counter is a 0-d tensor)."""
    return {"buffer." + k: np.atleast_1d(v) for k, v in (state or {}).items()}


def restore_buffers(ckpt, problem) -> None:
    """Load a checkpoint's ``buffer.<name>`` arrays into the model (none: nothing)."""
    prefix = "buffer."
    load_buffers(problem, {k[len(prefix):]: v for k, v in ckpt.arrays.items()
                           if k.startswith(prefix)})


def load_buffers(problem, saved: dict) -> None:
    """Load buffers as a checkpoint holds them ({name: at least 1-d array})
    into the model, each in its own shape (none: nothing)."""
    if saved:
        shapes = {k: np.shape(v) for k, v in problem.state().items()}
        problem.load_state({k: v.reshape(shapes[k]) for k, v in saved.items()})


def private_copies(strategy) -> bool:
    """Whether workers keep parameters of their own between exchanges with
    the server (local-sgd's and easgd's), which no checkpoint holds; an
    async worker's copy is read afresh at each exchange, so the server's
    state and each worker's position are all a resume needs."""
    return Average in strategy.uses or Elastic in strategy.uses


def exact_checkpoints(strategy) -> bool:
    """Whether an engine checkpoints ``strategy`` at step boundaries, exactly
    (a resumed run replays nothing): its workers share the parameters and
    meet at every step (sync), or one worker runs alone (serial, which the
    torch engine does not run)."""
    return strategy.single_worker or (strategy.synchronous and strategy.shared_params)


def trajectory(config: dict) -> dict:
    """The settings of a run (``Resolved.config()``) that shape its
    trajectory: all but ``RESUMABLE``, as JSON keeps them (a checkpoint's
    read back compares equal)."""
    return json.loads(json.dumps({k: v for k, v in config.items() if k not in RESUMABLE},
                                 default=str))


def identity(problem, strategy, rule, workers: int, batch_size: int, seed: int,
             engine: str | None = None, settings: dict | None = None) -> dict:
    """What a checkpoint of this run records of it, and ``check`` compares;
    ``engine``: the registry name of the engine that writes and resumes it
    (``Engine.name``), whose meta only that engine reads; ``settings``: the
    run's ``trajectory`` (``Engine.settings``; None: not compared)."""
    ident = {"problem": problem_key(problem.name), "n_params": int(problem.n_params),
             "dtype": str(np.dtype(problem.dtype)), "strategy": strategy.name,
             "rule": getattr(rule, "name", str(rule)), "workers": int(workers),
             "batch_size": int(batch_size), "seed": int(seed),
             "buffers": model_buffers(problem), **data_identity(problem)}
    if engine is not None:
        ident["engine"] = str(engine)
    if settings is not None:
        ident["settings"] = dict(settings)
        if "problem" in settings:
            ident["settings"]["problem"] = problem_key(settings["problem"])
    return ident


def problem_file(name) -> str | None:
    """The file a problem's name names after its colon (``libsvm:PATH``),
    where it exists here: its absolute path, links resolved; else None."""
    kind, sep, arg = name.partition(":") if isinstance(name, str) else ("", "", "")
    if sep and arg and "://" not in arg and os.path.exists(arg):
        return os.path.realpath(arg)
    return None


def problem_key(name):
    """A problem's name as a checkpoint records and compares it: a file it
    names by its absolute path (``problem_file``), so that the same file
    named from another directory is the same problem; any other as it is."""
    path = problem_file(name)
    return name if path is None else f"{name.partition(':')[0]}:{path}"


def data_identity(problem) -> dict:
    """What a checkpoint records of the data the run trains on (``DATA``):
    the number of examples, and the problem's ``data_digest`` where it
    gives one; a size not known yet (data Spark has not loaded) is left out."""
    out = {}
    n = getattr(problem, "n_examples", None)
    if isinstance(n, (int, np.integer)):
        out["n_examples"] = int(n)
    digest = getattr(problem, "data_digest", None)
    digest = digest() if callable(digest) else None
    if digest is not None:
        out["data"] = digest
    return out


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save(directory, updates: int, meta: dict, arrays: dict, keep: int = KEEP) -> Path:
    """Write one checkpoint atomically; remove all but the newest ``keep``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt-{int(updates):012d}.npz"
    doc = {"format": FORMAT, "version": VERSION, **meta}
    members = {k: np.ascontiguousarray(to_host(v)) for k, v in arrays.items()}
    members["meta"] = np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **members)
            f.flush()
            os.fsync(f.fileno())
        _keep_if_damaged(path)
        os.replace(tmp, path)
    except BaseException:
        with_suppressed_unlink(tmp)
        raise
    _fsync_dir(directory)
    mine = [p for p in checkpoint_files(directory)
            if p == path or _identity_refusal(read_meta(p), doc) is None]
    for old in mine[keep:]:
        if old != path:
            with_suppressed_unlink(old)
    return path


def _keep_if_damaged(path: Path) -> None:
    """A damaged checkpoint where a save is about to write (a resumed run
    reaching the step of the one it skipped) is moved aside, never replaced."""
    if not path.exists():
        return
    try:
        read(path)
    except CheckpointError:
        _move_aside(path)


def read_meta(path) -> dict | None:
    """A checkpoint's meta alone (the other members are not read), or None
    where it cannot be read: a damaged file, which no save prunes."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes().decode())
    except Exception:  # noqa: BLE001 - unreadable: not this run's for sure
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def with_suppressed_unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def checkpoint_files(directory) -> list[Path]:
    """The checkpoints in ``directory``, newest (most updates) first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name, reverse=True)


def read(path) -> Checkpoint:
    """Read and check one file; raise CheckpointError (one line) if it is
    not a whole monsoon checkpoint."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}  # reads every member: CRCs checked
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except Exception as exc:  # noqa: BLE001 - any failure to read is the same refusal
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"checkpoint {path} is corrupt or partial ({reason})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a monsoon checkpoint")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {meta.get('version')}, "
                              f"this monsoon reads version {VERSION}")
    missing = _missing(meta, arrays)
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete (it holds no {missing})")
    return Checkpoint(path, meta, arrays)


def _missing(meta: dict, arrays: dict) -> str | None:
    """What a checkpoint's ``meta`` and ``arrays`` lack of what its writer
    always writes (``ALWAYS``, ``WRITES``; the workers' private copies: all
    of them or none), in words; None: it is whole."""
    keys, held = WRITES.get(meta.get("engine"), ((), ()))
    lacks = [repr(k) for k in ALWAYS + keys if k not in meta]
    if not lacks and not {"step", "positions"} & {*meta, *arrays}:
        lacks.append("'step' or 'positions'")
    workers = meta.get("workers") if any(k.startswith("worker.") for k in arrays) else 0
    held = ("params",) + held + tuple(
        PRIVATE.format(r) for r in range(workers if isinstance(workers, int) else 0))
    lacks += [f"array {k!r}" for k in held if k not in arrays]
    return ", ".join(lacks) or None


def check(ckpt: Checkpoint, expect: dict, shapes: dict) -> None:
    """Refuse a checkpoint of another run, written by another engine (each
    engine's meta is its own; one written before the engine was recorded
    passes), or with other shapes."""
    refusal = (_identity_refusal(ckpt.meta, {k: v for k, v in expect.items() if k != "settings"})
               or _buffers_refusal(ckpt, expect, shapes))
    if refusal is not None:
        raise CheckpointError(f"checkpoint {ckpt.path} {refusal}")
    for name, (shape, dtype) in shapes.items():
        arr = ckpt.arrays.get(name)
        if arr is None and name.startswith("sender."):
            raise CheckpointError(f"checkpoint {ckpt.path} {_no_compressor_state(ckpt, expect)}")
        if arr is None:
            raise CheckpointError(f"checkpoint {ckpt.path} has no {name!r}; it was written by "
                                  "another strategy or rule")
        if tuple(arr.shape) != tuple(shape) or str(arr.dtype) != str(np.dtype(dtype)):
            raise CheckpointError(f"checkpoint {ckpt.path}: {name} has shape {arr.shape} "
                                  f"{arr.dtype}, this run needs {tuple(shape)} "
                                  f"{np.dtype(dtype)}")
    # the settings last: a missing array above says more (which options it was written with)
    refusal = _identity_refusal(ckpt.meta, expect)
    if refusal is None:
        return
    compress = (expect.get("settings") or {}).get("compress", "none")
    written = (ckpt.meta.get("settings") or {}).get("compress", compress)
    if written != compress != "none" and not any(k.startswith("sender.") for k in ckpt.arrays):
        refusal = _no_compressor_state(ckpt, expect)
    raise CheckpointError(f"checkpoint {ckpt.path} {refusal}")


def _buffers_refusal(ckpt: Checkpoint, expect: dict, shapes: dict) -> str | None:
    """Why ``ckpt`` was written for a model whose buffers (names and
    shapes) are not this one's (None: they are, or nothing says): its meta's
    ``buffers`` against this model's (``identity``); in a checkpoint written
    before the meta recorded them, its ``buffer.<name>`` arrays against
    those ``shapes`` asks for, or any at all where this model has none."""
    prefix = "buffer."
    theirs, mine = ckpt.meta.get("buffers"), expect.get("buffers")
    if theirs is None:  # an older checkpoint: its arrays say what it holds
        theirs = {k[len(prefix):]: list(v.shape) for k, v in ckpt.arrays.items()
                  if k.startswith(prefix)}
        wanted = {k[len(prefix):]: list(shape) for k, (shape, _) in shapes.items()
                  if k.startswith(prefix)}
        if wanted and not theirs:
            return (f"holds no model buffers and this model has {len(wanted)} "
                    f"({', '.join(sorted(wanted))}): it was written for a model without "
                    "them, or by an older monsoon that kept none; resume with the model it "
                    "was written for, or start a new run without --resume")
        mine = wanted if wanted or mine == {} else None  # None: not told, not compared
    if mine is None or theirs == mine:
        return None
    if not theirs or not mine:
        how = (f"this model has none, the checkpoint holds {len(theirs)}: " if theirs else
               f"the checkpoint holds none, this model has {len(mine)}: ")
        how += ", ".join(sorted(theirs or mine))
    else:
        differ = sorted(name for name in {*theirs, *mine} if theirs.get(name) != mine.get(name))
        first = differ[0]
        shown = {k: "absent" if v is None else f"shape {tuple(v)}"
                 for k, v in (("checkpoint", theirs.get(first)), ("model", mine.get(first)))}
        how = (f"{first}: {shown['checkpoint']} in the checkpoint, {shown['model']} in this "
               f"model" + (f"; {len(differ) - 1} more differ" if len(differ) > 1 else ""))
    return (f"was written for another model: its buffers differ from this model's ({how}); "
            "resume with the model it was written for, or start a new run without --resume")


def _no_compressor_state(ckpt: Checkpoint, expect: dict) -> str:
    """Why a checkpoint lacks the compressor state this run needs, and what
    to do: written with this very --compress and settings, an older
    monsoon wrote it (it held no such state then), so only a new run is
    exact; another setting that differs is named as for any checkpoint."""
    compress = (expect.get("settings") or {}).get("compress")
    if compress is not None and (ckpt.meta.get("settings") or {}).get("compress") == compress:
        other = _identity_refusal(ckpt.meta, expect)
        if other is not None:  # another setting (--no-error-feedback): it keeps no state
            return other
        return (f"holds no compressor state, though it was written with --compress {compress} "
                "(by an older monsoon, which kept none); start a new run without --resume")
    return ("holds no compressor state (it was written without --compress, or by an older "
            "monsoon); resume with the options it was written with")


def _identity_refusal(meta: dict | None, expect: dict) -> str | None:
    """Why a checkpoint's ``meta`` is not of the run ``expect`` describes
    (None: it is). The engine and each of ``settings`` are compared only
    where both name them: a checkpoint written before they were recorded
    resumes as it did then."""
    if meta is None:
        return "cannot be read"
    wrote, mine = meta.get("engine"), expect.get("engine")
    if wrote is not None and mine is not None and wrote != mine:
        return (f"was written by the {wrote} engine, this run's is the {mine} engine; resume "
                f"it with --engine {wrote}, or start a new run without --resume")
    theirs, ours = meta.get("settings") or {}, expect.get("settings") or {}
    same = {"problem": lambda a, b: problem_key(a) == problem_key(b)}
    differ = [(key, expect[key], meta.get(key)) for key in IDENTITY
              if key in expect and not same.get(key, operator.eq)(meta.get(key), expect[key])]
    differ += [(key, ours[key], theirs[key]) for key in ours
               if key in theirs and not same.get(key, operator.eq)(theirs[key], ours[key])]
    if not differ:
        return _data_refusal(meta, expect)
    key, this, its = differ[0]
    return (f"is from another run: its {key} is {its!r}, this run's is {this!r}; resume with "
            "the same problem and settings, or start a new run without --resume")


def _data_refusal(meta: dict, expect: dict) -> str | None:
    """Why a checkpoint of this problem was written on other data than this
    run's (``DATA``; None: the same, or nothing says: each is compared
    only where both record it)."""
    differ = [key for key in DATA if key in meta and key in expect and meta[key] != expect[key]]
    if not differ:
        return None
    if differ[0] == "n_examples":
        how = (f"it trained on {meta['n_examples']} examples, this run's data has "
               f"{expect['n_examples']}")
    else:
        how = (f"as many examples, other values: its data digest is {meta['data'][:12]}, "
               f"this run's {expect['data'][:12]}")
    return (f"was written on other data: the data differ from the checkpoint's ({how}); "
            "resume with the data it was written on, or start a new run without --resume")


def load_latest(directory, expect: dict, shapes: dict, warn=None) -> Checkpoint:
    """The newest checkpoint in ``directory`` that reads whole and belongs
    to this run. Each newer one refused is reported through ``warn`` (stderr
    by default); if none is usable, the newest one's refusal is raised."""
    files = checkpoint_files(directory)
    if not files:
        raise CheckpointError(f"no checkpoint in {directory}; nothing to resume from")
    warn = warn or (lambda line: print(f"monsoon: warning: {line}", file=sys.stderr))
    refusals = []
    for path in files:
        try:
            ckpt = read(path)
            check(ckpt, expect, shapes)
        except CheckpointError as exc:
            refusals.append(str(exc))
            continue
        for line in refusals:
            warn(f"{line}; using the older {path.name}")
        return ckpt
    raise CheckpointError(refusals[0] + (f" (and {len(refusals) - 1} older ones refused too)"
                                         if len(refusals) > 1 else ""))


def shapes(w0, rule, extra: dict | None = None) -> dict:
    """The arrays a checkpoint of this run holds: ``params``, the rule
    state's ``state.<field>``, and ``extra``, as {name: (shape, dtype)}."""
    template = rule.init(w0.size, w0.dtype)
    out = {"params": (w0.shape, w0.dtype), **(extra or {})}
    for name, arr in zip(template._fields, template):
        out["state." + name] = (arr.shape, arr.dtype)
    return out


def finite(params) -> bool:
    """Whether every parameter is finite (a checkpoint holds none that is not)."""
    return bool(np.isfinite(np.asarray(to_host(params))).all())


def next_checkpoint(position: int, every: int) -> int | None:
    """When the next checkpoint is due: the first multiple of ``every``
    after ``position`` (None: ``every`` is 0, no checkpoints)."""
    return (int(position) // every + 1) * every if every else None


def check_resume(engine, problem, strategy, rule, w0, workers: int, batch_size: int,
                 seed: int, directory=None):
    """Refuse, in one line and before the engine starts anything (Ray,
    Spark, torchrun), a ``--resume`` folder (``directory``: the checkpoints
    folder asked about; default the engine's ``resume_dir``) with no good
    checkpoint of this run, or a run that ``resume_refusal`` refuses, and
    return the checkpoint it would resume from (None where there is nothing
    to resume). The engine reads it again to resume, and names any it
    passes over."""
    from ..strategies.base import STAGES

    directory = directory or getattr(engine, "resume_dir", None)
    if not directory:
        return None
    refusal = resume_refusal(engine, problem, strategy)
    if refusal is not None:
        raise CheckpointError(f"--resume: {refusal}")
    if STAGES in strategy.needs(workers):  # pipeline refuses checkpoints
        return None
    held = getattr(engine, "checkpoint_shapes", None)
    extra = held(problem, strategy, w0, workers) if held is not None else None
    return load_latest(directory, identity(problem, strategy, rule, workers, batch_size, seed,
                                           engine.name, getattr(engine, "settings", None)),
                       shapes(w0, rule, extra), warn=lambda line: None)


def remove_others(directory, expect: dict, shapes: dict, resuming: bool = False,
                  warn=None, keep_mine: bool = True, remove=None,
                  launch: str | None = None) -> list[Path]:
    """Remove the checkpoints in ``directory`` that are another run's
    (``check`` against ``expect`` and ``shapes`` refuses them), and return
    them. A new run in a used run folder starts this way: otherwise a
    previous run's checkpoints would sit among its own, outrank them, and be
    named as where to carry on from. Those of this very run stay where
    ``keep_mine``: ``--resume`` reads them, and a torchrun restart resumes
    from those its launch wrote (``launch``, not None: only those whose
    meta's ``launch`` is it stay); without it, those of an earlier run with
    the same identity go too (the new run starts over, and its own must not
    be outranked).

    A damaged one (``read`` refuses it) is nobody's for sure, and is never
    removed: where the run resumes from ``directory`` (``resuming``) it
    stays, and ``load_latest`` names it with the checkpoint used instead;
    otherwise it is moved aside to ``<name>.damaged`` (no longer a
    checkpoint's name, so never read, counted or pruned again), and
    ``warn`` (stderr by default) says so in one line. ``remove(path)``:
    how another run's checkpoint goes (deleted, by default)."""
    warn = warn or (lambda line: print(f"monsoon: warning: {line}", file=sys.stderr))
    removed = []
    for path in checkpoint_files(directory):
        try:
            ckpt = read(path)
        except CheckpointError as exc:
            if not resuming:
                aside = _move_aside(path)
                warn(f"{exc}; moved it aside to {aside.name}" if aside else
                     f"{exc}; left in place (it could not be moved aside)")
            continue
        try:
            check(ckpt, expect, shapes)
        except CheckpointError:
            pass
        else:
            if keep_mine and launch in (None, ckpt.meta.get("launch")):
                continue
        (remove or with_suppressed_unlink)(path)
        removed.append(path)
    return removed


def _move_aside(path: Path) -> Path | None:
    """Rename a damaged checkpoint to a free ``<name>.damaged[.N]``; None
    where it cannot be renamed."""
    for n in range(1000):
        aside = path.with_name(path.name + ".damaged" + (f".{n}" if n else ""))
        if aside.exists():
            continue
        try:
            os.replace(path, aside)
        except OSError:
            return None
        return aside
    return None


def resume_refusal(engine, problem, strategy) -> str | None:
    """Why ``engine``'s checkpoints of this run cannot be resumed (None: they
    can), whether or not a folder to resume is given: ``check_resume``
    refuses such a ``--resume``, and an interrupted or failed run does not
    offer one. ``inexact_resume`` gives the reason and what to do apart.

    A compressed run whose compressor state (error-feedback residuals,
    random streams, PowerSGD's Q) this engine's checkpoints of this strategy
    do not hold (``engine.keeps_compressor_state``: the sim's, and the
    exact ones of the local engine, serial's and sync's, and of the torch
    engine, sync's); a model with buffers
    (BatchNorm's running statistics, ``Problem.state()``) on an engine whose
    checkpoints do not hold them (``engine.keeps_buffers(strategy)``: the
    sim, which replays its run, the local engine, every strategy's, and the
    torch engine's sync, every rank's): the resumed
    model would restart them and end unlike the uninterrupted one; a
    strategy with private worker copies (local SGD, EASGD) on an engine that
    does not checkpoint them (``engine.keeps_private_copies`` False: ray,
    spark, torch), or not their inner rule's state where it has any
    (``engine.keeps_inner_state`` False: the local engine)."""
    found = inexact_resume(engine, problem, strategy)
    return None if found is None else "; ".join(found)


def inexact_resume(engine, problem, strategy) -> tuple[str, str] | None:
    """``resume_refusal``'s reason, as (what the checkpoints lack and what
    follows, what to do instead), or None."""
    keeps_buffers = getattr(engine, "keeps_buffers", lambda strategy: False)
    if not keeps_buffers(strategy) and problem.state():
        return (f"the {engine.name} engine's checkpoints of {strategy.name} do not hold "
                "the model's buffers (BatchNorm's running statistics), so the resumed model "
                "would not end as this one",
                "start a new run (the local engine's and the sim's checkpoints, and sync's "
                "on the torch engine, hold them; a checkpoint resumes on the engine that "
                "wrote it)")
    inner = getattr(strategy, "local_rule", None)
    if private_copies(strategy) and inner is not None and _stateful(inner) \
            and not getattr(engine, "keeps_inner_state", True):
        return (f"the {engine.name} engine's checkpoints of {strategy.name} do not hold its "
                f"workers' inner rule state (--rule {inner.name}: its state or learning-rate "
                "schedule), so the resumed run would not carry on as this one",
                "start a new run (the sim's checkpoints hold it; plain sgd at a constant rate "
                "keeps none)")
    lost = _copies_not_kept(engine, strategy)
    if lost is not None:
        return (lost,
                "start a new run (the local and sim engines' checkpoints hold them; a "
                "checkpoint resumes on the engine that wrote it)")
    compression = getattr(engine, "compression", None)
    keeps = getattr(engine, "keeps_compressor_state", None)
    if compression is not None and compression.stateful and \
            not (keeps is not None and keeps(strategy)):
        return (f"the {engine.name} engine's checkpoints of {strategy.name} do not hold "
                f"the workers' compressor state (--compress {compression.describe()}: "
                "error-feedback residuals, random streams), so the resumed run would not "
                "carry on as this one",
                "start a new run (sync on the local and torch engines, and every strategy "
                "on the sim, keep it; a checkpoint resumes on the engine that wrote it)")
    return None


def writes_none(engine, strategy, workers: int) -> tuple[str, str] | None:
    """Why ``engine`` writes no checkpoint at all of ``strategy`` on
    ``workers`` workers, and the engines whose checkpoints would hold the
    run ("" where none would), or None where it writes them; the same rule
    on every engine: a strategy run in pipeline stages (no engine
    checkpoints them yet), or one with private worker copies (local SGD,
    EASGD) on an engine that does not keep them
    (``engine.keeps_private_copies`` False: ray, spark, torch).
    ``engines.options.refuse_checkpoints`` refuses ``--checkpoint-every``
    and ``--resume`` for such a run."""
    from ..strategies.base import STAGES

    if STAGES in strategy.needs(workers):
        return f"the {strategy.name} strategy does not write or resume checkpoints yet", ""
    lost = _copies_not_kept(engine, strategy)
    return None if lost is None else (lost, "the local or sim engine")


def _copies_not_kept(engine, strategy) -> str | None:
    """That ``engine``'s checkpoints do not hold ``strategy``'s private
    worker copies, in words; None where they do or it has none."""
    if private_copies(strategy) and not getattr(engine, "keeps_private_copies", True):
        return (f"the {engine.name} engine keeps no checkpoints of {strategy.name}'s "
                "private worker copies")
    return None


def _stateful(rule) -> bool:
    """Whether ``rule`` carries state from one step to the next: arrays
    (momentum, AdaGrad's sums) or a schedule that counts its steps."""
    return bool(rule.init(1, np.float64)) or rule.schedule.kind != "constant"


def restore_state(ckpt: Checkpoint, state) -> None:
    """Copy a rule state's fields (``state.<field>``) out of ``ckpt``."""
    for name, arr in zip(state._fields, state):
        arr[...] = ckpt.arrays["state." + name]


def state_arrays(state) -> dict:
    return {"state." + name: arr for name, arr in zip(state._fields, state)}


class Checkpointer:
    """One run's checkpoints, as an engine's driver (or rank 0) keeps them:
    the identity of the run, where to write, how often, where to resume
    from, and the recorder whose rows travel with each checkpoint.

    ``load`` returns the checkpoint to resume from (None: a fresh run),
    checked against this run and the shapes given, and hands its loss curve
    to the recorder; ``start``, the ``Start`` read from it; ``due(updates)``
    says when the next one is due; ``save`` writes one with the settled
    rows up to it."""

    def __init__(self, directory, every: int, resume_dir, ident: dict, recorder=None):
        self.directory = directory
        self.every = every if directory else 0
        self.resume_dir = resume_dir
        self.ident = ident
        self.recorder = recorder
        self.last_path = None
        self.resumed_from = None  # the checkpoint ``load`` returned
        self.next_at = None
        self.refused = False  # a save of parameters not finite was refused

    @classmethod
    def for_engine(cls, engine, problem, strategy, rule, workers, batch_size, seed, recorder):
        return cls(engine.checkpoint_dir, engine.checkpoint_every, engine.resume_dir,
                   identity(problem, strategy, rule, workers, batch_size, seed, engine.name,
                            getattr(engine, "settings", None)),
                   recorder)

    def load(self, w0, rule, extra_shapes: dict | None = None):
        if not self.resume_dir:
            return None
        ckpt = load_latest(self.resume_dir, self.ident, shapes(w0, rule, extra_shapes))
        self.resumed_from = ckpt.path
        if self.recorder is not None:
            self.recorder.resume(ckpt.meta["rows"])
        return ckpt

    def start(self, w0, rule, workers: int, extra_shapes: dict | None = None,
              needs: tuple = ()) -> Start:
        """Where this run starts: the checkpoint ``load`` returns (with the
        meta keys ``needs``, ``Start.at``), or the beginning."""
        saved = self.load(w0, rule, extra_shapes)
        return Start.fresh(w0, workers) if saved is None else Start.at(saved, rule, workers,
                                                                         needs)

    def due(self, updates: int) -> bool:
        if not self.every:
            return False
        if self.next_at is None:
            self.next_at = next_checkpoint(updates, self.every)
        return updates >= self.next_at

    def save(self, updates: int, now: float, params, state, meta: dict,
             arrays: dict | None = None, rows=None):
        """Write one checkpoint named by ``updates``; ``meta`` may say more
        (its ``updates`` wins). The recorder's settled rows up to it travel
        with it, or ``rows`` where given. Parameters not finite are never
        written (None: the run diverged, whatever stopped it; a resume takes
        the last finite checkpoint, ``last_path``, which stays)."""
        if not self.directory:
            return None
        if not finite(params):
            if not self.refused:  # once a run: its later ones are as far gone
                kept = self.last_path or self.resumed_from
                print(f"monsoon: no checkpoint at update {updates} or after: the parameters "
                      "are not finite (the run diverged: lower the learning rate)"
                      + (f"; the last finite one is {kept}" if kept else ""), file=sys.stderr)
            self.refused = True
            return None
        self.next_at = next_checkpoint(updates, self.every)
        doc = {**self.ident, "updates": updates, "time_s": now, **meta}
        if rows is None:
            rows = self.recorder.settled_rows() if self.recorder is not None else []
        doc["rows"] = [dict(r) for r in rows if r["updates"] <= doc["updates"]]
        members = {"params": params, **(arrays or {}), **state_arrays(state)}
        self.last_path = save(self.directory, updates, doc, members)
        return self.last_path

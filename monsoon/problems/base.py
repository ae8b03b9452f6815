"""The Problem protocol: what is trained, independent of how it is parallelised.

A problem owns a flat parameter vector (one contiguous float32 or float64
array), a gradient oracle ``gradient(w, indices) -> (loss, grad)`` returning
the MEAN loss and MEAN gradient over the given examples, and the full-data
objective ``loss(w)`` that every strategy reports the same way.

Invariants:
- ``gradient`` reads the parameters from ``w`` itself (zero copy where the
  problem can alias it), and returns a gradient buffer owned by the problem,
  valid until the next call; pass ``out=`` to have it written elsewhere, and
  ``accumulate=True`` to have it ADDED to ``out`` (the caller guarantees
  ``out`` holds zeros, which saves the problem a pass over it).
- ``loss(w)``: the mean objective over all training examples (runs' measure).

Optional capabilities are declared on ``Problem`` itself, with a neutral
default, so that engines and the recorder read them instead of probing:
- ``evaluate(w) -> {"loss", "accuracy", "val_loss", "val_accuracy"}``: every
  reported figure at ``w`` (the recorder and ``final_loss`` use it); it
  changes no state. Default: the loss alone.
- ``state()`` / ``load_state(s)``: trained state beside the parameters
  (BatchNorm buffers; None and a no-op by default); engines return each
  worker's, and the strategy's ``buffers`` rule combines them (``buffers.py``).
- ``shared_data()`` / ``unlink_shared()``: a context within which pickles
  refer to the data in shared memory (the local engine's worker processes),
  and the removal of its file once every worker mapped it. Default: none.
- Attributes that are None where a problem lacks the capability (a problem
  defines them as methods or values): ``prefetch`` (start loading a worker's
  next batch), ``seed_rng`` (seed a worker's random draws from its gradients
  done: an engine forks torch's generator only for it; ``draws_random()``
  says if training draws any), ``sgd_pass`` (a compiled per-example SGD loop,
  ``sgd_pass(w, order, lr) -> mean loss``), ``evaluate_many`` (``evaluate``
  at many points in one pass over the data), ``constant_loss`` (the best
  constant predictor's loss), ``inverse_variance`` (1 / each feature's
  variance: L-BFGS's metric, MLlib's standardization), ``row_ids`` (the
  data's ids of the model's rows, saved beside it), and the torch model's:
  ``model_at`` (the module at ``w``), ``module``, ``place`` (``devices.py``),
  ``worker_devices``, ``matrix_slices`` (PowerSGD), ``backward`` (the torch
  engine's gradient buckets), ``fewest_rows`` (a pass's fewest examples);
  ``uses_torch`` (True for a ``TorchModel``, read without importing torch).
"""
from __future__ import annotations

import inspect
from abc import ABC, abstractmethod

import numpy as np

from ..errors import ConfigError


def check_finite(name: str, values, rows=None) -> None:
    """Refuse data holding NaN or Inf, naming the first row that does.
    ``values`` is an array (its first axis the rows), or a sparse matrix's
    stored values with ``rows`` the matrix's ``indptr``."""
    values = np.asarray(values)
    if values.dtype.kind not in "fc" or values.size == 0:
        return
    bad = ~np.isfinite(values)
    if not bad.any():
        return
    if rows is not None:
        first = int(np.flatnonzero(bad)[0])
        row, value = int(np.searchsorted(rows, first, side="right") - 1), values[first]
    else:
        by_row = bad.reshape(len(values), -1)
        row = int(np.flatnonzero(by_row.any(axis=1))[0])
        value = values.reshape(len(values), -1)[row][by_row[row]][0]
    raise ConfigError(f"{name} row {row} holds {value}; NaN and Inf cannot be trained on: "
                      "fix or remove that row")


class Problem(ABC):
    name: str = "problem"
    # training defaults (lr, batch_size, epochs or steps) that suit this
    # problem; catalog problems carry their entry's, instances keep them
    # ("lr_per_example": lr is sgd_pass's step, times the batch size for
    # mini-batch SGD: ``config.resolve``)
    defaults: dict = {}
    dtype: np.dtype
    n_params: int
    n_examples: int

    @abstractmethod
    def initial_params(self, seed: int) -> np.ndarray:
        """A fresh flat parameter vector, a pure function of the seed."""

    @abstractmethod
    def gradient(self, w: np.ndarray, indices: np.ndarray, out: np.ndarray | None = None,
                 accumulate: bool = False):
        """Mean loss and mean gradient over ``indices`` at parameters ``w``."""

    @abstractmethod
    def loss(self, w: np.ndarray) -> float:
        """Full-training-set objective at ``w`` (mean over examples)."""

    # Capabilities, None where a problem has none (the module's docstring);
    # a subclass defines them as methods or values.
    prefetch = seed_rng = sgd_pass = evaluate_many = constant_loss = inverse_variance = None
    row_ids = None
    model_at = module = place = worker_devices = matrix_slices = backward = fewest_rows = None
    uses_torch = False

    def evaluate(self, w) -> dict:
        """Every reported figure at ``w``; here the loss alone."""
        return {"loss": float(self.loss(w))}

    def shared_data(self):
        """A context within which pickles refer to the data in shared memory;
        here none: a problem is pickled as it is."""
        import contextlib

        return contextlib.nullcontext()

    def unlink_shared(self) -> None:
        """Remove the shared data's file once every worker mapped it (or the
        start failed); here none."""

    def draws_random(self) -> bool:
        """Whether training passes draw random numbers (Dropout's masks), so
        that workers splitting a batch compute other gradients than one
        pass over it. Here: where the problem seeds its draws (``seed_rng``);
        a torch model finds out whether it draws any."""
        return self.seed_rng is not None

    def state(self):
        """Trained state beside the parameters (BatchNorm buffers), or None."""
        return None

    def load_state(self, state) -> None:
        """Take back what ``state()`` or ``kept_state()`` gave; a problem
        without any has nothing to load."""

    def kept_state(self):
        """A copy of ``state()`` to put back later with ``load_state``,
        taken where the state lives (a device: no wait for it); None if none."""
        return self.state()

    def keep_trained(self, w) -> None:
        """Leave the problem's own model, if it has one, holding the run's
        final parameters ``w`` (a copy): called once a run ends, so a
        user's model ends trained whichever strategy and engine ran. A
        problem without a model keeps nothing."""

    def array_device(self):
        """Where an engine whose workers share this process keeps the
        parameters, gradients and rule state: None for NumPy arrays in host
        memory (``monsoon/arrays.py``; a torch problem on a GPU says its device)."""
        return None

    def for_worker(self, rank: int, workers: int) -> "Problem":
        """The instance a worker uses. Workers must not share mutable buffers
        (a model, a gradient buffer), so threads get a copy; processes receive
        a pickled copy already and may return ``self``."""
        return self.copy()

    def copy(self) -> "Problem":
        import copy

        return copy.deepcopy(self)

    def describe(self) -> dict:
        return {"name": self.name, "n_params": int(self.n_params),
                "n_examples": int(self.n_examples), "dtype": str(np.dtype(self.dtype))}

    # the attributes that hold the data trained on (arrays, or a SciPy sparse
    # matrix), which ``data_digest`` digests; none by default
    data_fields: tuple = ()

    def data_digest(self) -> str | None:
        """A digest (SHA-256, hex) of the data trained on, its
        ``data_fields``' dtypes, shapes and bytes, which a checkpoint records
        so that ``--resume`` refuses data that changed; None where the
        problem names none (a torch model's: its ``n_examples`` alone is
        compared). Taken once: the data is read-only."""
        if not self.data_fields:
            return None
        if self.__dict__.get("_data_digest") is None:
            self._data_digest = digest_arrays(getattr(self, f) for f in self.data_fields)
        return self._data_digest


class SharedDataProblem(Problem):
    """A NumPy problem whose data is read-only: workers share it and own only
    their gradient buffer ``_grad`` (a thread copy costs nothing)."""

    def for_worker(self, rank: int, workers: int) -> "Problem":
        import copy

        clone = copy.copy(self)
        clone._grad = np.zeros_like(self._grad)
        return clone


def digest_arrays(values) -> str:
    """SHA-256 (hex) of ``values``: NumPy arrays, or SciPy sparse matrices
    (their CSR parts), each with its dtype and shape."""
    import hashlib

    digest = hashlib.sha256()
    for value in values:
        if hasattr(value, "tocsr"):  # a sparse matrix: its shape, then its parts
            csr = value.tocsr()
            digest.update(repr(csr.shape).encode())
            parts = (csr.data, csr.indices, csr.indptr)
        else:
            parts = (value,)
        for arr in parts:
            arr = np.ascontiguousarray(arr)
            digest.update(f"{arr.dtype.str}{arr.shape}".encode())
            digest.update(arr.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def seed_worker(problem, seed: int | None, rank: int, done: int = 0) -> None:
    """Seed ``problem``'s random draws for worker ``rank`` (``seed_rng``),
    which made ``done`` gradients before (a resumed worker), where it has
    any. A plug-in's ``seed_rng(seed, rank)`` of two arguments (monsoon's
    older form) is called as such: its resumed runs draw anew, and ``seed``
    None (stop seeding, after an inline run) is not passed to it."""
    fn = problem.seed_rng
    if fn is None:
        return
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read: the current form
        params = None
    if params is None or len(params) >= 3 or any(
            p.kind is p.VAR_POSITIONAL for p in params):
        fn(seed, rank, done)
    elif seed is not None:
        fn(seed, rank)

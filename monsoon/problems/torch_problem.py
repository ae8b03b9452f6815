"""TorchProblem: any ``torch.nn.Module`` as a flat parameter vector.

The module's parameters are re-pointed to be views into ONE flat buffer (as
DDP's gradient buckets and Horovod's fusion buffer are), and the gradient
lands in one flat buffer too. Sharing, sending and averaging a model is then
one array operation, never a loop over tensors.

A fresh gradient is autograd's own tensors gathered by one ``torch.cat``
into the flat buffer (one pass); ``accumulate=True`` lets autograd add.

Training starts from the module as the user built it (``init="module"``,
DDP's behaviour: it broadcasts rank 0's ``state_dict`` at construction);
``init="seed"`` re-draws the weights from the run's seed instead (the
catalog's problems, so their published results stay the same).

Buffers (BatchNorm's running statistics and counter, or any other) are
trained state: gradient steps run in training mode and update the worker's
buffers; ``state()`` / ``load_state()`` carry them back to the caller, which
combines the workers' buffers by the strategy's rule (``buffers.py``).
Everything reported (``loss``, ``evaluate``) runs under ``module.eval()``
and ``torch.no_grad()`` and touches no buffer.

Data reaches worker processes through shared memory, not one pickled copy
per worker: ``shared_data()`` (a context the local engine enters while it
starts its processes) moves X and y (and the validation set) into one
block of shared memory once, where this process keeps using it too; pickles
made inside the context carry the block's name, so every process maps the
same pages. Outside it (Ray, a user's pickle) the data pickles by value.

``gradient(w, idx)`` aliases ``w``: if ``w`` is not the buffer the module
currently views, the module is re-pointed at it (no copy). A worker that
computes on shared memory (Hogwild!, sync on the local engine) therefore
reads the shared parameters directly, and one that computes on a private
copy (Downpour) reads its copy.

On a GPU (``place(device)``, ``monsoon/devices.py``) the module views one
flat device buffer instead: ``gradient`` copies ``w`` (host memory, where
the engine's rule updates it) there, computes, and copies the flat gradient
back into ``out``; the data is copied to each device once per process.
Copies and pickles are CPU problems that keep their target device.
"""
from __future__ import annotations

import contextlib
import copy
import weakref

import numpy as np
import torch

from .base import Problem, check_finite

_TORCH_DTYPES = {np.dtype("float32"): torch.float32, np.dtype("float64"): torch.float64}


class TorchProblem(Problem):
    """Train ``module`` on ``(X, y)`` under ``loss_fn(output, target)``, which
    must return the mean over the batch (the default of torch's losses)."""

    device = "cpu"          # where this instance computes now
    worker_devices = None   # the run's device map (``devices.assign``)
    _target = None          # where it moves at its first computation

    def __init__(self, module: torch.nn.Module, loss_fn, X, y, dtype="float32",
                 name: str = "torch", eval_batch: int = 65536, init_fn=None,
                 init: str = "module", val=None, val_fraction: float = 0.0,
                 val_seed: int = 0):
        tdtype = self._setup(name, dtype, init_fn, init, loss_fn, eval_batch)
        X = torch.as_tensor(X)
        y = torch.as_tensor(y)
        if len(X) != len(y):
            raise ValueError(f"X has {len(X)} rows but y has {len(y)}: they must match")
        if len(X) == 0:
            raise ValueError("the training set is empty")
        for label, data in (("X", X), ("y", y)):
            if data.is_floating_point():
                check_finite(label, data.detach().cpu().numpy())
        X, y, val = split_validation(X, y, val, val_fraction, val_seed)
        self.X = X.to(tdtype) if X.is_floating_point() else X
        self.y = y.to(tdtype) if y.is_floating_point() else y
        self.val = None
        if val is not None:
            vX, vy = (torch.as_tensor(v) for v in val)
            if len(vX) != len(vy):
                raise ValueError(f"val X has {len(vX)} rows but val y has {len(vy)}: "
                                 "they must match")
            self.val = (vX.to(tdtype) if vX.is_floating_point() else vX,
                        vy.to(tdtype) if vy.is_floating_point() else vy)
        self.classification = is_classification(loss_fn, self.y)
        self.n_examples = int(len(self.X))
        self._setup_module(module)

    def _setup(self, name, dtype, init_fn, init, loss_fn, eval_batch):
        """The settings every torch problem has; returns the torch dtype."""
        self.name = name
        self.init_fn = init_fn
        if init not in ("module", "seed"):
            raise ValueError(f"init must be 'module' (the module's own weights) or 'seed' "
                             f"(re-drawn from the run's seed), not {init!r}")
        self.init = init
        self.dtype = np.dtype(dtype)
        if self.dtype not in _TORCH_DTYPES:
            raise ValueError(f"dtype must be float32 or float64, not {dtype}")
        self.loss_fn = loss_fn
        self.eval_batch = eval_batch
        return _TORCH_DTYPES[self.dtype]

    def _setup_module(self, module):
        """Point the module's parameters at one flat buffer."""
        self.module = module.to(_TORCH_DTYPES[self.dtype])
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the module has no trainable parameters")
        self._shapes = [p.shape for p in params]
        self._sizes = [p.numel() for p in params]
        self.n_params = int(sum(self._sizes))
        self._params = params
        flat = torch.cat([p.detach().reshape(-1) for p in params]).numpy().copy()
        self._initial = flat.copy()
        self._initial_state = self.state()
        self._bound = None
        self._grad_out = None
        self._grad_bindings = {}
        self._bind(flat)
        self._bind_grad(np.zeros(self.n_params, dtype=self.dtype))

    @classmethod
    def from_spark(cls, source, module, loss_fn, features="features", label="label",
                   **options):
        """A problem on data held in Spark (a DataFrame, an RDD, a path Spark
        reads) that trains with ``engine="spark"``, each partition's rows
        tensors on its executor; see ``engines/spark/torch_data.py``."""
        from ..engines.spark.torch_data import SparkTorchData

        return SparkTorchData(source, module, loss_fn, features=features, label=label,
                              **options)

    @classmethod
    def from_dataset(cls, dataset, module, loss_fn, collate_fn=None, **options):
        """A problem over any map-style ``torch.utils.data.Dataset`` whose
        items ``collate_fn`` (default: torch's ``default_collate``) batches
        into ``(inputs, targets)``; see ``dataset_problem.DatasetProblem``."""
        from .dataset_problem import DatasetProblem

        return DatasetProblem(module, loss_fn, dataset, collate_fn=collate_fn, **options)

    # -- flat-buffer plumbing ---------------------------------------------
    def matrix_slices(self) -> list[tuple[int, int, int]]:
        """(offset, rows, cols) of each parameter with 2 or more dimensions in
        the flat vector (PowerSGD compresses these; vectors travel whole)."""
        out, offset = [], 0
        for shape, size in zip(self._shapes, self._sizes):
            if len(shape) >= 2:
                out.append((offset, int(shape[0]), size // int(shape[0])))
            offset += size
        return out

    def _views(self, array: np.ndarray):
        return self._tensor_views(torch.from_numpy(array))

    def _bind(self, w: np.ndarray) -> None:
        for p, view in zip(self._params, self._views(w)):
            p.data = view
        self._bound = w

    def _bind_grad(self, g: np.ndarray) -> None:
        """Make ``g`` the gradient buffer. The last few bindings are kept, so
        a caller alternating between two buffers (the replicated sync step's
        double-buffered slots) binds each once."""
        bound = self._grad_bindings.get(id(g))
        if bound is None or bound[0] is not g:
            self._check(g)
            if len(self._grad_bindings) >= 4:
                self._grad_bindings.clear()
            bound = (g, list(self._views(g)), torch.from_numpy(g))
            self._grad_bindings[id(g)] = bound
        self._grad_out, self._grad_views, self._grad_flat = bound

    # -- devices (``monsoon/devices.py``) -----------------------------------------
    def use_devices(self, devices) -> None:
        """The run's device map: worker k's copy computes on ``devices[k]``,
        this instance on ``devices[0]``; None: the CPU, as built."""
        self.worker_devices = list(devices) if devices else None
        self._target = self.worker_devices[0] if devices else None

    def target_device(self):
        return self._target

    def for_worker(self, rank: int, workers: int) -> "TorchProblem":
        clone = self.copy()
        if self.worker_devices:
            clone._target = self.worker_devices[rank % len(self.worker_devices)]
        return clone

    def _placed(self) -> None:
        """Move to the target device before the first computation there."""
        target = self._target
        if target is not None and target != self.device:
            self.place(target)

    def place(self, device) -> None:
        """Move the module, its buffers and the data to ``device`` (``cpu``,
        ``cuda``, ``cuda:N``); parameters and gradients stay host arrays."""
        device = str(device)
        if device == self.device:
            return
        if self.device != "cpu":
            self._to_host()
        if device != "cpu":
            self._to_device(device)

    def _to_device(self, device: str) -> None:
        dev = torch.device(device)
        tdtype = _TORCH_DTYPES[self.dtype]
        self.module.to(dev)  # the buffers; the parameters are re-pointed next
        self._dev_flat = torch.empty(self.n_params, dtype=tdtype, device=dev)
        self._dev_grad = torch.zeros(self.n_params, dtype=tdtype, device=dev)
        self._dev_grad_views = list(self._tensor_views(self._dev_grad))
        for p, view in zip(self._params, self._tensor_views(self._dev_flat)):
            p.data = view
            p.grad = None
        self._dev_flat.copy_(_host_tensor(self._bound))
        self._place_data(dev)
        self.device = device

    def _to_host(self) -> None:
        self._restore_data()
        self.module.to("cpu")
        for key in [k for k in self.__dict__ if k.startswith("_dev")]:
            del self.__dict__[key]
        self.device = "cpu"
        bound, self._bound = self._bound, None
        self._bind(bound)  # the parameters view the host array again

    def _place_data(self, dev) -> None:
        """In-memory data: one copy per device in this process (devices.py)."""
        from ..devices import to_device_once

        self._host_data = (self.X, self.y, self.val)
        self.X, self.y = to_device_once(self.X, dev), to_device_once(self.y, dev)
        if self.val is not None:
            self.val = tuple(to_device_once(v, dev) for v in self.val)

    def _restore_data(self) -> None:
        host = self.__dict__.pop("_host_data", None)
        if host is not None:
            self.X, self.y, self.val = host

    def _use(self, w: np.ndarray) -> None:
        """Compute at ``w`` from now on: re-point the module at it (CPU), or
        copy it to the device (always: the host rule updates it in place)."""
        if w is not self._bound:
            self._check(w)
        if self.device == "cpu":
            if w is not self._bound:
                self._bind(w)
            return
        self._bound = w
        self._dev_flat.copy_(_host_tensor(w))

    def _tensor_views(self, flat):
        offset = 0
        for shape, size in zip(self._shapes, self._sizes):
            yield flat[offset:offset + size].view(shape)
            offset += size

    def _check(self, w: np.ndarray) -> None:
        if w.shape != (self.n_params,) or w.dtype != self.dtype:
            raise ValueError(f"parameters have shape {w.shape} and dtype {w.dtype}; "
                             f"this problem needs shape ({self.n_params},) and {self.dtype}")

    # -- the Problem protocol ------------------------------------------------
    def initial_params(self, seed: int) -> np.ndarray:
        """The module's own parameters (``init="module"``), or parameters
        re-drawn from ``seed`` (``init="seed"``): by ``init_fn(module)`` when
        one was given, else by each layer's own ``reset_parameters``."""
        self.load_state(self._initial_state)  # a new run starts from the given buffers
        if self.init == "module":
            return self._initial.copy()
        fresh = self.model_at(self._initial)
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            if self.init_fn is not None:
                with torch.no_grad():
                    self.init_fn(fresh)
            else:
                layers = [m for m in fresh.modules() if hasattr(m, "reset_parameters")]
                if not layers:
                    return self._initial.copy()
                for layer in layers:
                    layer.reset_parameters()
        finally:
            torch.random.set_rng_state(gen_state)
        return torch.cat([p.detach().reshape(-1) for p in fresh.parameters()
                          if p.requires_grad]).numpy().astype(self.dtype, copy=True)

    def gradient(self, w, indices, out=None, accumulate=False):
        self._placed()
        if out is not None and out is not self._grad_out:
            self._bind_grad(out)
        if self.device != "cpu":  # computed on the device, brought back to ``out``
            loss = self.backward(w, indices, fresh=True)
            self._gather_grads(self._dev_grad, self._dev_grad_views)
            if accumulate:
                self._grad_flat += self._dev_grad.cpu()
            else:
                self._grad_flat.copy_(self._dev_grad)
            return loss, self._grad_out
        if w is not self._bound:
            self._check(w)
            self._bind(w)
        params = self._params
        if accumulate:  # autograd adds into .grad: point it at ``out``
            for p, view in zip(params, self._grad_views):
                p.grad = view
        loss = self.backward(w, indices, fresh=not accumulate)
        if not accumulate:
            self._gather_grads()
        return loss, self._grad_out

    def backward(self, w, indices, fresh: bool = True) -> float:
        """Forward and backward over ``indices`` at ``w``; returns the mean
        loss. ``fresh``: each parameter's ``.grad`` is autograd's own new
        tensor, for the caller to take (the torch engine's gradient hooks);
        otherwise autograd adds into the ``.grad`` already there."""
        self._placed()
        self._use(w)
        if fresh:  # autograd hands over fresh tensors: one copy, no zeroing pass
            for p in self._params:
                p.grad = None
        if not self.module.training:  # evaluation restores the mode it found
            self.module.train()
        xb, yb = self._rows(indices)
        loss = self.loss_fn(self.module(xb), yb)
        loss.backward()
        return float(loss.detach())

    def _rows(self, indices):
        """The examples ``indices``: inputs and targets, batched."""
        rows = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        if self.device != "cpu":
            rows = rows.to(self.X.device)
        return self.X.index_select(0, rows), self.y.index_select(0, rows)

    def _train_chunks(self):
        return self._chunks(self.X, self.y)

    def _val_chunks(self):
        """(chunks, number of examples) of the validation set, or None."""
        return None if self.val is None else (self._chunks(*self.val), len(self.val[0]))

    def _chunks(self, X, y):
        for start in range(0, len(X), self.eval_batch):
            yield X[start:start + self.eval_batch], y[start:start + self.eval_batch]

    def _gather_grads(self, flat=None, views=None) -> None:
        """Copy the fresh ``.grad`` tensors into the flat gradient buffer
        (``flat``, with its per-parameter ``views``: the device's)."""
        if flat is None:
            flat, views = self._grad_flat, self._grad_views
        grads = [p.grad for p in self._params]
        if all(g is not None for g in grads):
            torch.cat([g.reshape(-1) for g in grads], out=flat)
            return
        for view, g in zip(views, grads):  # a parameter the loss did not use
            if g is None:
                view.zero_()
            else:
                view.copy_(g)

    def loss(self, w) -> float:
        """Mean training loss at ``w``, in eval mode under no_grad."""
        return self._measure(w, self._train_chunks(), self.n_examples)[0]

    def evaluate(self, w) -> dict:
        """Every reported figure at ``w`` (eval mode, no_grad, no buffer
        touched): ``loss``, and where they apply ``accuracy``, ``val_loss``
        and ``val_accuracy``."""
        loss, acc = self._measure(w, self._train_chunks(), self.n_examples,
                                  self.classification)
        out = {"loss": loss}
        if acc is not None:
            out["accuracy"] = acc
        val = self._val_chunks()
        if val is not None:
            vloss, vacc = self._measure(w, *val, self.classification)
            out["val_loss"] = vloss
            if vacc is not None:
                out["val_accuracy"] = vacc
        return out

    def _measure(self, w, chunks, n: int, accuracy: bool = False):
        """Mean loss (and accuracy) over ``chunks`` of (inputs, targets)."""
        self._placed()
        self._check(w)
        saved = self._bound
        self._use(w)
        was_training = self.module.training
        self.module.eval()
        total, correct = 0.0, 0
        try:
            with torch.no_grad():
                for xb, yb in chunks:
                    out = self.module(xb)
                    total += float(self.loss_fn(out, yb)) * len(yb)
                    if accuracy:
                        correct += int(count_correct(out, yb))
        finally:
            if was_training:
                self.module.train()
            if saved is not None and self.device == "cpu":  # a device re-reads w anyway
                self._bind(saved)
        return total / n, (correct / n if accuracy else None)

    # -- buffers: trained state beside the parameters ---------------------------
    def state(self) -> dict | None:
        """The module's buffers (name -> array copy), or None if it has none."""
        named = dict(self.module.named_buffers())
        if not named:
            return None
        return {k: v.detach().cpu().numpy().copy() for k, v in named.items()}

    def load_state(self, state: dict | None) -> None:
        """Copy buffers from ``state`` into the module (in place)."""
        if not state:
            return
        named = dict(self.module.named_buffers())
        with torch.no_grad():
            for k, v in state.items():
                named[k].copy_(torch.from_numpy(np.array(v)))  # Ray hands arrays read-only

    def model_at(self, w: np.ndarray) -> torch.nn.Module:
        """A standalone copy of the module holding parameters ``w``."""
        self._check(w)
        model = copy.deepcopy(self.module).to("cpu")  # results live on the CPU side
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        for p, view in zip(params, self._views(np.array(w, copy=True))):
            p.data = view.clone()
            p.grad = None
        return model

    def __getstate__(self):
        state = self.__dict__.copy()
        # A copy is a CPU problem that keeps its target device (placed lazily).
        for key in [k for k in state if k.startswith("_dev")]:
            del state[key]
        if "_host_data" in state:
            state["X"], state["y"], state["val"] = state.pop("_host_data")
        state["device"] = "cpu"
        # The module's parameters may view shared memory; ship plain copies.
        state["_bound_copy"] = np.array(self._bound, copy=True)
        state["_bound"] = None
        state["_grad_out"] = None
        state["_grad_views"] = None
        state["_grad_flat"] = None
        state["_grad_bindings"] = {}
        state["module"] = None
        state["_params"] = None
        state["_module_bytes"] = _module_without_buffers(self.module, self._params)
        sharing = getattr(self, "_share_pickles", False)
        state["_share_pickles"] = sharing  # a copy made for a worker pickles the same way
        if sharing:
            state["X"] = state["y"] = state["val"] = None  # the block carries them
        else:
            state["_shm"] = None
        return state

    def __setstate__(self, state):
        module_bytes = state.pop("_module_bytes")
        bound = state.pop("_bound_copy")
        self.__dict__.update(state)
        if getattr(self, "_shm", None) is not None and self.X is None:
            _from_shared(self, self._shm)
        self.module = module_bytes
        self._params = [p for p in self.module.parameters() if p.requires_grad]
        self._bind(bound)
        self._bind_grad(np.zeros(self.n_params, dtype=self.dtype))

    # -- data in shared memory ----------------------------------------------------
    @contextlib.contextmanager
    def shared_data(self):
        """Within the context, pickles of this problem refer to its data in
        shared memory (moved there on first use) instead of carrying it."""
        shm = getattr(self, "_shm", None)
        if shm is None or shm.path is None:  # never shared, or unlinked by an earlier run
            self._shm = _to_shared(self)
            if shm is not None:
                shm.close()
        self._share_pickles = True
        try:
            yield
        finally:
            self._share_pickles = False

    def seed_rng(self, seed: int, rank: int) -> None:
        """Seed torch's generator for worker ``rank`` of a run seeded with
        ``seed``: a seeded run draws the same Dropout masks every time."""
        torch.manual_seed((seed * 1_000_003 + rank) % (1 << 63))

    def unlink_shared(self) -> None:
        """Every worker has mapped the shared data: remove its file now, so
        nothing is left in /dev/shm however the run ends (the memory goes
        with the last mapping; a later run shares the data again)."""
        shm = getattr(self, "_shm", None)
        if shm is not None:
            shm.unlink()

    def _data(self) -> list:
        """What copies share: the read-only data (the host copies)."""
        return list(getattr(self, "_host_data", None) or (self.X, self.y, self.val))

    def __deepcopy__(self, memo):
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for data in self._data() + [getattr(self, "_shm", None)]:  # read-only: share it
            if data is not None:
                memo[id(data)] = data
        clone.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        clone._shm = getattr(self, "_shm", None)
        return clone


def _host_tensor(w: np.ndarray):
    """``w`` as a CPU tensor to copy from (Ray hands arrays over read-only)."""
    return torch.from_numpy(w if w.flags.writeable else np.array(w))


def _module_without_buffers(module, params):
    """A CPU copy of ``module`` whose parameters own their storage (not
    views of a flat, shared or device buffer), so it pickles small and safely."""
    saved = [(p.data, p.grad) for p in params]
    try:
        for p in params:
            p.data = p.data.detach().to("cpu", copy=True)
            p.grad = None
        return copy.deepcopy(module).to("cpu")
    finally:
        for p, (data, grad) in zip(params, saved):
            p.data = data
            p.grad = grad


def split_validation(X, y, val, fraction: float, seed: int = 0):
    """``(X, y, val)`` with ``fraction`` of the rows held out (a seeded
    permutation) as the validation set when no ``val`` was given."""
    if not fraction:
        return X, y, val
    train, test = (torch.from_numpy(i) for i in validation_split(len(X), fraction, val, seed))
    return X[train], y[train], (X[test], y[test])


def validation_split(n: int, fraction: float, val=None, seed: int = 0):
    """(training rows, validation rows), both sorted: ``fraction`` of ``n``
    held out by a permutation drawn from ``seed``."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), not {fraction}")
    if val is not None:
        raise ValueError("give either val (a held-out set) or val_fraction, not both")
    held = int(round(n * fraction))
    if held < 1 or held >= n:
        raise ValueError(f"val_fraction {fraction} of {n} examples leaves no training "
                         "or no validation example")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[held:]), np.sort(order[:held])


def is_classification(loss_fn, y) -> bool:
    """Accuracy applies: cross-entropy / NLL with class indices, or a binary
    loss with 0/1 targets."""
    if isinstance(loss_fn, (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)):
        return not y.is_floating_point()
    if isinstance(loss_fn, (torch.nn.BCEWithLogitsLoss, torch.nn.BCELoss)):
        return bool(((y == 0) | (y == 1)).all())
    return False


def count_correct(out, y) -> int:
    if out.ndim > 1 and out.shape[-1] > 1 and not y.is_floating_point():
        return int((out.argmax(-1) == y).sum())
    pred = (out.reshape(y.shape) > 0).to(y.dtype)  # binary: logits (BCEWithLogits)
    return int((pred == y).sum())


def _tensors(problem) -> dict:
    named = {"X": problem.X, "y": problem.y}
    if problem.val is not None:
        named["val_X"], named["val_y"] = problem.val
    return named


def _to_shared(problem):
    """Move ``problem``'s data into one shared-memory block; it is removed
    when the problem is garbage-collected or the interpreter exits."""
    from ..engines.shared_memory import SharedArrays

    named = {k: t.contiguous().numpy() for k, t in _tensors(problem).items()}
    block = SharedArrays({k: (a.shape, a.dtype) for k, a in named.items()})
    for k, a in named.items():
        block[k][...] = a
    del named
    _from_shared(problem, block)
    weakref.finalize(problem, block.close)
    return block


def _from_shared(problem, block) -> None:
    t = {k: torch.from_numpy(v) for k, v in block.arrays.items()}
    problem.X, problem.y = t["X"], t["y"]
    problem.val = (t["val_X"], t["val_y"]) if "val_X" in t else None

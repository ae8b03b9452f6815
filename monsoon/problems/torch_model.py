"""TorchModel: any ``torch.nn.Module`` as a flat parameter vector, trained on
tensors in memory. ``DatasetProblem`` and ``SparkTorchData`` keep its model
machinery and hold their data elsewhere; ``TorchProblem`` (``torch_problem.py``)
is the public name, with constructors for all three.

The module's parameters are views into ONE flat buffer (as DDP's buckets
and FSDP's flat parameters), and the gradient lands in one flat buffer
too (autograd's tensors gathered by one ``torch.cat``; ``accumulate=True``
lets autograd add): sharing, sending and averaging a model is one array
operation. ``gradient(w, idx)`` aliases ``w``: the module is re-pointed at
it, no copy, so a worker on shared memory (Hogwild!, sync) reads the
shared parameters and one on a private copy (Downpour) reads its copy.

Training starts from the module as the user built it (``init="module"``,
as DDP); ``init="seed"`` re-draws the weights from the run's seed (the
catalog's problems). The module trains in its own dtype unless ``dtype``
asks for another; ``precision="bf16"`` runs forward and loss under
``torch.autocast`` in bfloat16 with float32 master weights (Lightning's
``bf16-mixed``). Buffers (BatchNorm's statistics) are trained state:
``state()`` / ``load_state()`` carry them to the caller, which combines the
workers' by the strategy's rule (``buffers.py``). Everything reported
(``loss``, ``evaluate``) runs in eval mode under no_grad, each layer's
mode put back after (one the user froze stays so). A worker's random
draws (Dropout) are seeded before each forward pass from (seed, rank, its
passes so far: ``seed_rng``), so a resumed run draws an uninterrupted one's;
whether it draws any (``draws_random``) is read from its layers.

Data reaches worker processes through shared memory (``shared_data()``:
one block, mapped by every process), not a pickled copy per worker.

On a device (``place``, ``monsoon/devices.py``) the module, its buffers
and the data move together, so every computation finds them on one device.
An engine that keeps the parameters there (``array_device()``: the local
engine's in-process workers, the torch engine's ranks) hands ``gradient``
a flat device tensor, which the module views as it views a host array on
the CPU, and the gradient lands on the device. Parameters given in host
memory (a parameter server, a snapshot) or on another GPU are copied into
this device's flat buffer, and the gradient back into ``out``. The data is
copied to each device once per process. Copies and pickles are CPU
problems that keep their target device.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import weakref

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .base import Problem, check_finite

from .. import arrays
from ..errors import ConfigError

_TORCH_DTYPES = {np.dtype("float32"): torch.float32, np.dtype("float64"): torch.float64}
PRECISIONS = ("32", "bf16")


class TorchModel(Problem):
    """Train ``module`` on ``(X, y)`` under ``loss_fn(output, target)``, which
    must return the mean over the batch (the default of torch's losses)."""

    uses_torch = True       # declared (``base.Problem``)
    device = "cpu"          # where this instance computes now
    worker_devices = None   # the run's device map (``devices.assign``)
    _target = None          # where it moves at its first computation
    precision = "32"        # or "bf16": autocast with float32 master weights
    _rng = None             # (a worker's seed, its forward passes so far): ``seed_rng``
    _norm_values = {}       # BatchNorm layer -> values per channel of one example (``_probe``)
    _random_draws = None    # training passes draw random numbers; None: not read yet
    # The parameters are torch tensors even on the CPU (``array_device``):
    # the tests run the device path this way on machines without a GPU.
    resident = False

    def __init__(self, module: torch.nn.Module, loss_fn, X, y, dtype=None,
                 name: str = "torch", eval_batch: int = 65536, init_fn=None,
                 init: str = "module", val=None, val_fraction: float = 0.0,
                 val_seed: int = 0):
        tdtype = self._setup(name, dtype, init_fn, init, loss_fn, eval_batch, module)
        # data, not part of a graph: a tensor that requires grad would have
        # every step's backward reach it, and cannot be moved to shared memory
        X = data_tensor(X)
        y = data_tensor(y)
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
            vX, vy = val_tensors(val)
            if len(vX) != len(vy):
                raise ValueError(f"val X has {len(vX)} rows but val y has {len(vy)}: "
                                 "they must match")
            self.val = (vX.to(tdtype) if vX.is_floating_point() else vX,
                        vy.to(tdtype) if vy.is_floating_point() else vy)
        check_targets(loss_fn, self.y)
        if self.val is not None:
            check_targets(loss_fn, self.val[1], "the validation set's y")
        self.classification = is_classification(loss_fn, self.y)
        self.n_examples = int(len(self.X))
        self._setup_module(module)

    def _probe(self, label: str, xb, yb, call_loss: bool = True, fix: str | None = None) -> None:
        """One forward pass and loss on two rows, in eval mode under no_grad
        (no buffer changes), when a user's problem is built (``TorchProblem``;
        ``DatasetProblem``, on its first two items):
        a module that does not fit the data is refused there, naming both
        shapes, rather than by a worker after the run has started. A Spark
        partition's rows are probed without the loss (``call_loss=False``:
        a retried task must not call it twice), and what is refused there
        reaches the driver as a report, raised after its check of the
        partitions' widths (``spark_torch_data``). ``fix``: the shape
        check's advice, where the targets' shape is not the user's to change."""
        modes = _modes(self.module)
        self.module.eval()
        values = {}  # BatchNorm layer -> values per channel of one example (``fewest_rows``)
        hooks = [layer.register_forward_pre_hook(
                     lambda _, args, name=name: values.__setitem__(
                         name, min(values.get(name, math.inf), math.prod(args[0].shape[2:]))))
                 for name, layer in self.module.named_modules() if isinstance(layer, _BatchNorm)]
        try:
            with torch.no_grad():
                try:
                    out = self._forward_eval(xb)
                except Exception as exc:  # noqa: BLE001 - any failure is a misfit
                    raise ConfigError(
                        f"the module does not take {label}: a forward pass on {len(xb)} rows "
                        f"of shape {tuple(xb.shape)} fails ({_first_line(exc)}); make the "
                        f"module's input fit rows of shape {tuple(xb.shape[1:])}, or reshape "
                        f"{label}") from None
                check_shapes(self.loss_fn, out, yb, label, fix)
                loss = self._probe_loss(out, yb) if call_loss else None
        finally:
            for hook in hooks:
                hook.remove()
            _restore_modes(modes)
        self._norm_values = {**self._norm_values, **values}
        if call_loss and not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ConfigError(f"loss_fn must return one number, the mean over the batch; it "
                              f"returned {got}: use reduction='mean' (torch's default)")

    def _probe_loss(self, out, yb):
        """The loss of ``_probe``'s forward pass, a failure refused in one line."""
        try:
            return self.loss_fn(out, yb)
        except Exception as exc:  # noqa: BLE001 - any failure is a misfit
            raise ConfigError(
                f"loss_fn does not take the module's output of shape "
                f"{tuple(out.shape) if hasattr(out, 'shape') else type(out).__name__} "
                f"with targets y of shape {tuple(yb.shape)} ({_first_line(exc)}); "
                "make the module's output and y fit the loss") from None

    def draws_random(self) -> bool:
        """Whether training passes draw random numbers (Dropout's masks,
        RReLU's slopes), read from the module's layers without running it
        (a forward pass has the user's side effects): a random torch layer
        that trains (a module handed over in eval mode trains every layer,
        ``_backward``; a Dropout the user froze with ``.eval()`` draws
        none) draws; a module of torch's own layers alone draws none; a
        layer class of the user's (its forward may draw) or a Spark table's
        model, never seen here, is taken to draw."""
        if self._random_draws is None:
            all_train = not self.module.training
            layers = list(self.module.modules())
            if any(isinstance(m, _RANDOM_LAYERS) and (all_train or m.training)
                   for m in layers):
                self._random_draws = True
            else:
                self._random_draws = not all(
                    type(m).__module__.startswith("torch.") for m in layers)
        return self._random_draws

    def fewest_rows(self) -> tuple[int, str | None]:
        """The fewest examples one training forward pass may take, and why:
        2 where a BatchNorm layer normalises over the batch in training
        (``training``, or no running statistics) and an example gives it
        one value per channel (``_probe`` saw its input; unseen: assumed),
        which torch refuses for a batch of 1 ("Expected more than 1 value
        per channel when training"); else (1, None). A module handed over
        in eval mode trains every layer (``_backward``)."""
        name = self._norm_by_batch(training=True)
        if name is None:
            return 1, None
        return 2, f"its BatchNorm layer {name!r} normalises one value per channel"

    def _norm_by_batch(self, training: bool) -> str | None:
        """The first BatchNorm layer that normalises one value per channel
        by the batch's own statistics in a training pass (``training``) or
        an evaluation: one without running statistics always, another where
        it trains; None if none (``fewest_rows``)."""
        all_train = training and not self.module.training
        for name, layer in self.module.named_modules():
            if (isinstance(layer, _BatchNorm) and self._norm_values.get(name, 1) == 1
                    and (layer.running_mean is None
                         or training and (all_train or layer.training))):
                return name
        return None

    def _fewest_eval_rows(self) -> int:
        """The fewest rows an evaluation chunk may hold: 2 where a BatchNorm
        normalises it by its own statistics (``_norm_by_batch``), else 1."""
        return 1 if self._norm_by_batch(training=False) is None else 2

    def _forward_eval(self, xb):
        """The module's output on the batch ``xb`` in an evaluation pass. A
        lone row (a tensor), where a BatchNorm normalises by the batch's own
        statistics (``_norm_by_batch``), goes through as two copies of
        itself and keeps the first row of the output: the copies' mean and
        variance are the row's own (variance 0: the layer gives its bias, as
        its formula does for one row), which torch refuses to compute on a
        batch of one row ("Expected more than 1 value per channel"). So a
        one-row validation set, or a Spark partition of one row (each
        partition is evaluated on its own), has a finite loss: the model's
        value on that row alone."""
        if not (isinstance(xb, torch.Tensor) and len(xb) == 1
                and self._norm_by_batch(training=False) is not None):
            return self.module(xb)
        return _first_rows(self.module(torch.cat([xb, xb])))

    def _setup(self, name, dtype, init_fn, init, loss_fn, eval_batch, module=None):
        """The settings every torch problem has; returns the torch dtype:
        ``dtype``, or with None the module's own (its first floating
        parameter's; float32 for a module of other dtypes)."""
        self.name = name
        self.init_fn = init_fn
        if init not in ("module", "seed"):
            raise ValueError(f"init must be 'module' (the module's own weights) or 'seed' "
                             f"(re-drawn from the run's seed), not {init!r}")
        self.init = init
        if module is not None and not isinstance(module, torch.nn.Module):
            raise ConfigError(_not_a_module(module))
        reduction = getattr(loss_fn, "reduction", "mean")
        if reduction not in ("mean", "batchmean"):  # batchmean: KLDivLoss's mean per example
            raise ConfigError(f"loss_fn must return one number, the mean over the batch (a "
                              f"step's gradient is a mean); its reduction is {reduction!r}: "
                              "use reduction='mean' (torch's default)")
        if dtype is None:
            dtype = _module_dtype(module)
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
        self._grad_host = np.zeros(self.n_params, dtype=self.dtype)  # the default ``out``
        self._bind_grad(self._grad_host)

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

    def _views(self, array):
        return self._tensor_views(_as_tensor(array))

    def _bind(self, w) -> None:
        """Point the module's parameters at ``w`` (host array or tensor on
        this problem's device): no copy."""
        for p, view in zip(self._params, self._views(w)):
            p.data = view
        self._bound = w

    def _bind_grad(self, g) -> None:
        """Make ``g`` the gradient buffer. The last few bindings are kept, so
        a caller alternating between two buffers (the replicated sync step's
        double-buffered slots) binds each once."""
        bound = self._grad_bindings.get(id(g))
        if bound is None or bound[0] is not g:
            self._check(g)
            if len(self._grad_bindings) >= 4:
                self._grad_bindings.clear()
            bound = (g, list(self._views(g)), _as_tensor(g))
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

    def array_device(self):
        """Where an engine keeps this problem's parameters, gradients and
        rule state when its workers share this process: the torch device
        it computes on (a GPU; the CPU with ``resident``), or None for
        NumPy arrays in host memory."""
        if self._target is None:
            return None
        device = _resolved(self._target)
        return None if device.type == "cpu" and not self.resident else device

    def for_worker(self, rank: int, workers: int) -> "TorchModel":
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
        ``cuda``, ``cuda:N``), together. The parameters follow what
        ``gradient`` is given (see the module's docstring)."""
        device = str(device)
        if device == self.device:
            return
        if self.device != "cpu":
            self._to_host()
        if device != "cpu":
            self._to_device(device)

    def _to_device(self, device: str) -> None:
        dev = _resolved(device)
        tdtype = _TORCH_DTYPES[self.dtype]
        host = arrays.to_host(self._bound)
        self.module.to(dev)  # the buffers (and the parameters, re-pointed next)
        self._params = [p for p in self.module.parameters() if p.requires_grad]
        self._dev = dev
        self._dev_flat = torch.empty(self.n_params, dtype=tdtype, device=dev)
        self._dev_grad = torch.zeros(self.n_params, dtype=tdtype, device=dev)
        self._dev_grad_views = list(self._tensor_views(self._dev_grad))
        for p in self._params:
            p.grad = None
        self._dev_flat.copy_(_as_tensor(host))
        self._bind(self._dev_flat)
        self._grad_bindings = {}
        self._grad_out = None
        self._place_data(dev)
        self.device = device

    def _to_host(self) -> None:
        host = np.array(arrays.to_host(self._bound), copy=True)
        self._restore_data()
        self.module.to("cpu")
        self._params = [p for p in self.module.parameters() if p.requires_grad]
        for key in [k for k in self.__dict__ if k.startswith("_dev")]:
            del self.__dict__[key]
        self.device = "cpu"
        self._grad_bindings = {}
        self._bind_grad(self._grad_host)
        self._bind(host)  # the parameters view a host array again

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

    def _here(self, a) -> bool:
        """``a`` is an array this instance computes on without a copy: a host
        array on the CPU, a tensor on this device."""
        if self.device == "cpu":
            return not arrays.is_tensor(a) or a.device.type == "cpu"
        return arrays.is_tensor(a) and a.device == self._dev

    def _use(self, w) -> None:
        """Compute at ``w`` from now on: re-point the module at it where it
        is here, else copy it into this device's flat buffer (always: the
        engine updates it in place elsewhere)."""
        if w is not self._bound:
            self._check(w)
        if self._here(w):
            if w is not self._bound:
                self._bind(w)
            return
        if self._bound is not self._dev_flat:
            self._bind(self._dev_flat)
        self._dev_flat.copy_(_as_tensor(w), non_blocking=arrays.is_tensor(w))

    def _tensor_views(self, flat):
        offset = 0
        for shape, size in zip(self._shapes, self._sizes):
            yield flat[offset:offset + size].view(shape)
            offset += size

    def _check(self, w) -> None:
        if arrays.is_tensor(w):
            shape, dtype = tuple(w.shape), w.dtype
            ok = shape == (self.n_params,) and dtype == _TORCH_DTYPES[self.dtype]
        else:
            shape, dtype = w.shape, w.dtype
            ok = shape == (self.n_params,) and dtype == self.dtype
        if not ok:
            raise ValueError(f"parameters have shape {shape} and dtype {dtype}; "
                             f"this problem needs shape ({self.n_params},) and {self.dtype}")

    def use_precision(self, precision: str) -> None:
        """``"32"`` (the module's dtype throughout) or ``"bf16"`` (autocast)."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not "
                             f"{precision!r}")
        if precision == "bf16" and self.dtype != np.dtype("float32"):
            raise ValueError(f"precision bf16 keeps float32 master weights; this problem's "
                             f"parameters are {self.dtype}: build it in float32, or drop "
                             "--precision")
        self.precision = precision

    def _autocast(self):
        """The forward pass's precision context: bf16 autocast, or none."""
        if self.precision != "bf16":
            return contextlib.nullcontext()
        kind = "cpu" if self.device == "cpu" else self._dev.type
        return torch.autocast(device_type=kind, dtype=torch.bfloat16)

    # -- the Problem protocol ------------------------------------------------
    def initial_params(self, seed: int) -> np.ndarray:
        """The module's own parameters (``init="module"``), or parameters
        re-drawn from ``seed`` (``init="seed"``): by ``init_fn(module)`` when
        one was given, else by each layer's own ``reset_parameters``. The
        draws are made in float32 and cast, since torch's draws differ by
        dtype: a float64 run starts where a float32 run of the seed does."""
        self.load_state(self._initial_state)  # a new run starts from the given buffers
        if self.init == "module":
            return self._initial.copy()
        fresh = self.model_at(self._initial).to(torch.float32)
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
        """The mean loss over ``indices`` at ``w``, and its gradient in
        ``out``: by default, a buffer of ``w``'s kind (a device tensor for
        parameters on this device, a host array otherwise)."""
        self._placed()
        if out is None:
            out = self._grad_like(w)
        if not self._here(out):  # computed here, copied to ``out`` (host memory, another GPU)
            loss = self.backward(w, indices, fresh=True)
            self._gather_grads(self._dev_grad, self._dev_grad_views)
            out_t = _as_tensor(out)
            if accumulate:
                out_t += self._dev_grad.to(out_t.device)
            else:
                out_t.copy_(self._dev_grad)
            return loss, out
        if out is not self._grad_out:
            self._bind_grad(out)
        params = self._params
        if accumulate:  # autograd adds into .grad: point it at ``out``
            for p, view in zip(params, self._grad_views):
                p.grad = view
        loss = self._backward(w, indices, fresh=not accumulate)
        if not accumulate:
            self._gather_grads()
        if self.device == "cpu":
            return float(loss), self._grad_out
        # on a device: the loss and the gradient's finiteness in one read-back
        flat = self._grad_flat
        loss, total = torch.stack([loss.to(torch.float64),
                                   flat.sum(dtype=torch.float64)]).tolist()
        arrays.note_finite(flat, math.isfinite(total))
        return loss, self._grad_out

    def _grad_like(self, w):
        """The default gradient buffer for parameters ``w``: a tensor here
        for a tensor here, else the host array."""
        if not (arrays.is_tensor(w) and self._here(w)):
            return self._grad_host
        if self.device != "cpu":
            return self._dev_grad
        if getattr(self, "_grad_host_t", None) is None:  # the host array, as a tensor
            self._grad_host_t = torch.from_numpy(self._grad_host)
        return self._grad_host_t

    def backward(self, w, indices, fresh: bool = True) -> float:
        """Forward and backward over ``indices`` at ``w``; returns the mean
        loss. ``fresh``: each parameter's ``.grad`` is autograd's own new
        tensor, for the caller to take (the torch engine's gradient hooks);
        otherwise autograd adds into the ``.grad`` already there."""
        return float(self._backward(w, indices, fresh))

    def _backward(self, w, indices, fresh: bool, on_loss=None):
        """``backward``'s work; the loss stays a tensor where it was computed.
        ``on_loss(loss)``: called with it between forward and backward (the
        torch engine's flags, ``buckets.py``)."""
        self._placed()
        self._use(w)
        if fresh:  # autograd hands over fresh tensors: one copy, no zeroing pass
            for p in self._params:
                p.grad = None
        if not self.module.training:  # evaluation restores the mode it found
            self.module.train()
        if self._rng is not None:
            self._reseed()
        xb, yb = self._rows(indices)
        with self._autocast():
            loss = self.loss_fn(self.module(xb), yb)
        if on_loss is not None:
            on_loss(loss.detach())
        loss.backward()
        return loss.detach()

    def _rows(self, indices):
        """The examples ``indices``: inputs and targets, batched."""
        rows = np.asarray(indices, dtype=np.int64)
        rows = torch.from_numpy(rows) if self.device == "cpu" else self._upload(rows)
        return self.X.index_select(0, rows), self.y.index_select(0, rows)

    def _upload(self, rows: np.ndarray):
        """Row indices on the data's device. To a GPU through a pinned host
        buffer, asynchronously: a copy from pageable memory would first wait
        for every kernel queued (the last step's update), which the next
        step's launches can overlap instead. The buffer is rewritten once
        its last copy is done (an event)."""
        dev = self.X.device
        if dev.type != "cuda":
            return torch.from_numpy(rows).to(dev)
        buf, done = getattr(self, "_dev_rows", (None, None))
        if buf is None or buf.numel() < rows.size:
            buf, done = torch.empty(max(rows.size, 1024), dtype=torch.int64,
                                    pin_memory=True), None
        if done is not None:
            done.synchronize()
        buf[:rows.size].numpy()[...] = rows
        out = buf[:rows.size].to(dev, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._dev_rows = (buf, done)
        return out

    def _train_chunks(self):
        return self._chunks(self.X, self.y)

    def _val_chunks(self):
        """(chunks, number of examples) of the validation set, or None."""
        return None if self.val is None else (self._chunks(*self.val), len(self.val[0]))

    def _chunks(self, X, y):
        for start, stop in eval_chunks(len(X), self.eval_batch, self._fewest_eval_rows()):
            yield X[start:stop], y[start:stop]

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
        self._placed()  # first: the chunks are taken from the data where it is now
        return self._measure(w, self._train_chunks(), self.n_examples)[0]

    def evaluate(self, w) -> dict:
        """Every reported figure at ``w`` (eval mode, no_grad, no buffer
        touched): ``loss``, and where they apply ``accuracy``, ``val_loss``
        and ``val_accuracy``."""
        self._placed()  # first: the chunks are taken from the data where it is now
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
        """Mean loss (and accuracy) over ``chunks`` of (inputs, targets),
        summed where the model computes and read back once."""
        self._placed()
        self._check(w)
        saved = self._bound
        self._use(w)
        modes = _modes(self.module)  # each layer's own, put back after: a frozen one stays so
        self.module.eval()
        total = correct = None  # correct: (hits, predictions scored)
        try:
            with torch.no_grad():
                for xb, yb in chunks:
                    with self._autocast():
                        out = self._forward_eval(xb)
                        part = self.loss_fn(out, yb).double() * len(yb)
                    total = part if total is None else total + part
                    if accuracy:
                        hits = count_correct(out, yb, self.loss_fn)
                        correct = hits if correct is None else correct + hits
        finally:
            _restore_modes(modes)
            if saved is not None and self._here(saved) and saved is not self._bound:
                self._bind(saved)
        mean = float(total) / n if total is not None else float("nan")
        if not accuracy:
            return mean, None
        hits, scored = correct.tolist() if correct is not None else (0, 0)
        return mean, (hits / scored if scored else float("nan"))

    # -- buffers: trained state beside the parameters ---------------------------
    def state(self) -> dict | None:
        """The module's buffers (name -> array copy), or None if it has none."""
        named = dict(self.module.named_buffers())
        if not named:
            return None
        return {k: v.detach().cpu().numpy().copy() for k, v in named.items()}

    def kept_state(self) -> dict | None:
        """The module's buffers, cloned where they are (on a GPU: queued,
        not waited for), or None if it has none."""
        named = dict(self.module.named_buffers())
        return {k: v.detach().clone() for k, v in named.items()} or None

    def load_state(self, state: dict | None) -> None:
        """Copy buffers from ``state`` (arrays, or ``kept_state``'s tensors)
        into the module (in place)."""
        if not state:
            return
        named = dict(self.module.named_buffers())
        with torch.no_grad():
            for k, v in state.items():
                if not isinstance(v, torch.Tensor):
                    v = torch.from_numpy(np.array(v))  # Ray hands arrays read-only
                named[k].copy_(v)

    def keep_trained(self, w) -> None:
        """Point the module's parameters at a copy of ``w``, where they are
        now (host or device): the user's module ends trained, and neither
        it nor ``w`` changes the other afterwards. A new run still starts
        from the weights the problem was built with (``initial_params``)."""
        fresh = np.array(arrays.to_host(w), dtype=self.dtype, copy=True)
        if arrays.is_tensor(self._bound):
            self._bind(torch.from_numpy(fresh).to(self._bound.device))
        else:
            self._bind(fresh)

    def model_at(self, w: np.ndarray) -> torch.nn.Module:
        """A standalone copy of the module holding parameters ``w``."""
        self._check(w)
        model = copy.deepcopy(self.module).to("cpu")  # results live on the CPU side
        if not model.training:  # as training runs it; a layer the user froze stays frozen
            model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        for p, view in zip(params, self._views(np.array(arrays.to_host(w), copy=True))):
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
        # The module's parameters may view shared memory or a device; ship plain copies.
        state["_bound_copy"] = np.array(arrays.to_host(self._bound), copy=True)
        state["_bound"] = None
        state["_grad_host"] = state["_grad_host_t"] = None
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
        self._grad_host = np.zeros(self.n_params, dtype=self.dtype)
        self._bind_grad(self._grad_host)

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

    def seed_rng(self, seed: int | None, rank: int, done: int = 0) -> None:
        """From now on, seed torch's generator before each forward pass of
        this copy, worker ``rank``'s of a run seeded with ``seed``, from
        (seed, rank, the passes it made: ``done`` before this attempt, a
        resumed worker's position): a seeded run draws the same Dropout
        masks every time, and a resumed one those the uninterrupted run drew
        from there on, with no generator state in its checkpoint. Each pass
        seeds the generator of the device it computes on alone
        (``torch.manual_seed`` visits every backend, far slower).
        ``seed`` None: draws come as they are again (after an inline run)."""
        self._rng = None if seed is None else ((seed * 1_000_003 + rank) % (1 << 31), done)

    def _reseed(self) -> None:
        """Before a forward pass: seed the generators it may draw from (the
        CPU's, and on a GPU that GPU's; another device: every backend's)."""
        base, done = self._rng
        self._rng = (base, done + 1)
        seed = (base << 32) + done % (1 << 32)
        torch.default_generator.manual_seed(seed)
        if self.device == "cpu":
            return
        device = torch.device(self.device)
        if device.type != "cuda":
            torch.manual_seed(seed)
            return
        index = torch.cuda.current_device() if device.index is None else device.index
        torch.cuda.default_generators[index].manual_seed(seed)

    def unlink_shared(self) -> None:
        """Every worker has mapped the shared data (or the start failed and
        none will): remove its file now, so nothing is left in /dev/shm
        however the run ends (the memory goes with the last mapping; a later
        run shares the data again)."""
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


def eval_chunks(n: int, size: int, fewest: int = 1) -> list[tuple[int, int]]:
    """The [start, stop) of each evaluation chunk of ``size`` rows over
    ``n``; a last chunk of fewer than ``fewest`` rows joins the one before:
    a BatchNorm without running statistics normalises each chunk by its
    own, which torch refuses for one row even in eval mode."""
    starts = list(range(0, n, size))
    if len(starts) > 1 and n - starts[-1] < fewest:
        starts.pop()
    return list(zip(starts, starts[1:] + [n]))


def _modes(module) -> list:
    """Each layer of ``module`` with its mode (training or eval), for
    ``_restore_modes``."""
    return [(layer, layer.training) for layer in module.modules()]


def _restore_modes(modes: list) -> None:
    """Put each layer back in its own mode: a layer the user froze with
    ``.eval()`` (a BatchNorm's statistics, a Dropout) stays frozen, where
    ``module.train()`` would set every layer training."""
    for layer, training in modes:
        layer.training = training


# layers whose training passes draw from torch's generator (``draws_random``)
_RANDOM_LAYERS = (torch.nn.modules.dropout._DropoutNd, torch.nn.RReLU)


def _as_tensor(a):
    """``a`` as a tensor: itself, or a host array's CPU view (a copy of a
    read-only one: Ray hands arrays over read-only)."""
    if isinstance(a, torch.Tensor):
        return a
    return torch.from_numpy(a if a.flags.writeable else np.array(a))


def data_tensor(a) -> torch.Tensor:
    """``a`` as a tensor of data: the user's own tensor where it is one (no
    copy), detached from its graph where it requires grad."""
    t = torch.as_tensor(a)
    return t.detach() if t.requires_grad else t


def _resolved(device) -> torch.device:
    """``device`` as a torch device with its index (``cuda`` is the current GPU)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type == "cpu":  # CPU tensors carry no index
        dev = torch.device("cpu")
    return dev


def _module_dtype(module) -> str:
    """The dtype a module trains in by default: its first floating
    parameter's (float32 for a module without any). A module with
    parameters in a dtype monsoon does not train (float16, bfloat16) is
    refused in one line, before anything converts it."""
    names = [str(p.dtype).replace("torch.", "") for p in module.parameters()
             if p.is_floating_point()]
    other = sorted(set(names) - {"float32", "float64"})
    if other:
        raise ConfigError(f"the module's parameters are {' and '.join(other)}, which monsoon "
                          "does not train in: convert the module to float32 (module.float()), "
                          "and for bfloat16 compute train with precision='bf16' (--precision "
                          "bf16: autocast, float32 master weights)")
    return names[0] if names else "float32"


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
    held out by a permutation drawn from ``seed``. A fraction that leaves
    no training or no validation example is refused in one line
    (ConfigError, a ValueError)."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"--val-fraction must be in (0, 1), not {fraction}")
    if val is not None:
        raise ConfigError("give either val (a held-out set) or val_fraction, not both")
    held = int(round(n * fraction))
    if held < 1 or held >= n:
        left = "validation" if held < 1 else "training"
        raise ConfigError(f"--val-fraction {fraction} of the {n} examples holds out {held}, "
                          f"leaving no {left} example; give a fraction that holds out 1 to "
                          f"{n - 1} of them")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[held:]), np.sort(order[:held])


def val_tensors(val) -> tuple:
    """A validation set as (X, y) tensors: from a pair of tensors or arrays,
    or a map-style Dataset of (input, target) items (a TensorDataset's own
    tensors; any other's items stacked by ``default_collate``). Anything
    else is refused in one line."""
    from torch.utils.data import Dataset, TensorDataset, default_collate

    if isinstance(val, TensorDataset) and len(val.tensors) == 2:
        pair = val.tensors
    elif isinstance(val, Dataset) and hasattr(val, "__len__"):
        pair = default_collate([val[i] for i in range(len(val))]) if len(val) else ()
    else:
        pair = val
    if isinstance(pair, (tuple, list)) and len(pair) == 2:
        return tuple(data_tensor(v) for v in pair)
    got = type(val).__name__
    if pair is not val:
        got += f" whose items collate into {type(pair).__name__}" if pair else " of no items"
    raise ConfigError(f"val must be (X_val, y_val), or a map-style Dataset of (input, target) "
                      f"items, not a {got}")


# losses that compare output and target element by element (torch's
# documented "same shape as the input"), each with its functional form;
# most broadcast other shapes, with a warning at most
_ELEMENTWISE = {torch.nn.MSELoss: F.mse_loss, torch.nn.L1Loss: F.l1_loss,
                torch.nn.SmoothL1Loss: F.smooth_l1_loss, torch.nn.HuberLoss: F.huber_loss,
                torch.nn.BCELoss: F.binary_cross_entropy,
                torch.nn.BCEWithLogitsLoss: F.binary_cross_entropy_with_logits,
                torch.nn.SoftMarginLoss: F.soft_margin_loss,
                torch.nn.PoissonNLLLoss: F.poisson_nll_loss, torch.nn.KLDivLoss: F.kl_div,
                torch.nn.MultiLabelSoftMarginLoss: F.multilabel_soft_margin_loss}


SHAPES_FIX = ("make them one shape, y[:, None] (y.reshape(-1, 1)) for an output of one "
              "column, or squeeze the module's output")


def check_shapes(loss_fn, out, y, label: str, fix: str | None = None) -> None:
    """Refuse, in one line, an element-wise loss's output and targets of
    different shapes: torch broadcasts (N, 1) against (N,) to (N, N), and the
    run trains a wrong model with only a UserWarning to show for it. ``fix``
    is what to change (default ``SHAPES_FIX``)."""
    name = _loss_name(loss_fn, _ELEMENTWISE)
    if name is None or not isinstance(out, torch.Tensor) or out.shape == y.shape:
        return
    try:
        wrong = f", which torch broadcasts to {tuple(torch.broadcast_shapes(out.shape, y.shape))}"
    except RuntimeError:
        wrong = ""
    raise ConfigError(
        f"{name} compares the module's output and the targets element by element, but on "
        f"the first rows of {label} the output has shape {tuple(out.shape)} and the targets "
        f"{tuple(y.shape)}{wrong}: {fix or SHAPES_FIX}")


def _unwrapped(loss_fn):
    """``loss_fn`` without its ``functools.partial`` wrappers: a partial's
    arguments (weight=, pos_weight=, reduction=) leave the targets it
    takes and the output it reads as they are."""
    while isinstance(loss_fn, functools.partial):
        loss_fn = loss_fn.func
    return loss_fn


def _loss_name(loss_fn, forms: dict) -> str | None:
    """The name of ``loss_fn`` (``MSELoss``, ``F.mse_loss``) where it is one
    of ``forms`` (module class -> functional form), as a module, its
    functional form, or a ``functools.partial`` of either; else None."""
    loss_fn = _unwrapped(loss_fn)
    return next((kind.__name__ if isinstance(loss_fn, kind) else f"F.{fn.__name__}"
                 for kind, fn in forms.items() if isinstance(loss_fn, kind) or loss_fn is fn),
                None)


# binary cross-entropy, on probabilities and on logits: targets in [0, 1]
_BINARY = {torch.nn.BCELoss: F.binary_cross_entropy,
           torch.nn.BCEWithLogitsLoss: F.binary_cross_entropy_with_logits}


def check_targets(loss_fn, y, label: str = "y") -> None:
    """Refuse, in one line, targets that ``loss_fn`` takes but cannot mean:
    binary cross-entropy's (module or functional form) outside [0, 1]
    (labels -1/+1), whose loss falls without bound as the logits grow, so
    the run "finishes" having learned nothing."""
    name = _loss_name(loss_fn, _BINARY)
    if name is not None and len(y):
        low, high = float(y.min()), float(y.max())
        if low < 0 or high > 1:
            raise ConfigError(
                f"{name} takes targets in [0, 1] (the probability of class 1), but {label} "
                f"holds {low:g} to {high:g}: its loss would fall without bound; for labels "
                "-1/+1 give (y + 1) / 2")


# losses that take class indices (cross-entropy's float targets are class
# probabilities instead), each with its functional form
_CLASS_INDEX = {torch.nn.CrossEntropyLoss: F.cross_entropy, torch.nn.NLLLoss: F.nll_loss}


def class_index_loss(loss_fn) -> bool:
    """Does ``loss_fn`` take class numbers (int64) as its target:
    cross-entropy or NLL as a module, its functional form, or a
    ``functools.partial`` of either?"""
    return _loss_name(loss_fn, _CLASS_INDEX) is not None


def _ignore_index(loss_fn) -> int:
    """The target a class-index loss skips: the module's ``ignore_index``;
    for the functional form, the ``ignore_index=`` a partial gives it, else
    the function's default (-100)."""
    bare = _unwrapped(loss_fn)
    if isinstance(bare, torch.nn.Module):
        return bare.ignore_index
    while isinstance(loss_fn, functools.partial):
        if "ignore_index" in loss_fn.keywords:
            return loss_fn.keywords["ignore_index"]
        loss_fn = loss_fn.func
    return inspect.signature(bare).parameters["ignore_index"].default


def is_classification(loss_fn, y) -> bool:
    """Accuracy applies: cross-entropy / NLL with class indices, or a binary
    loss with 0/1 targets (each as a module, its functional form or a
    partial of either; a loss the user wrapped otherwise is not read)."""
    if class_index_loss(loss_fn):
        return not y.is_floating_point()
    if _loss_name(loss_fn, _BINARY) is not None:
        return bool(((y == 0) | (y == 1)).all())
    return False


def count_correct(out, y, loss_fn):
    """(correct predictions, predictions scored) in a batch, as one tensor
    where ``out`` is (read back by the caller, once). Cross-entropy / NLL:
    the classes are dimension 1 (torch's convention), so targets (N, d...)
    against outputs (N, C, d...) score every position; a position whose
    target is the loss's ``ignore_index`` (``_ignore_index``) is not scored,
    as the loss skips it. BCE: every target element (multi-label (N, k) too) is scored, the
    output thresholded at 0.5 (BCELoss, F.binary_cross_entropy:
    probabilities) or 0 (the logits forms)."""
    if class_index_loss(loss_fn):
        scored = y != _ignore_index(loss_fn)
        hits = (out.argmax(1) == y) & scored
        return torch.stack([hits.sum(), scored.sum()])
    bare = _unwrapped(loss_fn)
    threshold = 0.5 if isinstance(bare, torch.nn.BCELoss) or bare is F.binary_cross_entropy \
        else 0.0
    pred = (out.reshape(y.shape) > threshold).to(y.dtype)
    return torch.stack([(pred == y).sum(), torch.tensor(y.numel(), device=y.device)])


def _tensors(problem) -> dict:
    """The data in host memory (a placed problem's host copies)."""
    X, y, val = problem._data()
    named = {"X": X, "y": y}
    if val is not None:
        named["val_X"], named["val_y"] = val
    return named


def _to_shared(problem):
    """Move ``problem``'s data into one shared-memory block; it is removed
    when the problem is garbage-collected or the interpreter exits."""
    from ..shared_memory import SharedArrays

    named = {k: t.contiguous().numpy() for k, t in _tensors(problem).items()}
    block = SharedArrays({k: (a.shape, a.dtype) for k, a in named.items()})
    for k, a in named.items():
        block[k][...] = a
    del named
    _from_shared(problem, block)
    weakref.finalize(problem, block.close)
    return block


def _from_shared(problem, block) -> None:
    """The problem's host data is ``block``'s (a placed problem keeps its
    device copies, and the block becomes what it moves back to)."""
    t = {k: torch.from_numpy(v) for k, v in block.arrays.items()}
    host = (t["X"], t["y"], (t["val_X"], t["val_y"]) if "val_X" in t else None)
    if "_host_data" in problem.__dict__:
        problem._host_data = host
    else:
        problem.X, problem.y, problem.val = host


def _first_rows(out):
    """``out`` with every tensor in it cut to its first row (``[:1]``): a
    tensor, or tensors nested in tuples (named ones and torch's return
    types too), lists and dicts, each container rebuilt as its own type;
    anything else as it is (``TorchModel._forward_eval``)."""
    if isinstance(out, torch.Tensor):
        return out[:1]
    if isinstance(out, dict):
        cut = copy.copy(out)  # keeps a defaultdict's factory, a dict subclass's type
        for key, value in out.items():
            cut[key] = _first_rows(value)
        return cut
    if isinstance(out, (tuple, list)):
        cut = [_first_rows(value) for value in out]
        return type(out)(*cut) if hasattr(out, "_fields") else type(out)(cut)
    return out


def _first_line(exc: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _not_a_module(module) -> str:
    """The one line refusing a ``module`` that is not a ``torch.nn.Module``
    instance: a Module class (``Net`` for ``Net()``) is the usual slip."""
    if isinstance(module, type) and issubclass(module, torch.nn.Module):
        return (f"module must be a torch.nn.Module instance: pass {module.__name__}(), "
                f"not the class {module.__name__}")
    return (f"module must be a torch.nn.Module instance (your model, e.g. "
            f"torch.nn.Linear(8, 1)), not {type(module).__name__}")

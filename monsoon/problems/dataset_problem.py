"""DatasetProblem: a torch model trained on any map-style ``Dataset``.

``TorchProblem.from_dataset(dataset, module, loss_fn, collate_fn=None, ...)``
trains on ``dataset[i]`` items, batched by ``collate_fn`` (torch's
``default_collate`` by default) into ``(inputs, targets)``. Items are read
when a batch needs them, so a lazy Dataset (files, memory maps, a transform
per item) never has to fit in memory. Items that collate into anything
else (a dict, one tensor) are refused in one line when the problem is built,
as is a module or loss that does not fit the first two items (those of a
validation Dataset too: ``TorchModel._probe``).

Prefetching (seed 004: "a thread that fetches and pre-processes data while
the model computes"): a strategy tells each ``Gradient`` op which examples
its worker needs next (``ops.Gradient.next``); the engine hands them to
``prefetch``, and one background thread per worker loads and collates that
batch while the current one computes. ``gradient`` takes the prefetched
batch when its indices match, else loads synchronously, so the result never
depends on whether prefetching happened.

On a GPU (``place``), batches come through pinned memory: the prefetch
thread collates the next batch, pins it and copies it to the device on a
stream of its own while the current batch computes; ``gradient`` waits for
that copy only (a CUDA event), never for the thread's next one.

Worker processes receive the Dataset pickled as it is: a lazy Dataset
pickles as its file names; one holding tensors should keep them in shared
memory or a memory map itself.

Invariants: the same as ``TorchModel`` (eval-mode evaluation under
no_grad, buffers as trained state, the module's own initial weights by
default); at most ``_MAX_PENDING`` batches wait in memory per worker.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .torch_model import (TorchModel, check_targets, data_tensor, eval_chunks,
                          is_classification, validation_split)
from ..errors import ConfigError

_MAX_PENDING = 2

# CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 build the AST objects of
# ``ast.parse`` with one state shared by every thread (CPython gh-106905):
# two threads parsing at once can fail with "SystemError: AST constructor
# recursion depth mismatch", and a Dataset that reads .npy files parses in
# every item (``np.load`` reads the header with ``ast.literal_eval``). There,
# a process reads items in one thread at a time: the prefetch thread still
# loads while the model computes, but never while another thread loads.
AST_RACE = ((3, 11) <= sys.version_info[:3] < (3, 11, 8)
            or (3, 12) <= sys.version_info[:3] < (3, 12, 2))
_READS = threading.Lock() if AST_RACE else contextlib.nullcontext()


class DatasetProblem(TorchModel):
    def __init__(self, module, loss_fn, dataset, collate_fn=None, dtype=None,
                 name: str = "dataset", eval_batch: int = 1024, init_fn=None,
                 init: str = "module", val=None, val_fraction: float = 0.0,
                 val_seed: int = 0, prefetch: bool = True):
        from torch.utils.data import Subset, TensorDataset, default_collate

        self._tdtype = self._setup(name, dtype, init_fn, init, loss_fn, eval_batch, module)
        _check_map_style(dataset, "dataset")
        if val is not None and not isinstance(val, (tuple, list)):
            _check_map_style(val, "val")
        n = len(dataset)
        if n == 0:
            raise ValueError("the training set is empty")
        if val_fraction:
            train, held = validation_split(n, val_fraction, val, val_seed)
            val, dataset = Subset(dataset, held.tolist()), Subset(dataset, train.tolist())
        if isinstance(val, (tuple, list)):
            val = TensorDataset(*(torch.as_tensor(v) for v in val))
        self.dataset = dataset
        self.val_dataset = val
        self.val = None
        self.collate_fn = collate_fn or default_collate
        self.prefetching = prefetch
        self._executor = None
        self._pending = {}
        self.n_examples = int(n if not val_fraction else len(dataset))
        x0, y0 = self._first_items(self.dataset)
        check_targets(loss_fn, y0, "the dataset's first targets")
        self.classification = is_classification(loss_fn, y0)
        self._setup_module(module)
        # a module or loss that does not fit the items: refused now, not in a worker
        self._probe("the dataset's inputs", x0, y0)
        if val is not None and len(val):
            vx, vy = self._first_items(val)
            check_targets(loss_fn, vy, "the validation set's first targets")
            self._probe("the validation set's inputs", vx, vy)

    # -- reading the data ------------------------------------------------------
    def _first_items(self, dataset):
        """The first two items as a batch, for the build-time probe; the
        first alone where two do not collate (items of different sizes,
        trained with ``batch_size=1``)."""
        if len(dataset) > 1:
            try:
                return self._load(dataset, range(2))
            except ConfigError:  # items of a form no batch takes: said as it is
                raise
            except Exception:  # noqa: BLE001 - the first item alone is tried next
                pass
        return self._load(dataset, range(1))

    def _load(self, dataset, indices):
        with _READS:
            batch = self.collate_fn([dataset[int(i)] for i in indices])
        xb, yb = (data_tensor(part) for part in _inputs_targets(batch))
        if xb.is_floating_point():
            xb = xb.to(self._tdtype)
        if yb.is_floating_point():
            yb = yb.to(self._tdtype)
        return xb, yb

    def prefetch(self, indices) -> None:
        """Start loading the batch ``indices`` in the background."""
        if not self.prefetching:
            return
        self._placed()
        key = np.asarray(indices, dtype=np.int64).tobytes()
        if key in self._pending:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="monsoon-prefetch")
        while len(self._pending) >= _MAX_PENDING:  # a hint that was not used
            self._pending.pop(next(iter(self._pending))).cancel()
        self._pending[key] = self._executor.submit(self._load_placed, self.dataset,
                                                   np.array(indices, copy=True),
                                                   getattr(self, "_dev_stream", None))

    def _load_placed(self, dataset, indices, stream=None):
        """A batch on this problem's device: on a GPU, pinned and copied on
        ``stream`` (the prefetch thread's); returns (inputs, targets, event)."""
        xb, yb = self._load(dataset, indices)
        if self.device == "cpu":
            return xb, yb, None
        dev = torch.device(self.device)
        if dev.type != "cuda":
            return xb.to(dev), yb.to(dev), None
        xb, yb = xb.pin_memory(), yb.pin_memory()
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        return xb, yb, event

    def _rows(self, indices):
        future = self._pending.pop(np.asarray(indices, dtype=np.int64).tobytes(), None)
        if future is not None and not future.cancelled():
            xb, yb, event = future.result()
        else:
            xb, yb, event = self._load_placed(self.dataset, indices)
        if event is not None:  # this stream waits for the copy, and owns the batch now
            current = torch.cuda.current_stream(xb.device)
            current.wait_event(event)
            xb.record_stream(current)
            yb.record_stream(current)
        return xb, yb

    def _train_chunks(self):
        return self._dataset_chunks(self.dataset)

    def _val_chunks(self):
        if self.val_dataset is None:
            return None
        return self._dataset_chunks(self.val_dataset), len(self.val_dataset)

    def _dataset_chunks(self, dataset):
        for start, stop in eval_chunks(len(dataset), self.eval_batch, self._fewest_eval_rows()):
            xb, yb = self._load(dataset, range(start, stop))
            if self.device != "cpu":
                xb, yb = xb.to(self.device), yb.to(self.device)
            yield xb, yb

    def _data(self) -> list:
        return [self.dataset, self.val_dataset]

    def _place_data(self, dev) -> None:
        """No data in memory to move: batches move as they are read."""
        self._drop_pending()
        if dev.type == "cuda":
            self._dev_stream = torch.cuda.Stream(dev)

    def _restore_data(self) -> None:
        self._drop_pending()

    def _drop_pending(self) -> None:
        for future in self._pending.values():
            future.cancel()
        for future in self._pending.values():
            if not future.cancelled():
                future.exception()  # wait: no copy runs on while the problem moves
        self._pending = {}

    def shared_data(self):
        """A Dataset is pickled as it is (see the module's docstring)."""
        import contextlib

        return contextlib.nullcontext()

    # -- copies --------------------------------------------------------------------
    def __getstate__(self):
        state = super().__getstate__()
        state["_executor"] = None
        state["_pending"] = {}
        return state


def _check_map_style(dataset, what: str) -> None:
    """Refuse, in one line naming what to pass, a ``dataset`` that is not
    map-style (items by index, and a length): a DataLoader (its Dataset is
    what to pass), an IterableDataset, anything else."""
    from torch.utils.data import DataLoader, IterableDataset

    if isinstance(dataset, DataLoader):
        raise ConfigError(f"{what} is a DataLoader; pass its Dataset, loader.dataset: monsoon "
                          "cuts the batches itself (batch_size=, collate_fn=)")
    if isinstance(dataset, IterableDataset) or not (
            hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        kind = "an IterableDataset" if isinstance(dataset, IterableDataset) else "a"
        raise ConfigError(f"{what} must be a map-style torch Dataset (items by index, and "
                          f"__len__), not {kind} {type(dataset).__name__}; load its items into "
                          "tensors and pass TorchProblem(module, loss_fn, X, y)")


def _inputs_targets(batch):
    """A collated batch's (inputs, targets); a batch of another form (a
    dict, as items that are dicts collate into; one tensor) is refused in
    one line naming what to pass."""
    try:
        if not isinstance(batch, (Mapping, torch.Tensor)):
            return batch[0], batch[1]
    except (IndexError, KeyError, TypeError):
        pass
    if isinstance(batch, Mapping):
        got = "a dict with keys " + ", ".join(map(repr, batch))
    elif isinstance(batch, torch.Tensor):
        got = f"one tensor of shape {tuple(batch.shape)}"
    elif isinstance(batch, (tuple, list)):
        got = f"a {type(batch).__name__} of {len(batch)}"
    else:
        got = type(batch).__name__
    raise ConfigError(f"the dataset's items collate into {got}, not (inputs, targets): make "
                      "__getitem__ return (inputs, targets), or pass collate_fn= a function "
                      "that batches a list of items into (inputs, targets)")

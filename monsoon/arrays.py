"""Flat arrays of either kind: NumPy in host memory, or torch tensors where
a torch problem computes (a GPU). Rules, reductions and the local engine's
runtime are written once against these helpers.

A flat parameter vector, its gradient and the rule's state are arrays of
the problem's own array library (DESIGN.md, "Devices"): NumPy for NumPy
problems, torch tensors on the problem's device for a torch problem that
keeps its parameters there (``TorchProblem.resident``). ``namespace(a)``
gives the functions a rule calls with ``out=``: ``numpy`` itself, or
``torch``, whose ``multiply``, ``subtract``, ``divide``, ``sqrt`` and
``maximum`` take the same arguments. The NumPy path is NumPy's own (the
rules keep their BLAS and scratch-buffer fast paths); nothing here imports
torch unless a tensor is passed.

A host copy is made only where the host reads: ``to_host`` (a snapshot, a
checkpoint, the end of a run). ``finite`` reads one number back from the
device: the sum of the vector, which is non-finite if any entry is (or if
the vector's sum overflows, i.e. it is garbage).
"""
from __future__ import annotations

import math
import sys

import numpy as np


def is_tensor(a) -> bool:
    """``a`` is a torch tensor (without importing torch for NumPy runs)."""
    if type(a) is np.ndarray:  # the hot path of NumPy runs: one check
        return False
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def namespace(a):
    """``numpy`` for NumPy arrays, ``torch`` for tensors."""
    return sys.modules["torch"] if is_tensor(a) else np


def size(a) -> int:
    return int(a.numel()) if is_tensor(a) else int(a.size)


def nbytes(a) -> int:
    return int(a.numel() * a.element_size()) if is_tensor(a) else int(a.nbytes)


def copyto(dst, src) -> None:
    """``dst[...] = src``, in place, either kind (a host array into a
    tensor or back included)."""
    if is_tensor(dst):
        dst.copy_(src if is_tensor(src) else _from_numpy(src))
    elif is_tensor(src):
        np.copyto(dst, src.detach().cpu().numpy())
    else:
        np.copyto(dst, src)


def copy(a):
    """A new array holding ``a``'s values, of ``a``'s kind and place."""
    return a.clone() if is_tensor(a) else np.array(a, copy=True)


def empty_like(a):
    return namespace(a).empty_like(a)


def zeros_for(like):
    """A ``zeros(n, dtype)`` for ``Rule.init``: arrays of ``like``'s kind
    and device (and dtype: a rule passes the parameters' own)."""
    if not is_tensor(like):
        return np.zeros
    torch = sys.modules["torch"]

    def zeros(n, dtype=None):
        return torch.zeros(n, dtype=like.dtype, device=like.device)
    return zeros


def to_host(a) -> np.ndarray:
    """``a`` as a NumPy array in host memory (a copy from a device; a
    NumPy array is returned as it is)."""
    if is_tensor(a):
        return a.detach().cpu().numpy()
    return a


def like(a, values):
    """``values`` (host or device) as an array of ``a``'s kind and device."""
    if is_tensor(a):
        if is_tensor(values):
            return values.to(a.device)
        return _from_numpy(values).to(a.device)
    return to_host(values)


def finite(g) -> bool:
    """Every entry of a tensor is finite: one reduction on its device and
    one number read back, unless the producer already said so for these
    very contents (``note_finite``). (NumPy arrays: ``server.reduce.finite``.)"""
    noted = getattr(g, "_monsoon_finite", None)
    if noted is not None and noted[0] == g._version:
        return noted[1]
    return math.isfinite(float(g.sum(dtype=_float64())))


def note_finite(g, ok: bool) -> None:
    """Record whether tensor ``g`` is all finite, for ``finite``; valid until
    ``g`` is next written (its version counter moves on). A torch problem
    reads this back with the step's loss: one read-back a step, not two."""
    g._monsoon_finite = (g._version, ok)


def _float64():
    return sys.modules["torch"].float64


def _from_numpy(a):
    torch = sys.modules["torch"]
    a = np.asarray(a)
    return torch.from_numpy(a if a.flags.writeable else np.array(a))

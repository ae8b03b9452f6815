"""Plain SGD: w <- w - lr_t * g (Robbins & Monro 1951), with an optional
step-decay schedule lr_t = lr * gamma^floor(t / step_size).

The update is BLAS's axpy, in place: one pass over memory instead of two
(scale, then subtract), which matters when a step is memory-bound; on a
tensor, torch's in-place ``add_`` with ``alpha``, one kernel."""
import numpy as np
from scipy.linalg import blas

from .. import arrays
from .base import Rule

_AXPY = {np.dtype("float32"): blas.saxpy, np.dtype("float64"): blas.daxpy}


class SGD(Rule):
    name = "sgd"

    @property
    def plain_step(self) -> bool:
        """w <- w - lr * g at one rate: a problem's compiled per-example loop
        may run in its place (the local engine). A step schedule makes the
        rate depend on the update count, which that loop does not keep."""
        return self.schedule.kind == "constant"

    def apply(self, w, g, state, info):
        lr = self.learning_rate(info)
        if arrays.is_tensor(w):
            w.add_(g, alpha=-lr)
            return
        axpy = _AXPY.get(w.dtype)
        if axpy is not None and g.dtype == w.dtype and w.flags.c_contiguous and g.flags.c_contiguous:
            out = axpy(g, w, a=-lr)
            if out is not w and not np.shares_memory(out, w):  # BLAS made a copy
                np.copyto(w, out)
            return
        step = self.scratch(g)
        np.multiply(g, lr, out=step)
        w -= step

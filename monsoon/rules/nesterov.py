"""Nesterov momentum, PyTorch's convention (``torch.optim.SGD(momentum=mu,
nesterov=True)``, dampening 0; Sutskever et al. 2013):

    v <- mu * v + g;   w <- w - lr_t * (g + mu * v)

DiLoCo's outer step is this rule with lr 0.7 and mu 0.9. Same state as
heavy-ball momentum (one velocity), a different step."""
from .. import arrays

from .momentum import Momentum


class Nesterov(Momentum):
    name = "nesterov"

    def apply(self, w, g, state, info):
        v = state.velocity
        v *= self.momentum
        v += g
        step = self.scratch(g)
        arrays.namespace(w).multiply(v, self.momentum, out=step)
        step += g
        step *= self.learning_rate(info)
        w -= step

"""AdaGrad (Duchi, Hazan, Singer, JMLR 2011), PyTorch's convention
(``torch.optim.Adagrad``, lr_decay 0):

    s <- s + g * g;   w <- w - lr_t * g / (sqrt(s) + eps)

with s starting at ``initial_accumulator`` (0) and eps = 1e-10. Downpour's
parameter server applied this per coordinate (Dean et al. 2012), with a rate
about ten times the best fixed SGD rate.

``standardize_below`` = c (0.01 for the spark engine's linear problems by
default; 0, off, elsewhere): each weight's rate is also scaled by
s_j = max(1, c / sigma_j), sigma_j its feature's standard deviation (the
bias keeps 1). That is exactly AdaGrad on the features x_j * s_j, its
weights mapped back (w_j = s_j w'_j): features whose deviation is below c
are standardized (to deviation c), as MLlib standardizes every feature
before it fits, and the others are left as they are. AdaGrad alone moves
every weight by about lr a step, so a rare binary feature, which needs a
large weight (sigma_j ~ sqrt(frequency)), takes many epochs to get it;
scaled, its step grows in proportion. Common features keep plain AdaGrad's
rate, which a full standardization would cut (to lr * c / sigma_j).
The scales live in the state (``rate_scale``), so a sharded server slices
them with the sums."""
from typing import NamedTuple

import numpy as np

from .. import arrays
from ..errors import ConfigError
from ..options import Option
from .base import Rule, Schedule


class AdagradState(NamedTuple):
    sum_sq: np.ndarray


class StandardizedAdagradState(NamedTuple):
    sum_sq: np.ndarray
    rate_scale: np.ndarray  # max(1, c / each feature's standard deviation), 1 for the bias


class Adagrad(Rule):
    name = "adagrad"
    summed_state = ("sum_sq",)  # one sum for every copy (``Rule.summed_state``)
    options = Rule.options + (
        Option("standardize_below", float, 0.0, "scale the rate of each feature whose standard "
               "deviation is below this by (this / deviation): AdaGrad on those features "
               "standardized, as MLlib fits (linear problems; 0.01 for the spark engine's "
               "data, 0: off)", check=lambda v: None if v >= 0 else "0 or more"),)

    def __init__(self, schedule: Schedule, eps: float = 1e-10, initial_accumulator: float = 0.0,
                 standardize_below: float = 0.0, **options):
        super().__init__(schedule, **options)
        self.eps = eps
        self.initial_accumulator = initial_accumulator
        self.standardize_below = float(standardize_below)
        self.rate_scale = None  # set by ``precondition``

    @property
    def standardize(self) -> bool:
        return self.standardize_below > 0

    @property
    def wants_metric(self) -> bool:
        return self.standardize

    def precondition(self, metric) -> None:
        """``metric``: 1 / each feature's variance (``Problem.inverse_variance``;
        0 for a constant feature, 1 for the bias); rate j is scaled by
        max(1, c * sqrt(metric_j))."""
        metric = np.asarray(metric, dtype=float)
        if metric.ndim != 1 or not np.all(np.isfinite(metric)) or (metric < 0).any():
            raise ConfigError("adagrad's standardize_below needs one finite, non-negative "
                              "inverse variance per parameter")
        self.rate_scale = np.maximum(1.0, self.standardize_below * np.sqrt(metric))

    def init(self, n, dtype, zeros=np.zeros):
        s = zeros(n, dtype=dtype)
        s += self.initial_accumulator
        if not self.standardize:
            return AdagradState(s)
        if self.rate_scale is None or len(self.rate_scale) != n:
            raise ConfigError("adagrad's standardize_below needs each feature's variance: a "
                              "linear problem (spark:PATH, a libsvm file); drop "
                              "--standardize-below")
        scale = zeros(n, dtype=dtype)
        arrays.copyto(scale, self.rate_scale)  # into the state's kind, place and dtype
        return StandardizedAdagradState(s, scale)

    def apply(self, w, g, state, info):
        xp = arrays.namespace(w)
        s = state.sum_sq
        tmp = self.scratch(g)
        xp.multiply(g, g, out=tmp)
        s += tmp
        xp.sqrt(s, out=tmp)
        tmp += self.eps
        xp.divide(g, tmp, out=tmp)
        tmp *= self.learning_rate(info)
        if self.standardize:
            tmp *= state.rate_scale
        w -= tmp

    def describe(self):
        return {**super().describe(), "eps": self.eps,
                "initial_accumulator": self.initial_accumulator,
                "standardize_below": self.standardize_below}

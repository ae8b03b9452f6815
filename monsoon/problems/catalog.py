"""Named problems, each with the defaults that make ``monsoon train --problem
NAME`` work with no other flag.

- ``parabola``: seed 000 exactly. 50 points on [-2, 2], y = x², a 1-5-1 tanh
  network initialised N(0, 1) as the seed's ``tf.random_normal``, loss = mean
  squared error, full-batch gradient descent at lr 0.01 for 2000 steps.
- ``exp``: seed 001. y = eˣ on [-1, 1], a 1-16-1 network whose first layer
  starts U(0, 1) as the seed's ``random_uniform_initializer(0, 1)``.
- ``digits``: scikit-learn's bundled 8x8 digit images (1797 real examples),
  an MLP 64-64-10 with cross-entropy; 20% of the images are held out as a
  validation set (``--val-fraction``).

The torch problems start from weights re-drawn from the run's seed
(``--init seed``), so results published with earlier versions stay the same
(``--init module``: the network as built, from torch's generator seeded 0);
a user's own ``TorchProblem`` starts from its module's weights.
- ``linear`` / ``logistic``: a planted linear model (16384 examples, 20
  features) in plain NumPy: microsecond steps, for simulating big clusters.
- ``quadratic``: 1M parameters with a two-pass gradient, communication-bound
  on purpose: for measuring what moving parameters costs.
"""
from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..options import Option
from .linear import synthetic
from .quadratic import Quadratic

if TYPE_CHECKING:  # torch is imported by the torch problems' builders, on first use
    from .torch_problem import TorchProblem


@dataclass(frozen=True)
class ProblemSpec:
    """A named problem: how to build it, the training defaults it suggests
    (lr, batch size, budget), and the options it takes.

    ``build(dtype=..., **option values)`` returns the Problem. A spec with
    an ``argument`` (say "PATH") is named ``NAME:ARGUMENT`` and is built
    with ``build(argument, dtype=..., ...)``. Other packages register specs
    through the ``monsoon.problems`` entry-point group."""
    name: str
    build: callable
    description: str = ""
    defaults: dict = field(default_factory=dict)
    options: tuple = ()
    argument: str | None = None   # what may follow "NAME:", for help and errors
    argument_required: bool = False
    engine: str | None = None   # the one engine that trains it (its data lives there)

    def usage(self) -> str:
        if self.argument is None:
            return self.name
        return f"{self.name}:{self.argument}" if self.argument_required \
            else f"{self.name}[:{self.argument}]"


CatalogEntry = ProblemSpec


def _fraction(value) -> str | None:
    return None if 0.0 <= value < 1.0 else "in [0, 1)"


VAL_FRACTION = Option("val_fraction", float, None,
                      "hold out this fraction of the examples as a validation set "
                      "(digits: 0.2, others: 0)", check=_fraction)
INIT = Option("init", str, None, "initial weights: 'seed' (re-drawn from the run's seed, "
              "the catalog's default) or 'module' (the module's as built)",
              choices=("module", "seed"))
TORCH_OPTIONS = (VAL_FRACTION, INIT)


@contextlib.contextmanager
def _own_generator():
    """Build a catalog network from torch's generator seeded 0, then give
    the caller's generator back: its weights (``--init module``) are the
    same at every call, and the user's own draws do not move."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        yield


def _normal_init(module):
    for p in module.parameters():
        p.normal_(0.0, 1.0)


def parabola(dtype="float32", val_fraction=None, init=None) -> TorchProblem:
    from torch import nn

    from .torch_problem import TorchProblem

    x = np.linspace(-2, 2, 50)[:, None]
    y = np.square(x)
    with _own_generator():
        net = nn.Sequential(nn.Linear(1, 5), nn.Tanh(), nn.Linear(5, 1))
    return TorchProblem(net, nn.MSELoss(), x, y, dtype=dtype, name="parabola",
                        init_fn=_normal_init, init=init or "seed",
                        val_fraction=val_fraction or 0.0)


def _exp_init(module):
    first, last = module[0], module[2]
    first.weight.uniform_(0.0, 1.0)
    first.bias.zero_()
    last.weight.uniform_(-0.25, 0.25)
    last.bias.zero_()


def exp(dtype="float32", val_fraction=None, init=None) -> TorchProblem:
    from torch import nn

    from .torch_problem import TorchProblem

    x = np.linspace(-1, 1, 256)[:, None]
    y = np.exp(x)
    with _own_generator():
        net = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    return TorchProblem(net, nn.MSELoss(), x, y, dtype=dtype, name="exp", init_fn=_exp_init,
                        init=init or "seed", val_fraction=val_fraction or 0.0)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (images 1797x64 in 0..16, labels 0..9), read from
    the file scikit-learn ships without importing scikit-learn: the import
    costs about a second of CPU in every worker process that builds the
    problem (a Ray actor, a torchrun rank), the file a few milliseconds.
    Falls back to ``load_digits`` where that file is not found."""
    spec = importlib.util.find_spec("sklearn")  # finds the package, runs none of it
    path = (Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
            if spec is not None and spec.origin else None)
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        data = load_digits()
        return data.data, data.target
    raw = np.loadtxt(path, delimiter=",")  # as load_digits reads it
    return raw[:, :-1], raw[:, -1].astype(int)


def digits(dtype="float32", val_fraction=None, init=None) -> TorchProblem:
    import torch
    from torch import nn

    from .torch_problem import TorchProblem

    images, labels = digits_arrays()
    X = images / 16.0
    y = torch.as_tensor(labels, dtype=torch.long)
    with _own_generator():
        net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    return TorchProblem(net, nn.CrossEntropyLoss(), X, y, dtype=dtype, name="digits",
                        init=init or "seed",
                        val_fraction=0.2 if val_fraction is None else val_fraction)


def linear(dtype="float64"):
    return synthetic("squared", dtype=dtype)


def logistic(dtype="float64"):
    return synthetic("logistic", dtype=dtype)


def quadratic(dtype="float32"):
    return Quadratic(dtype=dtype)


CATALOG = {
    "parabola": CatalogEntry(
        "parabola", parabola, "seed 000: y = x^2, 50 points, 1-5-1 tanh net",
        {"lr": 0.01, "steps": 2000, "batch_size": 50}, TORCH_OPTIONS),
    "exp": CatalogEntry(
        "exp", exp, "seed 001: y = e^x, 256 points, 1-16-1 tanh net",
        {"lr": 0.05, "epochs": 200, "batch_size": 16}, TORCH_OPTIONS),
    "digits": CatalogEntry(
        "digits", digits, "scikit-learn digits (1797 8x8 images), MLP 64-64-10",
        {"lr": 0.05, "epochs": 10, "batch_size": 32}, TORCH_OPTIONS),
    "linear": CatalogEntry(
        "linear", linear, "least squares, 16384 x 20 planted model (NumPy)",
        {"lr": 0.05, "epochs": 2, "batch_size": 16}),
    "logistic": CatalogEntry(
        "logistic", logistic, "logistic regression, 16384 x 20 planted model (NumPy)",
        {"lr": 0.1, "epochs": 2, "batch_size": 16}),
    "quadratic": CatalogEntry(
        "quadratic", quadratic, "1M parameters, a two-pass gradient: what moving parameters costs",
        {"lr": 0.1, "steps": 200, "batch_size": 8}),
}

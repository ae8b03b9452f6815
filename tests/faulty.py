"""A problem that misbehaves on purpose, for fault tests.

It wraps a real problem and, on worker ``rank`` only (None: on every
worker), after ``after`` gradient calls (and up to call ``until``, where
given: its first faults only, then healthy again), raises, returns a NaN gradient,
returns a finite gradient whose steps overflow the parameters (a
diverging worker), exits the process (at once, or in mode
"exit-after-pause" 1 s later: a Ray driver's polls have seen its figures),
hangs, or takes 0.1 s longer per gradient (a straggler); in mode "exit-at-end" it exits as the worker
reports at the end of its run (a rank lost after its last step: the
report reads the problem's ``state``), the other ranks reporting 0.5 s
later. ``SignalOnce`` presses Ctrl-C on
the run from inside a gradient; ``ReportsLoss`` says the mini-batch loss it is
told to. ``TellsDrops`` is SGD that notes each dropped update it is told of
in a file, wherever it runs (a Ray shard's process). They live in an
importable module because spawned workers unpickle them by name.
"""
import os
import signal
import time

import numpy as np

from monsoon.options import Option
from monsoon.problems import Problem
from monsoon.rules.sgd import SGD


class FaultyProblem(Problem):
    def __init__(self, inner: Problem, mode: str, rank: int = 1, after: int = 5, every: int = 0,
                 until: int | None = None):
        self.inner = inner
        self.mode = mode
        self.fault_rank = rank
        self.after = after
        self.every = every
        self.until = until
        self.rank = 0
        self.calls = 0
        self.name = inner.name
        self.dtype = inner.dtype
        self.n_params = inner.n_params
        self.n_examples = inner.n_examples

    def for_worker(self, rank, workers):
        clone = FaultyProblem(self.inner.for_worker(rank, workers), self.mode, self.fault_rank,
                              self.after, self.every, self.until)
        clone.rank = rank
        return clone

    def initial_params(self, seed):
        return self.inner.initial_params(seed)

    def loss(self, w):
        return self.inner.loss(w)

    def gradient(self, w, indices, out=None, accumulate=False):
        self.calls += 1
        loss, grad = self.inner.gradient(w, indices, out, accumulate)
        armed = self.fault_rank in (None, self.rank) and self.calls > self.after
        if self.until is not None:
            armed = armed and self.calls <= self.until
        if self.every:
            armed = armed and self.calls % self.every == 0
        if not armed or self.mode == "exit-at-end":
            return loss, grad
        if self.mode == "nan":
            grad[0] = np.nan
            return loss, grad
        if self.mode == "overflow":  # finite, but a few steps of lr 0.5 take w[0] past the
            grad[...] = 0           # dtype's largest value: the worker's copy turns -inf
            grad[0] = np.finfo(grad.dtype).max / 2
            return loss, grad
        if self.mode == "raise":
            raise RuntimeError(f"injected failure on worker {self.rank}")
        if self.mode == "exit":
            os._exit(3)
        if self.mode == "exit-after-pause":
            time.sleep(1.0)
            os._exit(3)
        if self.mode == "hang":
            time.sleep(3600)
        if self.mode == "slow":
            time.sleep(0.1)
            return loss, grad
        raise ValueError(f"unknown fault mode {self.mode}")

    def state(self):
        if self.mode == "exit-at-end" and self.fault_rank in (None, self.rank):
            os._exit(3)
        if self.mode == "exit-at-end" and self.fault_rank is not None and self.fault_rank >= 0:
            time.sleep(0.5)  # the others report late: the lost rank's exit comes first
        return super().state()


def _unavailable():
    raise ImportError("this node cannot load the problem's code")


class UnshippableProblem(FaultyProblem):
    """Works here, but fails to unpickle in a worker (a node missing a library)."""

    def __init__(self, inner):
        super().__init__(inner, "none", rank=-1)

    def for_worker(self, rank, workers):
        return self

    def __reduce__(self):
        return (_unavailable, ())


class RefusedInRanks(FaultyProblem):
    """Refused (a ConfigError) as a torch rank (RANK set) makes its
    worker's instance; each refusal's rank is noted in the file ``log``."""

    def __init__(self, inner, log):
        super().__init__(inner, "none", rank=-1)
        self.log = str(log)

    def for_worker(self, rank, workers):
        if "RANK" not in os.environ:
            return self
        from monsoon.errors import ConfigError

        with open(self.log, "a") as f:
            f.write(f"{rank}\n")
        raise ConfigError(f"problem refused in rank {rank}")


class ExitOnce(FaultyProblem):
    """"exit" on worker ``rank`` after ``after`` gradients, in its first
    process only: the file ``flag`` (made just before the exit) tells a
    process started again for the same rank to train on."""

    def __init__(self, inner: Problem, flag, rank: int = 1, after: int = 5):
        super().__init__(inner, "exit", rank, after)
        self.flag = str(flag)

    def for_worker(self, rank, workers):
        clone = ExitOnce(self.inner.for_worker(rank, workers), self.flag, self.fault_rank,
                         self.after)
        clone.rank = rank
        return clone

    def gradient(self, w, indices, out=None, accumulate=False):
        if self.rank == self.fault_rank and self.calls >= self.after \
                and not os.path.exists(self.flag):
            open(self.flag, "w").close()
            os._exit(3)
        self.calls += 1
        return self.inner.gradient(w, indices, out, accumulate)


class SignalOnce(FaultyProblem):
    """Ctrl-C from inside a run: worker ``rank``'s gradient number ``after``
    sends SIGINT to process ``pid`` (the run's monitor), then takes
    ``pause`` seconds longer, so that the monitor has asked the workers to
    stop before this one's next op. It trains as the inner problem does
    (its gradients and training defaults), so that a run resumed, or run
    whole, on the inner problem itself is the same run."""

    def __init__(self, inner: Problem, pid: int, rank: int = 1, after: int = 6,
                 pause: float = 2.0):
        super().__init__(inner, "signal", rank, after)
        self.pid, self.pause = pid, pause
        self.defaults = inner.defaults  # lr, batch size: the inner problem's

    def for_worker(self, rank, workers):
        clone = SignalOnce(self.inner.for_worker(rank, workers), self.pid, self.fault_rank,
                           self.after, self.pause)
        clone.rank = rank
        return clone

    def gradient(self, w, indices, out=None, accumulate=False):
        self.calls += 1
        result = self.inner.gradient(w, indices, out, accumulate)
        if self.rank == self.fault_rank and self.calls == self.after:
            os.kill(self.pid, signal.SIGINT)
            time.sleep(self.pause)
        return result


class ReportsLoss(FaultyProblem):
    """Trains as the inner problem does, but says its mini-batch loss is
    ``first`` for a worker's first ``count`` gradients, then ``then``: what
    the live series show of them can be checked exactly."""

    def __init__(self, inner: Problem, first: float, count: int = 1, then: float = 1.0):
        super().__init__(inner, "none", rank=-1)
        self.first, self.count, self.then = first, count, then
        self.defaults = inner.defaults

    def for_worker(self, rank, workers):
        clone = ReportsLoss(self.inner.for_worker(rank, workers), self.first, self.count,
                            self.then)
        clone.rank = rank
        return clone

    def gradient(self, w, indices, out=None, accumulate=False):
        self.calls += 1
        _, grad = self.inner.gradient(w, indices, out, accumulate)
        return (self.first if self.calls <= self.count else self.then), grad


class CountsLoss(ReportsLoss):
    """Trains as the inner problem does, but says its mini-batch loss is the
    gradient's number on its worker (1, 2, ...) plus 1000 times the worker's
    rank: the losses of any stretch of a worker's steps are known."""

    def __init__(self, inner: Problem):
        super().__init__(inner, 0.0)

    def for_worker(self, rank, workers):
        clone = CountsLoss(self.inner.for_worker(rank, workers))
        clone.rank = rank
        return clone

    def gradient(self, w, indices, out=None, accumulate=False):
        self.calls += 1
        _, grad = self.inner.gradient(w, indices, out, accumulate)
        return float(self.calls + 1000 * self.rank), grad


class CountedMSE:
    """A torch problem's loss function that trains as mean squared error but
    says its value is the training step's number on its rank (1, 2, ...)
    plus 1000 times the rank (RANK, under torchrun): ``CountsLoss`` for a
    torch model (the torch engine's gradient buckets)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, out, target):
        import torch

        mse = torch.nn.functional.mse_loss(out, target)
        if not torch.is_grad_enabled():  # an evaluation, not a step
            return mse
        self.calls += 1
        return mse - mse.detach() + (self.calls + 1000 * int(os.environ.get("RANK", 0)))


class TellsDrops(SGD):
    """SGD that appends a line to the file ``told_file`` each time it is
    told of a dropped update (``Rule.on_dropped``): the size of the
    parameters it was told on (a whole vector, or a shard's slice)."""
    name = "tells-drops"
    options = SGD.options + (Option("told_file", str, "", "the file each drop is noted in"),)

    def __init__(self, schedule, told_file: str = "", **options):
        super().__init__(schedule, **options)
        self.told_file = told_file

    def on_dropped(self, w, state):
        with open(self.told_file, "a") as f:
            f.write(f"{w.size}\n")

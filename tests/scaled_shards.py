"""A quadratic whose workers' data differ in scale: worker k's loss on
example i is a_k / 2 ||w - t_i - c_k||^2 (``for_worker`` gives each worker
its own a_k and c_k; the t_i are noise, so the gradients never vanish).
The full-data objective is the mean over workers, whose minimum is

    w* = mean_i t_i + sum_k a_k c_k / sum_k a_k.

An adaptive rule with a sum per worker scales worker k's steps by about
1 / a_k, so averaged copies settle near mean_i t_i + mean_k c_k instead.
It lives in an importable module because spawned workers unpickle it by
name."""
import numpy as np

from monsoon.problems import Problem


class ScaledShards(Problem):
    name = "scaled-shards"

    def __init__(self, scales=(1.0, 8.0), n_params: int = 6, n_examples: int = 512,
                 noise: float = 0.3, seed: int = 0):
        rng = np.random.default_rng([seed, 2019])
        self.dtype = np.dtype("float64")
        self.n_params, self.n_examples = n_params, n_examples
        self.scales = np.asarray(scales, dtype=float)
        workers = len(self.scales)
        # worker k's centre: +1 for the first half of the workers, -1 for the rest
        self.centres = np.where(np.arange(workers)[:, None] < workers / 2, 1.0, -1.0) \
            * np.ones((workers, n_params))
        self.targets = noise * rng.standard_normal((n_examples, n_params))
        self.rank = None  # the base problem: the mean over the workers

    def for_worker(self, rank, workers):
        if workers != len(self.scales):
            raise ValueError(f"{len(self.scales)} workers' scales given, {workers} workers")
        clone = ScaledShards.__new__(ScaledShards)
        clone.__dict__.update(self.__dict__)
        clone.rank = rank
        return clone

    def initial_params(self, seed):
        return np.zeros(self.n_params)

    def gradient(self, w, indices, out=None, accumulate=False):
        k = self.rank if self.rank is not None else 0
        a, c = self.scales[k], self.centres[k]
        d = w - self.targets[indices] - c
        loss = 0.5 * a * float((d * d).sum(axis=1).mean())
        g = a * d.mean(axis=0)
        if out is None:
            return loss, g
        if accumulate:
            out += g
        else:
            out[...] = g
        return loss, out

    def loss(self, w):
        total = 0.0
        for a, c in zip(self.scales, self.centres):
            d = w - self.targets - c
            total += 0.5 * a * float((d * d).sum(axis=1).mean())
        return total / len(self.scales)

    def minimum(self) -> np.ndarray:
        return self.targets.mean(axis=0) + (self.scales[:, None] * self.centres).sum(axis=0) \
            / self.scales.sum()

"""The peer: Downpour written directly with Ray actors, the way Ray's own
parameter-server example does it. One parameter-server actor; each worker
actor fetches the parameters, computes the gradient of the ``quadratic``
problem, and pushes it (one push in flight, as monsoon's Downpour does)."""
import time

import numpy as np
import ray

from monsoon.problems.quadratic import Quadratic


@ray.remote(num_cpus=0)
class ParameterServer:
    def __init__(self, n, lr):
        self.w = np.zeros(n, dtype=np.float32)
        self.lr = lr

    def get(self):
        return self.w

    def push(self, g):
        self.w -= self.lr * g
        return True


@ray.remote(num_cpus=0)
class Worker:
    def __init__(self, ps, rank, workers, batch):
        self.ps, self.rank, self.workers, self.batch = ps, rank, workers, batch
        self.problem = Quadratic()

    def ready(self):
        return True

    def run(self, steps):
        rng = np.random.default_rng(self.rank)
        pending = None
        for _ in range(steps):
            w = ray.get(self.ps.get.remote())
            _, g = self.problem.gradient(w, rng.integers(0, 1024, self.batch))
            if pending is not None:
                ray.get(pending)
            pending = self.ps.push.remote(g.copy())
        ray.get(pending)
        return steps


def raw_ray_updates_per_s(workers: int, updates: int, batch: int = 8, lr: float = 0.1) -> float:
    ps = ParameterServer.remote(1_000_000, lr)
    actors = [Worker.remote(ps, r, workers, batch) for r in range(workers)]
    ray.get([a.ready.remote() for a in actors])
    t0 = time.perf_counter()
    done = sum(ray.get([a.run.remote(updates // workers) for a in actors]))
    rate = done / (time.perf_counter() - t0)
    for a in actors + [ps]:
        ray.kill(a)
    return rate

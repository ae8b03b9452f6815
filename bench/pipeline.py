"""The pipeline strategy, S = 2 stages, M = 1..16 micro-batches.

A balanced model (4 identical Linear+ReLU blocks, 2 per stage) trains for a
few steps on the local engine with each M. Printed per M:

- the measured bubble (1 - sum of the stages' compute time / (S x wall),
  medians over the steps) against GPipe's (S - 1) / (M + S - 1);
- throughput (examples/s, start-up excluded) against ``serial``, one process
  with every core;
- the sim engine's predicted step time and bubble against the local
  measurement (target: within 15%). The sim models the SCHEDULE: its
  ``--compute-s`` is the compute the local run's stages did per step (the
  sum of their busy times, which on a shared machine is the only compute
  time measured under the same load), and ``--latency-s``/``--bandwidth``
  come from a pipe ping-pong between two processes measured beforehand (an
  upper bound on the shared-memory channels' cost); the
  waiting, i.e. the bubble and the step time, is the sim's prediction. A
  second column gives the sim with ``--compute-s`` measured beforehand in
  this process (one forward + backward of the whole model, one thread),
  which on a loaded machine says mostly how loaded it was.

    python bench/pipeline.py [--width 512] [--batch 512] [--steps 12]
"""
import argparse
import multiprocessing as mp
import time

import numpy as np
import torch
from torch import nn

import monsoon
from monsoon.pipeline.schedules import gpipe_bubble
from monsoon.problems import TorchProblem

S = 2
MS = (1, 2, 4, 8, 16)


def problem(width: int, n: int) -> TorchProblem:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, width)).astype(np.float32)
    y = rng.standard_normal((n, width)).astype(np.float32)
    blocks = []
    for _ in range(4):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return TorchProblem(nn.Sequential(*blocks), nn.MSELoss(), X, y, name="mlp-4x%d" % width)


def compute_s(p: TorchProblem, batch: int) -> float:
    """One forward + backward of the whole model on one batch, one thread."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        w = p.initial_params(0)
        idx = np.arange(batch)
        p.gradient(w, idx)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            p.gradient(w, idx)
            times.append(time.perf_counter() - t0)
        return float(np.median(times))
    finally:
        torch.set_num_threads(saved)


def _echo(conn):
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(msg)


def pipe_cost(nbytes: int):
    """(latency s, bandwidth B/s) of a pickled array over a pipe between processes."""
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    proc = ctx.Process(target=_echo, args=(b,), daemon=True)
    proc.start()

    def one_way(size, rounds=50):
        arr = (0, np.zeros(size // 4, dtype=np.float32))
        a.send(arr)
        a.recv()
        t0 = time.perf_counter()
        for _ in range(rounds):
            a.send(arr)
            a.recv()
        return (time.perf_counter() - t0) / rounds / 2

    small, big = one_way(64), one_way(max(nbytes, 1 << 16))
    a.send(None)
    proc.join(5)
    latency = small
    bandwidth = max(nbytes, 1 << 16) / max(big - small, 1e-9)
    return latency, bandwidth


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    p = problem(args.width, args.batch * 4)
    opts = dict(steps=args.steps, batch_size=args.batch, lr=0.01, evals=0, seed=0)
    c = compute_s(p, args.batch)
    latency, bandwidth = pipe_cost(args.batch // 16 * args.width * 4)
    print(f"model {p.name}: {p.n_params * 4 / 1e6:.1f} MB, batch {args.batch}, {args.steps} steps; "
          f"measured: compute {c * 1e3:.1f} ms/batch (1 thread), pipe latency "
          f"{latency * 1e6:.0f} us, bandwidth {bandwidth / 1e9:.2f} GB/s")
    serial = monsoon.train(p, "serial", **opts).summary["examples_per_s"]
    print(f"serial (one process, all cores): {serial:.0f} examples/s")
    print(f"{'M':>3} {'bubble':>7} {'GPipe':>6} {'ex/s':>7} {'vs serial':>9} "
          f"{'step ms':>8} {'sim ms':>7} {'sim err':>8} {'sim bubble':>10} {'sim0 err':>9}")
    worst = 0.0
    for M in MS:
        local = monsoon.train(p, "pipeline", S, micro_batches=M, **opts).summary
        # medians over the steps: a shared machine's spikes spoil means
        step = local["stages"][0]["step_s_median"]
        busy = sum(st["busy_s_median"] for st in local["stages"])
        sim, sim0 = (monsoon.train(p, "pipeline", S, micro_batches=M, engine="sim",
                                   sim_compute_s=cs, sim_latency_s=latency,
                                   sim_bandwidth=bandwidth, **opts).summary for cs in (busy, c))
        err = sim["sim_step_s"] / step - 1
        worst = max(worst, abs(err))
        bubble = max(0.0, 1 - busy / (S * step))
        print(f"{M:>3} {bubble:>7.3f} {gpipe_bubble(S, M):>6.3f} "
              f"{local['examples_per_s']:>7.0f} {local['examples_per_s'] / serial:>8.2f}x "
              f"{step * 1e3:>8.1f} {sim['sim_step_s'] * 1e3:>7.1f} {err:>+8.1%} "
              f"{sim['bubble_fraction']:>10.3f} {sim0['sim_step_s'] / step - 1:>+9.1%}")
    print(f"worst sim error on the step time: {worst:.1%} (target: within 15%)")


if __name__ == "__main__":
    main()

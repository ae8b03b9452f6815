"""The pipeline strategy, S = 2 stages, M = 1..16 micro-batches.

A balanced model (4 identical Linear+ReLU blocks, 2 per stage) trains for a
few steps on the local engine with each M. Printed per M:

- the measured bubble (1 - sum of the stages' compute time / (S x wall),
  medians over the steps) against GPipe's (S - 1) / (M + S - 1);
- throughput (examples/s, start-up excluded) against ``serial``, one process
  with every core;
- the sim engine's predicted step time and bubble against the local
  measurement (target: within 15%). The sim models the SCHEDULE: it is
  given what a user measures, and predicts the waiting. Its inputs:
  ``--stage-compute-s``, each stage's compute per step in the local run at
  this M (its median ``busy_s``: forward, backward and update, without the
  transport; on a shared machine the only compute time measured under the
  same load, and the stages differ: the last computes the loss, the first
  no input gradient); ``--latency-s``/``--bandwidth`` of the local engine's
  own shared-memory channel (``engines/local/channels.py``), measured by a
  ping-pong between two processes whose receiver has been waiting, as a
  stage waits through the bubble (it then sleeps, and wakes up late).
  A second column gives the sim with each stage's forward + backward
  measured beforehand in this process at the micro-batch size B / M (one
  thread, nothing else running in the pipeline): what a user can measure
  without running the pipeline; on a loaded machine it says mostly how
  loaded the machine was.

    python bench/pipeline.py [--width 512] [--batch 512] [--steps 12]
"""
import argparse
import multiprocessing as mp
import time

import numpy as np
import torch
from torch import nn

import monsoon
from monsoon.strategies.pipeline.schedules import gpipe_bubble
from monsoon.problems import TorchProblem
from records import row, write_record

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


def stage_compute(p: TorchProblem, batch: int, micro: int, repeats: int = 5) -> list[float]:
    """Each stage's forward + backward + update seconds on one batch cut into
    ``micro`` micro-batches, run in this process one op after another (the
    sim's own in-process stages), one thread; medians over ``repeats``."""
    from collections import deque

    from monsoon.engines.sim.pipeline import _Link
    from monsoon.strategies.pipeline import Pipeline
    from monsoon.strategies.pipeline.runner import stage_payloads
    from monsoon.strategies.pipeline.schedules import dependency_order
    from monsoon.rules import make_rule

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        strategy = Pipeline(S, micro)
        specs, _, _ = strategy.layout(p, S, batch)
        w0 = p.initial_params(0)
        ws = [pl["make"]() for pl in stage_payloads(strategy, p, make_rule("sgd", 0.01), specs,
                                                    1, w0, batch, 0, None)]
        queues = {(k, 0, s): deque() for k in ("act", "grad") for s in range(S)}
        links = [_Link(queues, 0, s, {}) for s in range(S)]
        rows = []
        for t in range(repeats + 1):  # the first warms torch up
            took = [0.0] * S
            for w in ws:
                w.begin(np.arange(batch))
            for s, _, _, _ in dependency_order([w.plan for w in ws]):
                t0 = time.perf_counter()
                in_link = ws[s].run_op(links[s])
                took[s] += time.perf_counter() - t0 - in_link
            for s, w in enumerate(ws):
                t0 = time.perf_counter()
                w.gather()
                w.apply(t)
                took[s] += time.perf_counter() - t0
            rows.append(took)
        return [float(x) for x in np.median(np.array(rows[1:]), axis=0)]
    finally:
        torch.set_num_threads(saved)


def _echo(fwd, back, rounds, compute_s):
    fwd.attach(30.0, lambda: False)
    back.attach(30.0, lambda: False)
    for m in range(rounds):
        a = fwd.recv(m, "a message")
        end = time.perf_counter() + compute_s
        while time.perf_counter() < end:  # a stage computing: the other end waits
            pass
        back.send(m, a, "a reply")


def channel_cost(nbytes: int, compute_s: float = 0.005, rounds: int = 40):
    """(latency s, bandwidth B/s) of the local engine's shared-memory channel
    (``engines/local/channels.Channel``, two slots, two processes), the receiver having waited
    ``compute_s`` for the message, as a stage waits through the bubble."""
    from monsoon.engines.local.channels import Channel

    ctx = mp.get_context("spawn")

    def one_way(size):
        fwd, back = Channel(2, size), Channel(2, size)
        proc = ctx.Process(target=_echo, args=(fwd, back, rounds, compute_s), daemon=True)
        proc.start()
        try:
            fwd.attach(30.0, lambda: False)
            back.attach(30.0, lambda: False)
            arr = np.zeros(size // 4, dtype=np.float32)
            times = []
            for m in range(rounds):
                t0 = time.perf_counter()
                fwd.send(m, arr, "a message")
                back.recv(m, "a reply")
                times.append(time.perf_counter() - t0 - compute_s)
            proc.join(10)
        finally:
            if proc.is_alive():
                proc.terminate()
                proc.join(2)
            fwd.close()
            back.close()
        return float(np.median(times[3:])) / 2

    small, big = one_way(64), one_way(max(nbytes, 1 << 16))
    bandwidth = max(nbytes, 1 << 16) / max(big - small, 1e-9)
    return small, bandwidth


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    t_start = time.perf_counter()
    p = problem(args.width, args.batch * 4)
    opts = dict(steps=args.steps, batch_size=args.batch, lr=0.01, evals=0, seed=0)
    latency, bandwidth = channel_cost(args.batch * args.width * 4)
    print(f"model {p.name}: {p.n_params * 4 / 1e6:.1f} MB, batch {args.batch}, {args.steps} steps; "
          f"measured: shared-memory channel latency {latency * 1e6:.0f} us, bandwidth "
          f"{bandwidth / 1e9:.2f} GB/s (receiver waiting)")
    serial = monsoon.train(p, "serial", **opts).summary["examples_per_s"]
    print(f"serial (one process, all cores): {serial:.0f} examples/s")
    print(f"{'M':>3} {'bubble':>7} {'GPipe':>6} {'ex/s':>7} {'vs serial':>9} {'stage ms':>11} "
          f"{'step ms':>8} {'sim ms':>7} {'sim err':>8} {'sim bubble':>10} "
          f"{'pre ms':>11} {'sim0 err':>9}")
    worst, records = 0.0, []
    for M in MS:
        local = monsoon.train(p, "pipeline", S, micro_batches=M, **opts).summary
        # medians over the steps: a shared machine's spikes spoil means
        step = local["stages"][0]["step_s_median"]
        stage_s = [st["busy_s_median"] for st in local["stages"]]
        before = stage_compute(p, args.batch, M)
        sim, sim0 = (monsoon.train(p, "pipeline", S, micro_batches=M, engine="sim",
                                   sim_stage_compute_s=",".join(f"{x:.6g}" for x in times),
                                   sim_latency_s=latency, sim_bandwidth=bandwidth,
                                   **opts).summary for times in (stage_s, before))
        err = sim["sim_step_s"] / step - 1
        worst = max(worst, abs(err))
        bubble = max(0.0, 1 - sum(stage_s) / (S * step))
        ms = lambda xs: "/".join(f"{x * 1e3:.1f}" for x in xs)  # noqa: E731
        print(f"{M:>3} {bubble:>7.3f} {gpipe_bubble(S, M):>6.3f} "
              f"{local['examples_per_s']:>7.0f} {local['examples_per_s'] / serial:>8.2f}x "
              f"{ms(stage_s):>11} {step * 1e3:>8.1f} {sim['sim_step_s'] * 1e3:>7.1f} {err:>+8.1%} "
              f"{sim['bubble_fraction']:>10.3f} {ms(before):>11} "
              f"{sim0['sim_step_s'] / step - 1:>+9.1%}", flush=True)
        records.append(row(f"M = {M}", ratio=1 + err, target="within 15%", met=abs(err) <= 0.15,
                           unit="sim step time / local", bubble=bubble,
                           gpipe_bubble=gpipe_bubble(S, M), step_s=step,
                           sim_step_s=sim["sim_step_s"],
                           examples_per_s_over_serial=local["examples_per_s"] / serial))
    print(f"worst sim error on the step time: {worst:.1%} (target: within 15%); "
          f"bench took {time.perf_counter() - t_start:.0f} s")
    write_record("pipeline", vars(args), records, {
        "ratio": worst, "target": "<= 0.15 off", "met": worst <= 0.15,
        "ratio_runs": [r["ratio"] - 1 for r in records],
        "line": f"S = 2, M = {MS[0]}-{MS[-1]}: the sim's step time is off the local engine's by "
                f"at most {worst:.1%} (target within 15%)"})


if __name__ == "__main__":
    main()

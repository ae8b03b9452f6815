"""A torch MLP on a Spark DataFrame, ``local[2]``: monsoon's spark engine
against what a Spark user has for torch, ``TorchDistributor`` (issue 35).

Data: N rows generated on the executors (never on the driver) into a
DataFrame of two partitions, an array column ``x`` (D floats, drawn from
the row's id) and a class ``y`` (a planted tanh teacher's argmax over 10
classes). Model: MLP D-256-256-10 (ReLU), cross-entropy, plain SGD, float32,
global batch B, E epochs, every side starting from the same weights.

- monsoon: ``TorchProblem.from_spark(df, mlp(), CrossEntropyLoss(),
  features="x", label="y")`` and ``monsoon.train(..., "sync", 2,
  engine="spark")``: each partition's rows become tensors on its executor,
  one Spark job per step. Async and local-sgd run alongside at their
  defaults on the same data and budget.
- peer: ``TorchDistributor(num_processes=2, local_mode=True,
  use_gpu=False).run(train)``: two torchrun processes running DDP (gloo,
  one torch thread each, as torchrun sets), each taking its half of the
  SAME global batches monsoon's sync draws (``global_batches``), on the
  same rows, generated in the processes from the same ids.

Figures, per interleaved repeat: examples/s end to end (from the call to
its return: monsoon's DataFrame conversion, the peer's process launch and
data generation; less the time either spends evaluating the loss curve
this benchmark draws) and in the steady state (after 3 warm-up steps, start-up
excluded); the loss curve: the full-data loss of sync's recorded rows
against the peer's after as many steps (its parameters kept every step and
evaluated after the run). Target: sync's end-to-end examples/s >= 1.0x the
peer's, its loss curve within 1% of the peer's.

    python bench/spark_vs_torchdistributor.py [--repeats 3] [--rows 32768] [--epochs 2]
        [--width 64] [--batch 1024]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import monsoon  # noqa: E402
from common import WARMUP, examples_per_s_after_warmup  # noqa: E402
from records import row, write_record  # noqa: E402
from monsoon.engines.spark import start_session  # noqa: E402

D, HIDDEN, CLASSES, BATCH, LR, SEED = 64, 256, 10, 1024, 0.5, 0


def features(ids, d: int) -> np.ndarray:
    """Row i's features: d normal floats drawn from (SEED, i)."""
    return np.stack([np.random.default_rng([SEED, int(i)]).standard_normal(d)
                     .astype(np.float32) for i in ids])


def labels(X) -> np.ndarray:
    d = X.shape[1]
    teacher = np.random.default_rng([SEED, 1 << 40])
    A = teacher.standard_normal((d, 32)) / np.sqrt(d)
    B = teacher.standard_normal((32, CLASSES))
    return np.argmax(np.tanh(X @ A * 2) @ B, axis=1).astype(np.int64)


def mlp(d: int):
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(d, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def dataframe(spark, rows: int, d: int):
    """The DataFrame, generated on the executors: partition k holds ids
    k*rows/2 .. in order (so monsoon's global id of a row is its id)."""
    def part(ids):
        ids = list(ids)
        X = features(ids, d)
        return zip((x.tolist() for x in X), labels(X).tolist())

    rdd = spark.sparkContext.range(rows, numSlices=2).mapPartitions(part)
    return spark.createDataFrame(rdd, "x array<float>, y long")


def ours(spark, rows, epochs, strategy, evals, d, batch, lr=LR):
    from torch import nn

    t0 = time.perf_counter()
    data = monsoon.TorchProblem.from_spark(dataframe(spark, rows, d), mlp(d), nn.CrossEntropyLoss(),
                                           features="x", label="y")
    evaluate, spent = data.evaluate, [0.0]

    def timed(w):  # the curve is the benchmark's: its evaluation is not counted
        began = time.perf_counter()
        try:
            return evaluate(w)
        finally:
            spent[0] += time.perf_counter() - began

    data.evaluate = timed
    run = monsoon.train(data, strategy, 2, engine="spark", epochs=epochs, batch_size=batch,
                        lr=lr, seed=SEED, evals=evals, progress=False)
    wall = time.perf_counter() - t0 - spent[0]
    data.unpersist()
    s = run.summary
    return {"e2e": s["examples"] / wall, "steady": examples_per_s_after_warmup(run),
            "wall_s": wall, "loss": s["final_loss"], "accuracy": s.get("accuracy"),
            "curve": [(r["updates"], r["loss"]) for r in run.history],
            "n_push": s.get("n_push_chosen", s.get("n_push")), "updates": s["updates"]}


def ddp_train(rows, epochs, d, batch_size, lr=LR):
    """Runs in each torchrun process: DDP on its half of monsoon's sync
    batches; rank 0 returns its examples/s after warm-up and the full-data
    loss after every step."""
    import time

    import torch
    import torch.distributed as dist
    from torch import nn

    from monsoon.strategies.batches import Budget, global_batches, split

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    X = torch.from_numpy(features(range(rows), d))
    y = torch.from_numpy(labels(X.numpy()))
    model = nn.parallel.DistributedDataParallel(mlp(d))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    kept = [[p.detach().clone() for p in model.module.parameters()]]
    steps = 0
    for batch in global_batches(rows, batch_size, SEED, Budget(epochs=epochs)):
        if steps == WARMUP:
            dist.barrier()
            t0 = time.perf_counter()
        mine = torch.from_numpy(split(batch, world, rank).astype(np.int64))
        opt.zero_grad()
        loss_fn(model(X[mine]), y[mine]).backward()
        opt.step()
        steps += 1
        kept.append([p.detach().clone() for p in model.module.parameters()])
    dist.barrier()
    rate = (steps - WARMUP) * batch_size / (time.perf_counter() - t0)
    curve, began = [], time.perf_counter()
    if rank == 0:
        net = model.module.eval()
        with torch.no_grad():
            for step, params in enumerate(kept):
                for p, v in zip(net.parameters(), params):
                    p.copy_(v)
                curve.append((step, float(loss_fn(net(X), y))))
    dist.destroy_process_group()
    return {"steady": rate, "curve": curve, "steps": steps,
            "eval_s": time.perf_counter() - began}


def peer(rows, epochs, d, batch, lr=LR):
    from pyspark.ml.torch.distributor import TorchDistributor

    t0 = time.perf_counter()
    out = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(
        ddp_train, rows, epochs, d, batch, lr)
    wall = time.perf_counter() - t0 - out["eval_s"]
    out.update(e2e=out["steps"] * batch / wall, wall_s=wall, loss=out["curve"][-1][1])
    return out


def curve_gap(mine, theirs) -> float:
    """The largest relative gap between our recorded losses and the peer's
    after as many steps."""
    at = dict(theirs)
    return max(abs(loss - at[u]) / at[u] for u, loss in mine if u in at)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--width", type=int, default=D, help="features a row (the MLP's input)")
    ap.add_argument("--batch", type=int, default=BATCH, help="the global batch")
    ap.add_argument("--evals", type=int, default=8, help="rows of sync's loss curve")
    ap.add_argument("--lr", type=float, default=LR, help="every side's SGD rate")
    args = ap.parse_args()
    spark = start_session("local[2]", "monsoon-bench")
    spark.sparkContext.setLogLevel("ERROR")
    runs = {"sync": [], "async": [], "local-sgd": [], "peer": []}
    for rep in range(args.repeats):  # interleaved
        runs["peer"].append(peer(args.rows, args.epochs, args.width, args.batch, args.lr))
        for strategy in ("sync", "async", "local-sgd"):
            runs[strategy].append(ours(spark, args.rows, args.epochs, strategy,
                                       args.evals if strategy == "sync" else 2,
                                       args.width, args.batch, args.lr))
        for name in runs:
            r = runs[name][-1]
            print(f"  rep {rep + 1}/{args.repeats} {name}: {r['e2e']:.0f} examples/s end to "
                  f"end, {r['steady']:.0f} steady, loss {r['loss']:.4f}", file=sys.stderr,
                  flush=True)
    spark.stop()
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("e2e", "steady", "loss")}
           for name, rs in runs.items()}
    gaps = [curve_gap(m["curve"], p["curve"]) for m, p in zip(runs["sync"], runs["peer"])]
    gap = statistics.median(gaps)
    ratio = med["sync"]["e2e"] / med["peer"]["e2e"]
    steady = med["sync"]["steady"] / med["peer"]["steady"]
    met = ratio >= 1.0 and max(gaps) <= 0.01
    unit = "examples/s end to end (call to return, conversion / process launch included)"
    rows = [row("sync / TorchDistributor DDP, end to end", [r["e2e"] for r in runs["sync"]],
                [r["e2e"] for r in runs["peer"]], ratio, ">= 1.0", ratio >= 1.0, unit=unit,
                ratio_runs=[m["e2e"] / p["e2e"] for m, p in zip(runs["sync"], runs["peer"])],
                wall_s=[r["wall_s"] for r in runs["sync"]],
                peer_wall_s=[r["wall_s"] for r in runs["peer"]]),
            row("sync / TorchDistributor DDP, steady state", [r["steady"] for r in runs["sync"]],
                [r["steady"] for r in runs["peer"]], steady,
                unit=f"examples/s after {WARMUP} warm-up steps, start-up excluded"),
            row("sync loss curve vs DDP's", ratio=gap, target="<= 0.01", met=max(gaps) <= 0.01,
                unit="largest relative gap of the full-data loss at sync's recorded steps",
                ratio_runs=gaps, loss=med["sync"]["loss"], peer_loss=med["peer"]["loss"])]
    for name in ("async", "local-sgd"):
        rs = runs[name]
        rows.append(row(f"{name} / TorchDistributor DDP, end to end", [r["e2e"] for r in rs],
                        [r["e2e"] for r in runs["peer"]], med[name]["e2e"] / med["peer"]["e2e"],
                        unit=unit, loss=med[name]["loss"], peer_loss=med["peer"]["loss"],
                        steady=[r["steady"] for r in rs], n_push=[r["n_push"] for r in rs],
                        updates=[r["updates"] for r in rs]))
    # issue 48: async's final loss within 2% of sync's at the same rate and epochs
    to_sync = [a["loss"] / s["loss"] for a, s in zip(runs["async"], runs["sync"])]
    rows.append(row("async final loss / sync's", ratio=statistics.median(to_sync),
                    target="<= 1.02", met=max(to_sync) <= 1.02, ratio_runs=to_sync,
                    unit="full-data loss after the same epochs at the same rate, both at "
                         "their spark defaults otherwise"))
    for r in rows:
        print(f"{r['name']}: {r['ratio']:.3g}" + (f" (target {r['target']})" if r["target"]
                                                   else ""))
    print(f"final loss: sync {med['sync']['loss']:.4f}, async {med['async']['loss']:.4f}, "
          f"local-sgd {med['local-sgd']['loss']:.4f}, DDP {med['peer']['loss']:.4f}")
    write_record("spark_vs_torchdistributor", vars(args), rows, {
        "ratio": ratio, "steady_ratio": steady, "curve_gap": gap,
        "target": "sync's examples/s end to end >= 1.0x TorchDistributor's, loss curve "
                  "within 1%", "met": met,
        "line": f"spark sync on a DataFrame vs TorchDistributor DDP, MLP {args.width}-{HIDDEN}-"
                f"{HIDDEN}-{CLASSES}, {args.rows} rows, batch {args.batch}, on local[2]: "
                f"{ratio:.2f}x its examples/s end to end ({steady:.2f}x in the steady "
                f"state; target >= 1.0), loss curve within {100 * gap:.2g}% (target 1%)"})


if __name__ == "__main__":
    main()

"""monsoon's spark engine at its defaults against MLlib's LogisticRegression,
what a Spark user already has (issue 35).

Data: click-like sparse rows generated here (Zipf feature popularity, 0/1
labels from a planted model), written as libsvm files that Spark reads on
``local[2]``. Per dataset, interleaved repeats of:

- MLlib: ``spark.read.format("libsvm").load(path)`` and
  ``LogisticRegression().fit`` at its defaults; its loss is the training
  objective it reports (mean log-loss: regParam 0);
- monsoon: ``monsoon.train("spark:PATH", strategy, workers=2,
  engine="spark", target_loss=MLlib's loss x 1.01)`` with only the
  strategy chosen (sync, async, ssp, local-sgd) and the target given, every
  other option at its default: the run stops at the target. Its loss curve
  (``evals`` points of the full-data mean log-loss) gives the time it first
  reaches MLlib's loss x 1.01, counted end to end: from the call, data
  conversion included; the whole call (to its return, the curve's
  evaluation included) is reported beside it, as is the final loss.

Both time the read of the files. The SparkSession is started once, before
either. Target: the best of monsoon's sync and async reaches MLlib's loss
x 1.01 in at most MLlib's wall time, on every dataset.

``--epochs`` and ``--lr`` set the budget and rate of every strategy but
sync (whose defaults are L-BFGS's): a look at what another setting would
give, kept as a partial record, never shown in place of the defaults'.

    python bench/spark_vs_mllib.py [--repeats 3] [--quick] [--fresh | --fresh2 | --fresh3 | --fresh4] [--strategies a,b]
                                   [--epochs E] [--lr LR]
"""
import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import monsoon  # noqa: E402
from records import row, write_record  # noqa: E402
from monsoon.engines.spark import start_session  # noqa: E402

# (name, rows, features, non-zeros per row, Zipf exponent)
DATASETS = [
    ("clicks-200k-f16k", 200_000, 16_384, 20, 1.1),
    ("clicks-100k-f100k", 100_000, 100_000, 40, 1.3),
    ("clicks-150k-f32k", 150_000, 32_768, 30, 1.2),
]
# shapes no default was tuned on (issue 48): other rows, widths, Zipf exponents, non-zeros
FRESH = [
    ("fresh-120k-f24k-z1.05", 120_000, 24_576, 15, 1.05),
    ("fresh-250k-f60k-z1.4", 250_000, 60_000, 35, 1.4),
    ("fresh-80k-f8k-z1.25", 80_000, 8_192, 50, 1.25),
]
# drawn after the defaults took tol and 20 epochs (issue 48's third round), and
# not looked at before the record that first ran them
FRESH2 = [
    ("fresh2-160k-f40k-z1.15", 160_000, 40_000, 25, 1.15),
    ("fresh2-100k-f12k-z1.3", 100_000, 12_000, 40, 1.3),
    ("fresh2-200k-f80k-z1.6", 200_000, 80_000, 20, 1.6),
]
# drawn after async's pushes went over sockets with a tail-averaged model and tol
# 2e-4 (tuned on FRESH2's first file), and not looked at before the record that
# first ran them
FRESH3 = [
    ("fresh3-140k-f50k-z1.25", 140_000, 50_000, 30, 1.25),
    ("fresh3-90k-f20k-z1.1", 90_000, 20_000, 18, 1.1),
    ("fresh3-180k-f30k-z1.45", 180_000, 30_000, 45, 1.45),
]
# drawn after the workers kept pace and the defaults took 100 epochs and a one-epoch
# average (tuned on FRESH3's first file), and not looked at before the record that
# first ran them
FRESH4 = [
    ("fresh4-110k-f70k-z1.35", 110_000, 70_000, 22, 1.35),
    ("fresh4-220k-f25k-z1.2", 220_000, 25_000, 12, 1.2),
    ("fresh4-70k-f15k-z1.5", 70_000, 15_000, 60, 1.5),
]
SETS = {"fresh": FRESH, "fresh2": FRESH2, "fresh3": FRESH3, "fresh4": FRESH4}
STRATEGIES = ("sync", "async", "ssp", "local-sgd")


def write_libsvm(path: Path, rows, features, nnz, exponent, seed=0) -> None:
    rng = np.random.default_rng([seed, rows, features])
    pop = np.arange(1, features + 1, dtype=float) ** -exponent
    pop /= pop.sum()
    ids = rng.permutation(features)
    w_star = rng.standard_normal(features) * rng.random(features) ** 3 * 3
    with open(path, "w") as f:
        for start in range(0, rows, 20_000):
            m = min(20_000, rows - start)
            counts = np.clip(rng.poisson(nnz, m), 1, None)
            for k in range(m):
                cols = np.unique(ids[rng.choice(features, size=counts[k], p=pop)])
                margin = w_star[cols].sum() / math.sqrt(len(cols)) - 0.5
                y = int(rng.random() < 1 / (1 + math.exp(-margin)))
                v = 1 / math.sqrt(len(cols))
                f.write(f"{y} " + " ".join(f"{c + 1}:{v:.6g}" for c in cols) + "\n")


def mllib(spark, path):
    from pyspark.ml.classification import LogisticRegression

    t0 = time.perf_counter()
    df = spark.read.format("libsvm").load(str(path))
    model = LogisticRegression().fit(df)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "loss": float(model.summary.objectiveHistory[-1]),
            "iterations": model.summary.totalIterations}


def ours(path, strategy, target, **options):
    from monsoon.record.recorder import Recorder

    starts, start = [], Recorder.start

    def noted(self, params):  # when the run's clock starts (its curve's time 0)
        starts.append(time.perf_counter())
        return start(self, params)

    Recorder.start = noted
    try:
        t0 = time.perf_counter()
        run = monsoon.train(f"spark:{path}", strategy, 2, engine="spark", progress=False,
                            target_loss=target, raise_on_divergence=False, **options)
        wall = time.perf_counter() - t0
    finally:
        Recorder.start = start
    s = run.summary
    # a row at time_s was reached (start - call) + time_s after the call: the
    # read, conversion and start-up before it, never the curve's evaluation after
    before = starts[-1] - t0
    reached = [before + r["time_s"] for r in run.history if r["loss"] <= target]
    return {"wall_s": wall, "loss": float(s["final_loss"]),
            "to_target_s": reached[0] if reached else math.inf,
            "n_push": s.get("n_push_chosen", s.get("n_push")), "updates": s["updates"],
            # the exchange period the engine chose (n_push, local_steps or tau), where it chose
            "period_chosen": next((v for k, v in s.items() if k.endswith("_chosen")), None),
            # the share of its jobs (sync, local SGD) or of its socket exchanges
            # (async, SSP, EASGD) not spent in the tasks' steps
            "job_share": s.get("spark_job_share", s.get("spark_exchange_share")),
            "status": s["status"],
            "warning": s.get("warning") or s.get("stopped")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the first dataset, one repeat")
    ap.add_argument("--fresh", action="store_true",
                    help="the shapes no default was tuned on (FRESH), not DATASETS")
    ap.add_argument("--fresh2", action="store_true",
                    help="a second set of such shapes (FRESH2), not DATASETS")
    ap.add_argument("--fresh3", action="store_true",
                    help="a third set of such shapes (FRESH3), not DATASETS")
    ap.add_argument("--fresh4", action="store_true",
                    help="a fourth set of such shapes (FRESH4), not DATASETS")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--epochs", type=int,
                    help="epochs of every strategy but sync (a partial record)")
    ap.add_argument("--lr", type=float, help="rate of every strategy but sync (a partial record)")
    args = ap.parse_args()
    options = {k: v for k, v in (("epochs", args.epochs), ("lr", args.lr)) if v is not None}
    data = next((SETS[name] for name in SETS if getattr(args, name)), DATASETS)
    datasets, repeats = (data[:1], 1) if args.quick else (data, args.repeats)
    strategies = args.strategies.split(",")
    spark = start_session("local[2]", "monsoon-bench")
    spark.sparkContext.setLogLevel("ERROR")
    rows, met_all, lines, bests = [], True, [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, *shape in datasets:
            path = Path(tmp) / f"{name}.libsvm"
            write_libsvm(path, *shape)
            peer, mine = [], {s: [] for s in strategies}
            for _ in range(repeats):  # interleaved: MLlib, then each strategy
                peer.append(mllib(spark, path))
                target = 1.01 * statistics.median(p["loss"] for p in peer)
                for strategy in strategies:
                    mine[strategy].append(ours(path, strategy, target,
                                               **({} if strategy == "sync" else options)))
            peer_s = statistics.median(p["wall_s"] for p in peer)
            peer_loss = statistics.median(p["loss"] for p in peer)
            best = None
            for strategy in strategies:
                runs = mine[strategy]
                to_target = statistics.median(r["to_target_s"] for r in runs)
                ratio = peer_s / to_target if math.isfinite(to_target) else 0.0
                loss = statistics.median(r["loss"] for r in runs)
                rows.append(row(f"{name} [{strategy}]", [r["to_target_s"] for r in runs],
                                [p["wall_s"] for p in peer], ratio,
                                "reach MLlib's loss x1.01 within MLlib's time", ratio >= 1.0,
                                unit="s to MLlib's log-loss x1.01 (peer: MLlib's fit, read "
                                     "included)", loss=loss, mllib_loss=peer_loss,
                                losses=[r["loss"] for r in runs],
                                wall_s=[r["wall_s"] for r in runs],
                                n_push=[r["n_push"] for r in runs],
                                period_chosen=[r["period_chosen"] for r in runs],
                                updates=[r["updates"] for r in runs],
                                job_share=[r["job_share"] for r in runs],
                                status=[r["status"] for r in runs],
                                warning=[r["warning"] for r in runs]))
                whole = statistics.median(r["wall_s"] for r in runs)
                print(f"{name} {strategy}: to MLlib's loss x1.01 in {to_target:.3g} s, whole "
                      f"call {whole:.3g} s (MLlib's fit {peer_s:.3g} s, ratio {ratio:.3g}); "
                      f"final log-loss {loss:.4f} vs MLlib {peer_loss:.4f}; "
                      f"{[r['status'] for r in runs]}", flush=True)
                lines.append(f"{name} [{strategy}]: to target {to_target:.3g} s, whole call "
                             f"{whole:.3g} s, MLlib {peer_s:.3g} s")
                best = ratio if best is None else max(best, ratio)
            met_all &= best >= 1.0
            bests.append(best)
    spark.stop()
    worst = min(r["ratio"] for r in rows)
    partial = [why for why, cut in (("--quick", args.quick), (
        f"--strategies {args.strategies}", set(strategies) != set(STRATEGIES)),
        (f"--epochs {args.epochs}", args.epochs is not None),
        (f"--lr {args.lr}", args.lr is not None)) if cut]
    write_record("spark_vs_mllib", vars(args), rows, {
        "ratio": min(bests), "worst": worst,  # ratio: the hardest data set's best strategy
        "target": "best strategy reaches MLlib's log-loss x1.01 within MLlib's "
                  "time, every dataset", "met": met_all,
        "line": "spark engine at its defaults vs MLlib LogisticRegression (MLlib's time / "
                "ours to its loss x1.01): " + "; ".join(lines)},
        partial=" ".join(partial) or None)


if __name__ == "__main__":
    main()

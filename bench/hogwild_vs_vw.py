"""HogwildClassifier against Vowpal Wabbit on VW's own ground: sparse logistic
regression on power-law data (bench/hogwild_sweep.py's generator), VW run
as it is used, from a text file with its cache (parsing and cache writing
inside VW's time), 5 passes at its defaults (adaptive, normalised,
invariant updates; --loss_function logistic).

For each dataset (a held-out quarter of the rows is scored by both):
  VW: seconds for 5 passes, examples/s, training and held-out log-loss;
  HogwildClassifier at each SETTINGS entry, one epoch at a time
  (partial_fit on the same schedule), timed without the loss evaluation:
  examples/s, the seconds until its training log-loss first reaches VW's
  x 1.01 (or "never" within --epochs), and the held-out log-loss of that
  model (the one that reached VW's; else the last).
Both models overfit on the held-out rows where rows are few for the
features (--quick); the full size is the one to judge.
Target (issue #36): some documented setting reaches VW's training log-loss
x 1.01 in no more than VW's time and is within 1% of VW's held-out
log-loss, on at least three datasets.

    python bench/hogwild_vs_vw.py [--quick] [--epochs 20] [--repeats 3]
"""
import argparse
import os
import statistics
import tempfile
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import log_loss

from common import report
from hogwild_sweep import make_data
from monsoon.sklearn import HogwildClassifier
from records import row, write_record

# (name, rows, features, nnz per row, zipf exponent, normalised)
DATASETS = [
    ("z1.1-nnz30-f100k-norm", 250_000, 100_000, 30, 1.1, True),
    ("z1.3-nnz40-f100k-norm", 200_000, 100_000, 40, 1.3, True),
    ("z1.0-nnz20-f50k-norm", 250_000, 50_000, 20, 1.0, True),
]
SETTINGS = {
    "defaults": dict(loss="log_loss"),
    "alpha1e-7-avg": dict(loss="log_loss", alpha=1e-7, average=True),
    "adagrad-eta1": dict(loss="log_loss", learning_rate="adagrad", eta0=1.0, alpha=1e-7),
    "adagrad-eta2": dict(loss="log_loss", learning_rate="adagrad", eta0=2.0, alpha=1e-8),
}


def write_vw(path, X, y):
    with open(path, "w") as f:
        for i in range(X.shape[0]):
            lo, hi = X.indptr[i], X.indptr[i + 1]
            feats = " ".join(f"{j}:{v:.6g}" for j, v in zip(X.indices[lo:hi], X.data[lo:hi]))
            f.write(f"{1 if y[i] else -1} | {feats}\n")


def vw_predictions(workdir, model, data):
    from vowpalwabbit import Workspace
    out = os.path.join(workdir, "p.txt")
    Workspace(f"-t -d {data} -i {model} -p {out} --link logistic --quiet").finish()
    return np.clip(np.loadtxt(out, usecols=0), 1e-15, 1 - 1e-15)


def run_vw(workdir, train, test, passes):
    from vowpalwabbit import Workspace
    cache, model = os.path.join(workdir, "c.cache"), os.path.join(workdir, "m.model")
    for stale in (cache, model):
        if os.path.exists(stale):
            os.remove(stale)
    began = time.perf_counter()
    Workspace(f"-d {train} --loss_function logistic --passes {passes} -c -k "
              f"--cache_file {cache} -f {model} --quiet").finish()
    seconds = time.perf_counter() - began
    return seconds, vw_predictions(workdir, model, train), vw_predictions(workdir, model, test)


def run_hogwild(params, X, y, Xt, yt, epochs, target):
    clf = HogwildClassifier(n_jobs=2, random_state=0, tol=None, **params)
    spent, reached, curve = 0.0, None, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for epoch in range(epochs):
            began = time.perf_counter()
            clf.partial_fit(X, y, classes=[0, 1]) if epoch == 0 else clf.partial_fit(X, y)
            spent += time.perf_counter() - began
            loss = log_loss(y, clf.predict_proba(X)[:, 1])
            curve.append((spent, loss))
            if loss <= target:  # the model that reached VW's: judged on the held-out rows
                reached = spent
                break
    held_out = log_loss(yt, clf.predict_proba(Xt)[:, 1])
    return spent, reached, curve, held_out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a fifth of the rows, 1 repeat")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    repeats = 1 if args.quick else args.repeats
    rows_out, records, met_all = [], [], []
    HogwildClassifier(max_iter=1).fit(*make_data(500, 100, 5, 1.0, True))  # compile
    with tempfile.TemporaryDirectory() as workdir:
        for name, rows, features, nnz, exponent, normalise in DATASETS:
            rows = rows // 5 if args.quick else rows
            X_all, y_all = make_data(rows + rows // 4, features, nnz, exponent, normalise)
            X, y, Xt, yt = X_all[:rows], y_all[:rows], X_all[rows:], y_all[rows:]
            train, test = os.path.join(workdir, "train.vw"), os.path.join(workdir, "test.vw")
            write_vw(train, X, y)
            write_vw(test, Xt, yt)
            vw_runs, hw_runs = [], {s: [] for s in SETTINGS}
            for _ in range(repeats):  # interleaved
                seconds, p, pt = run_vw(workdir, train, test, args.passes)
                vw_runs.append((seconds, log_loss(y, p), log_loss(yt, pt)))
                target = 1.01 * vw_runs[-1][1]
                for setting, params in SETTINGS.items():
                    hw_runs[setting].append(run_hogwild(params, X, y, Xt, yt, args.epochs,
                                                        target))
            vw_s = statistics.median(r[0] for r in vw_runs)
            vw_ll = statistics.median(r[1] for r in vw_runs)
            vw_held = statistics.median(r[2] for r in vw_runs)
            rows_out.append((f"{name} VW {args.passes} passes",
                             f"{vw_s:.2f} s ({args.passes * rows / vw_s:.3g} examples/s), "
                             f"log-loss train {vw_ll:.4f} held-out {vw_held:.4f}"))
            for setting, runs in hw_runs.items():
                reached = [r[1] for r in runs]
                t_reach = statistics.median(r if r is not None else float("inf")
                                            for r in reached)
                total = statistics.median(r[0] for r in runs)
                speed = statistics.median(len(r[2]) * rows / r[0] for r in runs)
                final = statistics.median(r[2][-1][1] for r in runs)
                held = statistics.median(r[3] for r in runs)
                met = t_reach <= vw_s and held <= 1.01 * vw_held
                met_all.append((setting, met))
                rows_out.append((f"{name} Hogwild x2 [{setting}]",
                                 f"{speed:.3g} examples/s, reaches VW x1.01 "
                                 f"{'in %.2f s' % t_reach if t_reach < float('inf') else 'never'}"
                                 f" (VW {vw_s:.2f} s), final train {final:.4f}, held-out "
                                 f"{held:.4f} ({100 * (held / vw_held - 1):+.2f}% of VW's)"
                                 f"{'  MET' if met else ''}"))
                records.append(row(
                    f"{name} [{setting}]",
                    [r if r is not None else float("inf") for r in reached],
                    [r[0] for r in vw_runs],
                    (vw_s / t_reach) if t_reach < float("inf") else 0.0,
                    "reach VW's train log-loss x1.01 within VW's time, held-out within 1%",
                    met, unit="s to VW's log-loss (peer: VW's 5 passes)", rows=rows,
                    examples_per_s=speed, seconds=total,
                    held_out=held, vw_held_out=vw_held, vw_train=vw_ll,
                    curve=runs[0][2]))
            for line in rows_out[-1 - len(SETTINGS):]:
                print(*line, flush=True)
    best = {s: sum(m for k, m in met_all if k == s) for s in SETTINGS}
    top = max(best, key=best.get)
    report("HogwildClassifier vs Vowpal Wabbit" + (" (--quick)" if args.quick else ""),
           rows_out)
    write_record("hogwild_vs_vw", vars(args), records, {
        "line": f"HogwildClassifier(n_jobs=2) vs VW: best setting [{top}] meets the target on "
                f"{best[top]}/{len(DATASETS)} datasets (target: 3)",
        "ratio": best[top], "target": ">= 3 datasets", "met": best[top] >= 3})


if __name__ == "__main__":
    main()

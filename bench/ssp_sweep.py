"""SSP's staleness bound in the sim: when does a bound pay?

32, 64 and 128 virtual workers (--workers: staleness grows with them),
lognormal compute times and transient stragglers (a step is
--straggler-factor times slower with probability --straggler-p). For each
problem, worker count and learning rate: sync, ssp with S in --bounds, and
async, on the same examples budget and seed. sync runs the same per-worker
batch as the others (its batch is workers x batch) at workers x lr (the
linear scaling rule), so one sync step moves about as far as one clock of
every worker; ssp S = 0 is bulk-synchronous in the SSP sense. A problem
with too few examples for a worker count (digits at 128: sync's batch
would exceed its data) is skipped, and the record names it.

Per setting: simulated time to a target loss (--target-factor x BSP's final
loss, read off the loss curve; the synchronous reference is BSP, ssp S = 0,
the issue's "s = 0 is bulk-synchronous": the sync strategy's few large steps
are reported beside it, but on this budget they do not train as far), final
loss, staleness in updates and in clocks, and the time the workers waited
for the bound. Acceptance: see ``summarize``; a missed target's record says
why. Writes a record (bench/records.py) and
bench/results/ssp_sweep/ssp_sweep.png.

    python bench/ssp_sweep.py            # about a minute (sim: virtual time)
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import monsoon  # noqa: E402
from monsoon.errors import ConfigError  # noqa: E402
from records import RESULTS, write_record  # noqa: E402

PROBLEMS = {  # name: (per-worker batch, epochs, learning rates: a usual one, a high one)
    "digits": (16, 6, (0.02, 0.05)),
    "logistic": (16, 1, (0.1, 1.0)),
    "linear": (16, 1, (0.01, 0.05)),  # least squares: 0.05 is the catalog's rate
}


def time_to(rows, target):
    for r in rows:
        if r["loss"] == r["loss"] and r["loss"] <= target:
            return r["time_s"]
    return None


def run_one(problem, setting, lr, batch, epochs, workers, args):
    delays = dict(sim_compute_s=1e-3, sim_compute_sigma=args.compute_sigma,
                  sim_straggler_p=args.straggler_p, sim_straggler_factor=args.straggler_factor)
    if setting == "sync":
        run = monsoon.train(problem, "sync", workers, engine="sim", lr=lr * workers,
                            batch_size=batch * workers, epochs=epochs, seed=args.seed,
                            evals=args.evals, progress=False, raise_on_divergence=False,
                            **delays)
    elif setting == "async":
        run = monsoon.train(problem, "async", workers, engine="sim", lr=lr, batch_size=batch,
                            epochs=epochs, seed=args.seed, evals=args.evals, progress=False,
                            raise_on_divergence=False, **delays)
    else:
        run = monsoon.train(problem, "ssp", workers, engine="sim", lr=lr, batch_size=batch,
                            epochs=epochs, seed=args.seed, evals=args.evals, progress=False,
                            raise_on_divergence=False, staleness_bound=int(setting[1:]),
                            **delays)
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--workers", default="32,64,128",
                    help="virtual worker counts, comma-separated (staleness grows with them)")
    ap.add_argument("--bounds", default="0,1,2,4,8,16")
    ap.add_argument("--compute-sigma", type=float, default=0.5)
    ap.add_argument("--straggler-p", type=float, default=0.05)
    ap.add_argument("--straggler-factor", type=float, default=10.0)
    ap.add_argument("--target-factor", type=float, default=1.1)
    ap.add_argument("--evals", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lrs", default=None,
                    help="learning rates for every problem given (default: each one's pair)")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # virtual time: the host's threads only slow the gradients
    settings = ["sync"] + [f"S{b}" for b in args.bounds.split(",")] + ["async"]
    rows, curves, skipped = [], {}, []
    for problem in args.problems.split(","):
        batch, epochs, lrs = PROBLEMS[problem]
        if args.lrs:
            lrs = tuple(float(v) for v in args.lrs.split(","))
        for workers in (int(w) for w in args.workers.split(",")):
            for lr in lrs:
                try:
                    runs = {s: run_one(problem, s, lr, batch, epochs, workers, args)
                            for s in settings}
                except ConfigError as e:  # e.g. too few examples for that many workers
                    print(f"{problem} with {workers} workers skipped: {e}", flush=True)
                    skipped.append(f"{problem} w{workers}: {e}")
                    break
                for s, run in runs.items():
                    curves[(problem, workers, lr, s)] = [(r["time_s"], r["loss"])
                                                         for r in run.history]
                rows += setting_rows(problem, workers, lr, runs, args.target_factor)
    if not rows:
        sys.exit("ssp_sweep: nothing ran: " + "; ".join(skipped))
    summary = summarize(rows)
    summary["skipped"] = skipped
    print(summary["line"])
    if not summary["met"]:
        print(f"not met: {summary['why']}")
    if not args.no_record:
        out = RESULTS / "ssp_sweep"
        out.mkdir(parents=True, exist_ok=True)
        plot(out / "ssp_sweep.png", rows, curves, settings)
        path = write_record("ssp_sweep", vars(args), rows, summary)
        print(f"wrote {path} and {out / 'ssp_sweep.png'}")


def setting_rows(problem, workers, lr, runs, target_factor):
    """One row per setting of one (problem, workers, lr): its time to the
    target loss and final loss against BSP's (ssp S = 0; the sync strategy's
    row is reported beside it: one step per workers x batch examples)."""
    ref = runs["S0"] if "S0" in runs else runs["sync"]
    sync = ref.summary["final_loss"]
    target = target_factor * sync
    ref_t = time_to(ref.history, target)
    rows = []
    for s, run in runs.items():
        sm = run.summary
        t = time_to(run.history, target)
        speedup = ref_t / t if t and ref_t else None
        clocks = sm.get("clock_staleness") or {}
        waits = sm.get("clock_wait_s") or []
        rows.append({
            "name": f"{problem}-w{workers}-lr{lr}-{s}", "problem": problem,
            "workers": workers, "lr": lr, "setting": s, "bound": sm.get("staleness_bound"),
            "final_loss": sm["final_loss"], "target_loss": target,
            "time_to_target_s": t, "sim_time_s": sm["wall_time_s"],
            "speedup_to_target_vs_sync": speedup,
            # the rendered table's columns: time to target, BSP's, BSP's / ours
            "ours": t, "peer": ref_t, "ratio": speedup,
            "final_loss_vs_sync": sm["final_loss"] / sync if sync else None,
            "staleness": sm["staleness"], "clock_staleness": clocks or None,
            "staleness_counts": sm["staleness_counts"],
            "clock_staleness_counts": sm.get("clock_staleness_counts"),
            "wait_s_mean": sum(waits) / len(waits) if waits else None,
            "updates": sm["updates"], "unit": "simulated s"})
        print(f"{problem:9s} w {workers:<4d} lr {lr:<5g} {s:6s} final {sm['final_loss']:.4g} "
              f"({rows[-1]['final_loss_vs_sync']:.3f}x sync) to target "
              f"{t if t is None else round(t, 4)} s "
              f"stale mean {sm['staleness']['mean']:.3g} max {sm['staleness']['max']} "
              f"clocks max {clocks.get('max')} wait {rows[-1]['wait_s_mean']}", flush=True)
    return rows


def _key(r):
    return r["problem"], r.get("workers", 32), r["lr"]


def _where(key):
    return f"{key[0]} {key[1]} workers lr {key[2]:g}"


def summarize(rows):
    """Acceptance: some S > 0 reaches the target >= 1.3x sooner than BSP with a
    final loss within 1% of BSP's; where async is >= 5% worse than BSP, some S
    stays within 1% of it (untested, and so not met, if no setting makes it so).
    A missed target says why, from the figures measured."""
    speed_ok, rescue, lines, hurt = [], [], [], []
    for key in sorted({_key(r) for r in rows}):
        group = [r for r in rows if _key(r) == key]
        ssp = [r for r in group if r["setting"].startswith("S") and r["bound"]]
        good = [r for r in ssp if (r["speedup_to_target_vs_sync"] or 0) >= 1.3
                and r["final_loss_vs_sync"] <= 1.01]
        best = max(ssp, key=lambda r: r["speedup_to_target_vs_sync"] or 0)
        speed_ok.append(bool(good))
        asy = next(r for r in group if r["setting"] == "async")
        if asy["final_loss_vs_sync"] >= 1.05:
            closest = min(ssp, key=lambda r: r["final_loss_vs_sync"])
            rescue.append(closest["final_loss_vs_sync"] <= 1.01)
            hurt.append((key, asy, closest))
        lines.append(f"{_where(key)}: best {best['setting']} "
                     f"{best['speedup_to_target_vs_sync'] or 0:.2f}x sooner than sync "
                     f"(loss {best['final_loss_vs_sync']:.3f}x), async loss "
                     f"{asy['final_loss_vs_sync']:.3f}x BSP")
    lines += [f"where async ended >= 5% worse ({_where(key)}: {asy['final_loss_vs_sync']:.3f}x), "
              f"{closest['setting']} ended {closest['final_loss_vs_sync']:.3f}x BSP"
              for key, asy, closest in hurt]
    met = any(speed_ok) and bool(rescue) and all(rescue)
    if not rescue:
        lines.append("no setting here made async >= 5% worse than BSP: the second "
                     "criterion is untested")
    ratios = [r["speedup_to_target_vs_sync"] for r in rows if r["bound"]
              and r["speedup_to_target_vs_sync"] and r["final_loss_vs_sync"] <= 1.01]
    summary = {"met": met, "ratio": max(ratios) if ratios else None,
               "target": "some S>0 >= 1.3x sooner than sync within 1% loss; "
               "where async >= 5% worse, some S within 1%",
               "speed_ok": speed_ok, "rescue_ok": rescue,
               "line": "ssp sweep: " + "; ".join(lines)}
    if not met:
        summary["why"] = why_missed(speed_ok, hurt)
    return summary


def why_missed(speed_ok, hurt):
    """One sentence: which criterion the figures missed, and by how much."""
    if not any(speed_ok):
        return "No S > 0 reached BSP's target loss 1.3x sooner within 1% of its final loss."
    if not hurt:
        return ("Some S > 0 reached the target loss 1.3x sooner than BSP, but no problem, "
                "worker count or rate tried made async 5% worse than BSP, so the second "
                "criterion is untested and counts as not met.")
    missed = [f"{_where(key)} (async {asy['final_loss_vs_sync']:.3f}x BSP's loss, the closest "
              f"S > 0, {closest['setting']}, {closest['final_loss_vs_sync']:.3f}x)"
              for key, asy, closest in hurt if closest["final_loss_vs_sync"] > 1.01]
    return ("Where async ended 5% or more worse than BSP, no S > 0 came within 1% of BSP on "
            + "; ".join(missed) + ".")


def plot(path, rows, curves, settings):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({_key(r) for r in rows})
    # one row of three panels per setting: the figure grows down, not across
    fig, axes = plt.subplots(len(keys), 3, figsize=(12, 3.2 * len(keys)), squeeze=False)
    for j, key in enumerate(keys):
        group = {r["setting"]: r for r in rows if _key(r) == key}
        ax = axes[j, 0]
        for i, s in enumerate(settings):
            pts = curves[(*key, s)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=s, color=f"C{i}")
        ax.axhline(group["sync"]["target_loss"], color="k", linestyle=":", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(f"{key[0]}, {key[1]} workers, lr {key[2]:g}", fontsize=9)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("loss (dotted: target)")
        ax.legend(fontsize=7)
        ax = axes[j, 1]
        x = range(len(settings))
        t = [group[s]["time_to_target_s"] or math.nan for s in settings]
        ax.bar(x, t, color=[f"C{i}" for i in x])
        ax2 = ax.twinx()
        ax2.plot(x, [group[s]["final_loss_vs_sync"] for s in settings], "k.-")
        ax2.set_ylabel("final loss / sync's")
        ax.set_xticks(list(x), settings, rotation=45, fontsize=7)
        ax.set_ylabel("time to target (simulated s)")
        ax = axes[j, 2]
        for i, s in enumerate(settings):
            counts = group[s]["clock_staleness_counts"]
            if counts:
                taus = sorted(int(k) for k in counts)
                total = sum(counts.values())
                ax.plot(taus, [counts[k] / total for k in taus], drawstyle="steps-mid",
                        color=f"C{i}", label=s)
        ax.set_yscale("log")
        ax.set_xlabel("staleness in clocks")
        ax.set_ylabel("share of gradients")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=72)


if __name__ == "__main__":
    main()

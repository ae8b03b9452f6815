"""The comparison of several runs: comparison.csv, comparison.png, report.md."""
from __future__ import annotations

import csv
import io
from pathlib import Path

from .run_folder import atomic_write

CSV_COLUMNS = ("strategy", "workers", "final_loss", "wall_time_s", "startup_s", "examples",
               "examples_per_s", "speedup_vs_serial", "updates", "staleness_mean",
               "staleness_max", "dropped_updates", "failed_workers", "time_to_target_s")


def comparison_rows(summaries: list[dict]) -> list[dict]:
    base = next((s for s in summaries if s["strategy"] == "serial"), None)
    rows = []
    for s in summaries:
        speed = None
        if base and base.get("examples_per_s") and s.get("examples_per_s"):
            speed = s["examples_per_s"] / base["examples_per_s"]
        rows.append({"strategy": s["strategy"], "workers": s["workers"],
                     "final_loss": s["final_loss"], "wall_time_s": s["wall_time_s"],
                     "startup_s": s["startup_s"], "examples": s["examples"],
                     "examples_per_s": s["examples_per_s"], "speedup_vs_serial": speed,
                     "updates": s["updates"], "staleness_mean": s["staleness"]["mean"],
                     "staleness_max": s["staleness"]["max"],
                     "dropped_updates": s["dropped_updates"],
                     "failed_workers": len(s["failed_workers"]),
                     "time_to_target_s": s["time_to_target_s"]})
    return rows


def _fmt(value, digits=4):
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def report_markdown(problem: str, rows: list[dict], target) -> str:
    lines = [f"# monsoon compare: {problem}", ""]
    lines += ["| strategy | workers | final loss | wall time (s) | examples/s | speedup vs serial "
              "| time to target (s) | staleness (mean / max) | dropped |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['strategy']} | {r['workers']} | {_fmt(r['final_loss'])} "
                     f"| {_fmt(r['wall_time_s'], 3)} | {_fmt(r['examples_per_s'], 4)} "
                     f"| {_fmt(r['speedup_vs_serial'], 3)} | {_fmt(r['time_to_target_s'], 3)} "
                     f"| {_fmt(r['staleness_mean'], 3)} / {_fmt(r['staleness_max'])} "
                     f"| {r['dropped_updates']} |")
    lines.append("")
    finite = [r for r in rows if r["final_loss"] is not None and r["final_loss"] == r["final_loss"]]
    if finite:
        best = min(finite, key=lambda r: r["final_loss"])
        fastest = max(finite, key=lambda r: r["examples_per_s"] or 0)
        lines.append(f"- Lowest final loss: **{best['strategy']}** ({_fmt(best['final_loss'])}).")
        lines.append(f"- Highest throughput: **{fastest['strategy']}** "
                     f"({_fmt(fastest['examples_per_s'], 4)} examples/s).")
        reached = [r for r in finite if r["time_to_target_s"] is not None]
        if target is not None:
            if reached:
                first = min(reached, key=lambda r: r["time_to_target_s"])
                lines.append(f"- First to reach the target loss {target}: **{first['strategy']}** "
                             f"in {_fmt(first['time_to_target_s'], 3)} s.")
            else:
                lines.append(f"- No strategy reached the target loss {target}.")
    lines += explain(rows)
    lines += ["", "Every strategy processed the same budget of examples; the final loss is the "
              "full-training-set objective, computed the same way for all. Staleness counts the "
              "updates applied between a worker's read of the parameters and its update.",
              "", "![loss curves](comparison.png)", ""]
    return "\n".join(lines)


def explain(rows: list[dict]) -> list[str]:
    """Why the winners won: plain-language readings of the numbers."""
    out = []
    base = next((r for r in rows if r["strategy"] == "serial"), None)
    if base is None or not base["updates"]:
        return out
    step_us = 1e6 * base["wall_time_s"] / base["updates"]
    slower = [r["strategy"] for r in rows
              if r["strategy"] != "serial" and (r["speedup_vs_serial"] or 0) < 1.0]
    if slower:
        out.append(f"- {', '.join(slower)} ran slower than serial. One serial update costs "
                   f"{step_us:.0f} us here, too little work to share: coordinating workers "
                   "(barriers, locks, contention for memory and cores) costs about as much as "
                   "it saves. Parallel strategies pay off when an update costs milliseconds "
                   "(a larger model or batch) or when gradients are sparse (Hogwild!).")
    for r in rows:
        if r["strategy"] in ("async", "hogwild") and r["staleness_mean"]:
            loss_ratio = (r["final_loss"] / base["final_loss"]
                          if base["final_loss"] else None)
            verdict = ("hurt" if loss_ratio and loss_ratio > 1.1 else "did not hurt")
            out.append(f"- {r['strategy']}: updates were computed on parameters "
                       f"{r['staleness_mean']:.2g} updates old on average (max "
                       f"{r['staleness_max']}); at this learning rate that {verdict} "
                       f"(final loss {_fmt(loss_ratio, 3)}x serial's).")
        if r["strategy"] == "sync" and base["final_loss"] is not None:
            out.append("- sync computes the same gradient per step as serial (each batch "
                       "split among its workers), so its curve against epochs overlays "
                       "serial's: it differs from serial only in speed.")
    return out


def write_comparison(out: Path, problem: str, summaries: list[dict], histories: dict,
                     target=None) -> list[dict]:
    rows = comparison_rows(summaries)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if r[k] is None else r[k] for k in CSV_COLUMNS})
    atomic_write(Path(out) / "comparison.csv", buf.getvalue())
    from .plots import plot_loss  # matplotlib loads only when a plot is drawn
    plot_loss(Path(out) / "comparison.png", histories, title=f"{problem}: loss by strategy")
    atomic_write(Path(out) / "report.md", report_markdown(problem, rows, target))
    return rows

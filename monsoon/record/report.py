"""The comparison of several runs: comparison.csv, comparison.png, report.md.

Each strategy comes as the summaries of its turns (``compare``'s repeats,
first turn first). Its speed is the median of its turns' examples/s, and
its speedup the median of each turn's ratio to serial's run of that turn;
both with their ranges, over the turns that ran to their end: an
interrupted or failed turn (``UNFINISHED``) counts in neither, and the
report names it. Every other column is the first turn's, whose curves are
plotted; a failed first turn's row says so, with its reason."""
from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path

from .run_folder import atomic_write

CSV_COLUMNS = ("strategy", "workers", "final_loss", "wall_time_s", "startup_s", "examples",
               "examples_per_s", "speedup_vs_serial", "updates", "staleness_mean",
               "staleness_max", "dropped_updates", "failed_workers", "time_to_target_s",
               "repeats", "examples_per_s_min", "examples_per_s_max", "speedup_min",
               "speedup_max", "staleness_p50", "staleness_p99", "staleness_bound",
               "clock_staleness_mean", "clock_staleness_p50", "clock_staleness_p99",
               "clock_staleness_max", "clock_wait_s_total", "clock_wait_s_max",
               "compress", "bytes_sent", "compression_ratio", "residual_norm", "rule",
               "status")

UNFINISHED = ("interrupted", "failed")  # stopped from outside, or broken: no speed to count


SHORT_RUN_S = 10.0  # below this, one run's speed says little on a busy machine
SHORT_RUN_NOISE = 0.2  # how far one short run's speed can stray (the report's 20-30%)


def _spread(values: list) -> tuple:
    """(median, min, max) of the values that are there; Nones if none is."""
    values = [v for v in values if v]
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def comparison_rows(runs: list[list[dict]]) -> list[dict]:
    """One row per strategy from the summaries of its turns (see the module doc)."""
    base = next((turns for turns in runs if turns[0]["strategy"] == "serial"), None)
    rows = []
    for turns in runs:
        s = turns[0]
        done = [_counts(t) for t in turns]
        speed = _spread([t.get("examples_per_s") for t, ok in zip(turns, done) if ok])
        ratios = [t["examples_per_s"] / b["examples_per_s"]
                  for t, b, ok in zip(turns, base or [], done)
                  if ok and _counts(b) and t["examples_per_s"] and b["examples_per_s"]]
        speedup = _spread(ratios)
        stale = s.get("staleness") or {}  # a failed run's summary has no counts
        rows.append({"strategy": s["strategy"], "workers": s["workers"], "rule": s.get("rule"),
                     "final_loss": s["final_loss"], "wall_time_s": s.get("wall_time_s"),
                     "startup_s": s.get("startup_s"), "examples": s.get("examples"),
                     "examples_per_s": speed[0], "speedup_vs_serial": speedup[0],
                     "updates": s["updates"], "staleness_mean": stale.get("mean"),
                     "staleness_max": stale.get("max"),
                     "dropped_updates": s.get("dropped_updates"),
                     "failed_workers": len(s.get("failed_workers") or []),
                     "time_to_target_s": s.get("time_to_target_s"), "repeats": len(turns),
                     "unfinished_turns": [(k + 1, t.get("status"))
                                          for k, (t, ok) in enumerate(zip(turns, done)) if not ok],
                     "examples_per_s_min": speed[1], "examples_per_s_max": speed[2],
                     "speedup_min": speedup[1], "speedup_max": speedup[2],
                     "simulated": "simulated_time_s" in s,  # the sim engine's clock
                     **_staleness_columns(s),
                     **{k: s.get(k) for k in ("compress", "bytes_sent", "compression_ratio",
                                              "residual_norm", "warning", "stopped",
                                              "stopped_at_target", "stopped_converged",
                                              "batch_size", "per_example_loop", "status",
                                              "late_gradients", "backup_workers",
                                              "error", "spark_jobs", "buffers",
                                              "random_draws", "delays")}})
    return rows


def _counts(turn: dict) -> bool:
    """Whether a turn's speed counts: it ran to its end (not ``UNFINISHED``)."""
    return turn.get("status") not in UNFINISHED


def _staleness_columns(s: dict) -> dict:
    """The staleness distribution in updates and, for SSP, in clocks, with the
    bound and the time the workers waited for it."""
    stale, clocks = s.get("staleness") or {}, s.get("clock_staleness") or {}
    waits = s.get("clock_wait_s") or []
    return {"staleness_p50": stale.get("p50"), "staleness_p99": stale.get("p99"),
            "staleness_bound": s.get("staleness_bound"),
            **{f"clock_staleness_{k}": clocks.get(k) for k in ("mean", "p50", "p99", "max")},
            "clock_wait_s_total": sum(waits) if waits else None,
            "clock_wait_s_max": max(waits) if waits else None,
            "staleness_counts": s.get("staleness_counts") or {},
            "clock_staleness_counts": s.get("clock_staleness_counts") or {}}


def has_staleness(rows: list[dict]) -> bool:
    """Whether any run had stale updates or a clock (then the report shows histograms)."""
    return any(any(int(t) > 0 for t in r["staleness_counts"]) or r["clock_staleness_counts"]
               for r in rows)


def staleness_markdown(rows: list[dict]) -> list[str]:
    """The report's staleness section: the distributions and the histogram figure."""
    lines = ["## Staleness", "",
             "| strategy | bound (clocks) | in updates: mean / p50 / p99 / max "
             "| in clocks: mean / p50 / p99 / max | waited for the bound (s): all / slowest |",
             "|---|---|---|---|---|"]
    for r in rows:
        upd = " / ".join(_fmt(r[k], 3) for k in ("staleness_mean", "staleness_p50",
                                                 "staleness_p99", "staleness_max"))
        clk = " / ".join(_fmt(r[f"clock_staleness_{k}"], 3)
                         for k in ("mean", "p50", "p99", "max"))
        wait = (f"{_fmt(r['clock_wait_s_total'], 3)} / {_fmt(r['clock_wait_s_max'], 3)}"
                if r["clock_wait_s_total"] is not None else "—")
        lines.append(f"| {r['strategy']} | {_fmt(r['staleness_bound'])} | {upd} | {clk} "
                     f"| {wait} |")
    lines += ["", "Staleness in updates: updates applied to a shard between a worker's read "
              "and its push. In clocks (ssp): a gradient's clock minus the clocks every live "
              "worker had finished when its parameters were read; the bound caps it.", "",
              "![staleness histograms](staleness.png)", ""]
    return lines


def _fmt(value, digits=4):
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _with_range(row: dict, key: str, low: str, high: str, digits: int) -> str:
    """``row[key]``, and its range when the row has several turns."""
    text = _fmt(row[key], digits)
    if row["repeats"] > 1 and row[low] is not None and row[low] != row[high]:
        text += f" ({_fmt(row[low], digits)}–{_fmt(row[high], digits)})"
    return text


def report_markdown(problem: str, rows: list[dict], target) -> str:
    lines = [f"# monsoon compare: {problem}", ""]
    lines += ["| strategy | workers | final loss | wall time (s) | examples/s | speedup vs serial "
              "| time to target (s) | staleness (mean / max) | dropped |",
              "|---|---|---|---|---|---|---|---|---|"]
    # per-strategy defaults (spark: lbfgs); a run that failed early names none
    mixed = len({r.get("rule") for r in rows if r.get("rule")}) > 1
    for r in rows:
        speed = _with_range(r, "examples_per_s", "examples_per_s_min", "examples_per_s_max", 4)
        speedup = _with_range(r, "speedup_vs_serial", "speedup_min", "speedup_max", 3)
        name = f"{r['strategy']} ({r['rule']})" if mixed and r.get("rule") else r["strategy"]
        lines.append(f"| {name} | {r['workers']} | {_fmt(r['final_loss'])} "
                     f"| {_fmt(r['wall_time_s'], 3)} | {speed} | {speedup} "
                     f"| {_fmt(r['time_to_target_s'], 3)} "
                     f"| {_fmt(r['staleness_mean'], 3)} / {_fmt(r['staleness_max'])} "
                     f"| {_fmt(r['dropped_updates'])} |")
    lines.append("")
    # a run that stopped (diverged, interrupted, failed) or ended with a
    # non-finite loss wins nothing: its loss and speed are not a finished run's
    finite = [r for r in rows if _finished(r)]
    if finite:
        best = min(finite, key=lambda r: r["final_loss"])
        fastest = max(finite, key=lambda r: r["examples_per_s"] or 0)
        lines.append(_lowest_loss(finite, best))
        median = f"median over {fastest['repeats']} turns: " if fastest["repeats"] > 1 else ""
        lines.append(f"- Highest throughput: **{fastest['strategy']}** "
                     f"({median}{_fmt(fastest['examples_per_s'], 4)} examples/s).")
        reached = [r for r in finite if r["time_to_target_s"] is not None]
        if target is not None:
            if reached:
                first = min(reached, key=lambda r: r["time_to_target_s"])
                lines.append(f"- First to reach the target loss {target}: **{first['strategy']}** "
                             f"in {_fmt(first['time_to_target_s'], 3)} s.")
            else:
                lines.append(f"- No strategy reached the target loss {target}.")
    else:
        lines.append("- **No strategy ran to the end of its budget with a finite loss**: "
                     "none is the lowest or the fastest.")
    for r in rows:  # a run that stopped or ended worse than it began says so
        if r.get("status") == "interrupted":
            lines.append(f"- **{r['strategy']} was interrupted before its budget, after "
                         f"{r['updates']} updates** ({r.get('stopped') or 'interrupted'}).")
        elif r.get("status") == "failed":
            lines.append(f"- **{r['strategy']} failed, after {r['updates']} updates**: "
                         f"{r.get('error')}.")
        elif r.get("stopped"):
            lines.append(f"- **{r['strategy']} stopped before its budget: {r['stopped']}**")
        elif r.get("warning"):
            lines.append(f"- **{r['strategy']}: {r['warning']}**")
        elif r.get("stopped_at_target") or r.get("stopped_converged"):
            lines.append(f"- {r['strategy']} stopped before its budget: "
                         f"{r.get('stopped_at_target') or r['stopped_converged']}.")
        if r["repeats"] > 1 and r["unfinished_turns"]:
            which = ", ".join(f"turn {k} {status}" for k, status in r["unfinished_turns"])
            counted = r["repeats"] - len(r["unfinished_turns"])
            lines.append(f"- **{r['strategy']}: {which} (of {r['repeats']})**: "
                         + (f"its speeds are of the other {counted}." if counted else
                            "no turn ran to its end, so it has no speed."))
    sent = [r for r in rows if r.get("bytes_sent")]
    if any(r.get("compress") not in (None, "none") for r in sent):
        lines.append("- Bytes the workers sent (docs/compression.md): " + "; ".join(
            f"{r['strategy']} {r['bytes_sent']:,} uncompressed" if r["compress"] == "none" else
            f"{r['strategy']} ({r['compress']}) {r['bytes_sent']:,}, "
            f"{_fmt(r['compression_ratio'], 3)}x fewer than dense" for r in sent) + ".")
    lines += explain(rows)
    early = any(r.get("stopped_at_target") or r.get("stopped_converged") or r.get("stopped")
                or r.get("status") in UNFINISHED for r in rows)
    same = len({r["examples"] for r in rows}) == 1
    lines += ["", ("Every strategy processed the same budget of examples" if same and not early
                   else "Every strategy had the same budget of examples (a run that stopped "
                   "before it says so above)" if same or early else
                   "Every strategy had the same budget; the examples each processed differ "
                   "(the examples column of comparison.csv)") + "; the final loss is the "
              "full-training-set objective, computed the same way for all. Staleness counts the "
              "updates applied between a worker's read of the parameters and its update.",
              "", "![loss curves](comparison.png)", ""]
    return "\n".join(lines)


def _lowest_loss(finite: list[dict], best: dict) -> str:
    """The lowest final loss, and every strategy whose loss equals it to the
    digits the table shows: a difference the table hides crowns no winner."""
    shown = _fmt(best["final_loss"])
    tied = [r["strategy"] for r in finite if _fmt(r["final_loss"]) == shown]
    if len(tied) == 1:
        return f"- Lowest final loss: **{best['strategy']}** ({shown})."
    return (f"- Lowest final loss: a tie to the digits shown, "
            f"{', '.join(f'**{name}**' for name in tied)} ({shown}; comparison.csv has "
            "every digit).")


def explain(rows: list[dict]) -> list[str]:
    """Why the winners won: plain-language readings of the numbers. Those
    against serial need a serial run that measured its time; the others
    (medians, short runs, staleness) are read without one."""
    out = []
    base = next((r for r in rows if r["strategy"] == "serial"), None)
    if base is not None and (not base["updates"] or base["wall_time_s"] is None):
        base = None  # a serial run that measured no time (it failed): nothing to read against
    turns = max((r["repeats"] for r in rows), default=1)
    others = [r for r in rows if r["strategy"] != "serial" and r["speedup_vs_serial"]]
    if turns > 1:  # a range that holds 1.0 is a tie
        slower = [r["strategy"] for r in others if r["speedup_max"] < 1.0]
        ties = [r["strategy"] for r in others if r["speedup_min"] <= 1.0 <= r["speedup_max"]]
        out.append(f"- Speeds are medians over {turns} turns of every strategy, run in "
                   "rotation (their ranges in brackets); the other columns and the curves "
                   "are the first turn's."
                   + (" Each speedup is the median of its turns' ratios to serial's run of "
                      "the same turn, so it can differ from the ratio of the median speeds."
                      if others else ""))
    else:
        slower = [r["strategy"] for r in others if r["speedup_vs_serial"] < 1.0]
        ties = []
        timed = [r for r in rows if r["wall_time_s"] is not None]
        ref = base or max(timed, key=lambda r: r["wall_time_s"], default=None)
        if ref is not None and not ref["simulated"] and ref["wall_time_s"] < SHORT_RUN_S:
            out.append("- Speeds come from one short run of each strategy: on a busy machine, "
                       "runs of a second or two can differ by 20-30% from one to the next. "
                       "`--repeats 3` runs each three times in rotation and reports medians "
                       "and ranges.")
            # a speed within that noise of serial's is no slowdown to explain
            ties = [r["strategy"] for r in others
                    if 1 - SHORT_RUN_NOISE <= r["speedup_vs_serial"] <= 1 / (1 - SHORT_RUN_NOISE)]
            slower = [s for s in slower if s not in ties]
    if ties and turns > 1:
        out.append(f"- {', '.join(ties)}: as fast as serial within the range of {turns} turns "
                   "(a tie on this machine).")
    elif ties:
        out.append(f"- {', '.join(ties)}: within {SHORT_RUN_NOISE:.0%} of serial's speed, less "
                   "than one short run varies by: neither faster nor slower than serial by "
                   "this run.")
    read = slower and base is not None and _finished(base)  # a stopped serial: nothing to read
    step_s = base["wall_time_s"] / base["updates"] if read else None
    if read and base["simulated"]:  # the delay model's time
        workers = max(r["workers"] for r in others if r["strategy"] in slower)
        out.append(_simulated_slower(slower, base, step_s, workers))
    elif read:
        what = (" (one example: sparse serial's per-example loop)"
                if base.get("per_example_loop") else "")
        out.append(f"- {', '.join(slower)} ran slower than serial. One serial update{what} "
                   f"costs {_duration(step_s)} here, too little "
                   "work to share: coordinating workers "
                   "(barriers, locks, contention for memory and cores) costs more than it "
                   "saves. Parallel strategies pay off when an update costs many times "
                   "that (a larger model or batch) or when gradients are sparse (Hogwild!).")
    out += _spark_jobs(others, base) if base is not None else []
    for r in rows:
        if r["staleness_mean"]:  # any strategy whose updates came stale, by its figures
            out.append(f"- {r['strategy']}: updates were computed on parameters "
                       f"{r['staleness_mean']:.2g} updates old on average (max "
                       f"{r['staleness_max']})"
                       f"{_staleness_verdict(r, base) if base is not None else ''}.")
        if r["strategy"] == "sync" and base is not None and base["final_loss"] is not None \
                and r.get("compress") in (None, "none") \
                and _same_steps(r, base):  # compressed, or other steps: its gradients differ
            out.append(_sync_against_serial(r, base))
    return out


def _simulated_slower(slower: list[str], base: dict, step_s: float, workers: int) -> str:
    """Why strategies ran slower than serial on the sim engine: by the delay
    model its summary records (``delays``), not by this machine's costs."""
    d = base.get("delays") or {}
    batch = f"of {base['batch_size']} examples" if base.get("batch_size") else ""
    terms = []
    if d.get("compute_s") is not None:
        terms.append(f"a gradient over a whole batch{' ' + batch if batch else ''} takes "
                     f"{_duration(d['compute_s'])} (--compute-s), a worker's slice of it its "
                     "share" + (f", spread lognormally (--compute-sigma {d['compute_sigma']:g})"
                                if d.get("compute_sigma") else ""))
    factor = d.get("straggler_factor", 10.0)
    if d.get("straggler_p"):
        p = d["straggler_p"]
        terms.append(f"{p:g} of steps are {factor:g}x slower (--straggler-p): an update that "
                     f"waits for all of {workers} workers waits for one in "
                     f"{1 - (1 - p) ** workers:.0%} of steps")
    if d.get("slow_fraction"):
        terms.append(f"{d['slow_fraction']:g} of the workers are always {factor:g}x slower "
                     "(--slow-fraction), and an update that waits for every worker waits "
                     "for them")
    message = ([f"{_duration(d['latency_s'])} (--latency-s)"] if d.get("latency_s") else []) \
        + ([f"its bytes at {d['bandwidth_Bps']:g} B/s (--bandwidth)"]
           if d.get("bandwidth_Bps") else [])
    if message:
        terms.append(f"every message takes {' plus '.join(message)}, and a parallel update "
                     "needs one each way")
    if d.get("service_s"):
        terms.append(f"a server shard spends {_duration(d['service_s'])} on each request "
                     "(--service-s), and requests queue")
    model = f"In that model {'; '.join(terms)}. " if terms else ""
    return (f"- {', '.join(slower)} ran slower than serial in this simulation, whose time "
            f"comes from its delay model (summary.json's `delays`), not from this machine: "
            f"one serial update costs {_duration(step_s)} of simulated time here. {model}A "
            "parallel update shares the compute among its workers but pays the other delays, "
            "and here they cost more than the sharing saves; it pays off when the compute per "
            "update is large against them (a larger --compute-s or batch, a shorter "
            "--latency-s, fewer stragglers).")


def _sync_against_serial(r: dict, base: dict) -> str:
    """What sync's steps are against serial's, which took the same batches:
    the same gradients only where its model computes them alike split among
    workers (no buffers, no random draws: the summary's ``buffers`` and
    ``random_draws``, the problem's own declarations); else why they may
    differ, and whether the final losses agree to the digits the table
    shows (agreeing losses do not make a Dropout model's gradients alike)."""
    loss, serial = r["final_loss"], base["final_loss"]
    if not (r.get("buffers") or r.get("random_draws")):
        return ("- sync computes the same gradient per step as serial (each batch split "
                "among its workers), so its curve against epochs overlays serial's: it "
                "differs from serial only in speed.")
    why = []
    if r.get("buffers"):
        why.append(f"a layer with buffers (the model has {r['buffers']}) such as BatchNorm "
                   "normalises each worker's share of a batch by that share's statistics, "
                   "serial the whole batch by its own")
    if r.get("random_draws"):
        why.append("random layers (Dropout), where the model has any, draw each worker's "
                   "own masks")
    if _fmt(loss) == _fmt(serial):
        return (f"- sync splits each of serial's batches among its workers, and its final "
                f"loss agrees with serial's to the digits shown ({_fmt(loss)}), but its "
                f"gradients need not be serial's: {'; '.join(why)}. So its curve need not "
                "overlay serial's step for step.")
    return (f"- sync splits each of serial's batches among its workers, yet its final loss "
            f"({_fmt(loss)}) is not serial's ({_fmt(serial)}): {'; '.join(why)}. So its "
            "gradients are not serial's, and its curve does not overlay serial's.")


def _spark_jobs(others: list[dict], base: dict) -> list[str]:
    """Where strategies outran serial by more than their workers can on
    Spark because serial ran many more Spark jobs (one a step, from the
    driver) than they did: the ratio is then Spark's cost per job."""
    if not base.get("spark_jobs"):
        return []
    fast = [r for r in others if r.get("spark_jobs") and base["spark_jobs"] > r["spark_jobs"]
            and r["speedup_vs_serial"] > 1.5 * r["workers"]]
    if not fast:
        return []
    names = ", ".join(f"{r['strategy']} ({_fmt(r['speedup_vs_serial'], 3)}x, {r['workers']} "
                      "workers)" for r in fast)
    jobs = ", ".join(f"{r['strategy']} {r['spark_jobs']}" for r in fast)
    return [f"- {names} outran serial by more than their workers can: on Spark, serial ran "
            f"{base['spark_jobs']} Spark jobs (one a step: the driver sends the parameters "
            f"and sums the partitions' gradients each step) and {jobs}, so the ratio measures "
            "Spark's cost per job more than parallel speed. Compare the other strategies "
            "with each other."]


def _staleness_verdict(r: dict, base: dict) -> str:
    """Whether stale updates hurt, by the final loss against serial's: only
    where both runs finished with finite losses (the ratio of a stopped
    run's loss, or a NaN, says nothing)."""
    unfinished = [x["strategy"] for x in (base, r) if not _finished(x)]
    if unfinished:
        return (f"; whether that hurt cannot be read from the final losses: "
                f"{' and '.join(unfinished)} did not finish")
    if base["final_loss"] <= 0:
        return ""
    ratio = r["final_loss"] / base["final_loss"]
    verdict = "hurt" if ratio > 1.1 else "did not hurt"
    return f"; at this learning rate that {verdict} (final loss {_fmt(ratio, 3)}x serial's)"


def _same_steps(row: dict, base: dict) -> bool:
    """Both runs took the same steps: mini-batches of one size (serial's
    compiled per-example loop, on sparse problems, steps once per example),
    every gradient of a step in it (backup workers leave the late ones out),
    none dropped or lost, the same number of updates, and both finished."""
    return (row.get("batch_size") == base.get("batch_size")
            and not row.get("per_example_loop") and not base.get("per_example_loop")
            and not row.get("backup_workers") and not row.get("late_gradients")
            and not row.get("dropped_updates") and not base.get("dropped_updates")
            and not row.get("failed_workers") and row["updates"] == base["updates"]
            and _finished(row) and _finished(base))


def _finished(row: dict) -> bool:
    """The run ended its budget (or met its target) with a finite loss: not
    diverged, not interrupted, not failed."""
    loss = row["final_loss"]
    return (loss is not None and math.isfinite(loss) and not row.get("stopped")
            and row.get("status") not in UNFINISHED)


def _duration(seconds: float) -> str:
    """``seconds`` in the unit that shows it: s, ms, us or ns."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def write_comparison(out: Path, problem: str, runs: list[list[dict]], histories: dict,
                     target=None) -> list[dict]:
    """``runs``: per strategy, the summaries of its turns; ``histories``: the
    first turn's metrics rows, by strategy."""
    rows = comparison_rows(runs)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if r[k] is None else r[k] for k in CSV_COLUMNS})
    atomic_write(Path(out) / "comparison.csv", buf.getvalue())
    from .plots import plot_loss  # matplotlib loads only when a plot is drawn
    plot_loss(Path(out) / "comparison.png", histories, title=f"{problem}: loss by strategy")
    text = report_markdown(problem, rows, target)
    if has_staleness(rows):
        from .plots import plot_staleness_by_strategy

        plot_staleness_by_strategy(Path(out) / "staleness.png", rows,
                                   title=f"{problem}: staleness by strategy")
        text += "\n" + "\n".join(staleness_markdown(rows))
    atomic_write(Path(out) / "report.md", text)
    return rows

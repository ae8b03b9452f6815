"""``monsoon compare``: the same problem and budget under several strategies.

Writes one run folder per strategy (``OUT/STRATEGY/``), ``comparison.csv``,
``comparison.png`` (loss against wall time and against epochs, one curve per
strategy) and ``report.md``. ``serial`` always runs with one worker: it is the
baseline the speedups are measured against.

``repeats``: every strategy runs that many times, in turns (serial, sync,
..., serial, sync, ...), so that a slow spell of a shared machine falls on
all of them alike. The report's speeds are then the medians of those runs
(with their ranges), and each speedup the median of the runs' ratios to the
serial run of their turn. The first turn's folders are ``OUT/STRATEGY/`` (its
curves are the ones plotted); later turns write ``OUT/repeats/STRATEGY-K/``.
``compress``: one ``--compress`` spec for every strategy, or one per
strategy, ``STRATEGY=SPEC,...`` (e.g. ``sync=topk:0.01,local-sgd=powersgd:2``;
a strategy not named runs uncompressed; one spec compresses the strategies
that send messages, and those that send none, serial and hogwild, run
uncompressed). comparison.csv and report.md then
carry each run's bytes sent and compression ratio.

Short single runs vary from one to the next on a busy machine;
bench/quick_start.py measures how much for the quick start's report.

A new compare in a folder an earlier one wrote first removes what that one
wrote (its run folders, also those a ``--resume`` with fewer strategies left
out of comparison.csv, kept in ``RUNS``; its report and plots:
``_clear_previous``; where one of those folders cannot be written, nothing:
it is refused in one line), never other files there. A compare holds its
folder while it runs (``FolderLock``; each strategy's run holds
``OUT/STRATEGY``): a second compare on it is refused in one line. SIGTERM or
SIGINT during a strategy's run (``Interrupted``) ends the compare with the
report of what ran, that strategy marked interrupted; ``resume`` (the
compare's own folder, ``--resume OUT``) then keeps each run that ended
under the same settings, resumes the interrupted one from its checkpoint
(where its strategy writes them; else it runs again; one of other settings
is refused before any run: ``_check_resumes``) and runs the rest. A
strategy whose run fails (a lost worker sync needs: ``_failed_run``) is
marked failed with its reason and the others still run; the compare then
writes the report and raises ``RunFailed`` naming it, and ``--resume OUT``
runs it again (from the checkpoint its failure named, if any).
"""
from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path

import numpy as np

from .api import (Result, _carry_on, _first_line, _remove_empty as _remove_made, check,
                  check_out, check_resume_of, check_writable, folder_path, train)
from .config import (COMPARE_DEFAULTS, RUN, check_compare_compress, check_error_feedback,
                     for_strategy, refuse_untaken, resolve)
from .compressors.messages import by_strategy
from .engines.options import RESUME
from .errors import ConfigError, Interrupted, MonsoonError, RunFailed
from .monitor.lifecycle import signal_name
from .monitor.processes import leave_if_re_running_main
from .record.checkpoints import checkpoint_files
from .record.atomic import atomic_write
from .record.folder_lock import FolderLock
from .record.report import write_comparison
from .record.run_folder import COMPARE_RUNS as RUNS  # every run folder it wrote, resumes too
from .record.run_folder import (COMPARE_FILES, RESULT_FILES, clear_results, read_metrics,
                                read_summary, to_json)
from .strategies import STRATEGIES


@dataclass
class Comparison:
    """What a compare ran: ``results``, each strategy's first run (its
    ``Result``, by strategy name); ``rows``, comparison.csv's rows (one per
    strategy: speeds, losses, speedups over serial where it ran); ``out``,
    the folder with the report, plots and each strategy's run folder."""
    results: dict[str, Result]
    rows: list[dict]
    out: Path


def compare(problem="exp", strategies=COMPARE_DEFAULTS["strategies"], workers: int = 2,
            out="runs/compare", repeats: int = COMPARE_DEFAULTS["repeats"], cli: bool = False,
            **options) -> Comparison:
    """Train ``problem`` (a name or a ``Problem``) under each of
    ``strategies`` (a list, or "a,b,c") on ``workers`` workers (serial on
    one), with the same ``options`` (``train``'s; each strategy gets those
    it takes, and one that none takes is refused) and budget; ``repeats``
    runs of each, in turns. Writes each run in ``out/STRATEGY`` and the
    report (report.md, comparison.csv, comparison.png) in ``out``; note
    that ``out`` defaults to runs/compare, where the command line's is
    runs/compare-PROBLEM. ``resume=out`` carries an interrupted or failed
    compare on. Returns a ``Comparison``; raises ``ConfigError`` before any
    run, ``Interrupted``, or ``RunFailed`` once the others have run (its
    ``comparison`` holds what they gave). ``cli``: the ``monsoon`` command
    sets it (messages name flags)."""
    leave_if_re_running_main()  # a worker re-running an unguarded script clears nothing
    if isinstance(strategies, str):
        strategies = [s.strip() for s in strategies.split(",") if s.strip()]
    if not strategies:
        raise ConfigError("no strategies given; e.g. --strategies serial,sync,async,hogwild")
    classes = {s: STRATEGIES.get(s) for s in strategies}  # an unknown name lists the valid ones
    RUN["workers"].value(workers, cli)  # checked even where every strategy runs one worker
    if len(set(strategies)) != len(strategies):
        raise ConfigError("a strategy is listed twice in --strategies")
    # an option is refused only when none of the strategies takes it
    refuse_untaken({k: v for k, v in options.items() if STRATEGIES.takers(k)},
                   {"strategy": list(strategies)}, cli)
    if isinstance(repeats, bool) or not isinstance(repeats, Integral) or repeats < 1:
        raise ConfigError(f"repeats must be a whole number >= 1 (got {repeats!r}); "
                          "e.g. --repeats 3")
    named = set(by_strategy(options.get("compress")) or ()) - set(strategies)
    if named:
        raise ConfigError(f"--compress names {', '.join(sorted(named))}, not in --strategies "
                          f"({', '.join(strategies)}); give STRATEGY=SPEC for those listed")
    check_compare_compress(options.get("compress"), list(strategies))
    check_error_feedback(options.get("compress"), options.get("no_error_feedback"), cli)
    out = Path(folder_path(out))
    resume = options.pop("resume", None)
    if resume is not None:  # a path, not empty: checked as train checks its own
        resume = RESUME.value(os.fspath(resume) if isinstance(resume, os.PathLike) else resume,
                              cli)
    if resume is not None and Path(resume).resolve() != out.resolve():
        given, wrote = ((f"compare --resume {resume}", "--out") if cli else
                        (f"resume={json.dumps(str(resume))}", "out="))
        raise ConfigError(f"{given}: give the compare's own folder, the {wrote} it wrote (here "
                          f"{out}); it keeps the runs that ended there")
    counts = {s: 1 if classes[s].single_worker else workers for s in strategies}
    # passed to every strategy: one that has no use for an option (serial, --shards) takes it
    shared = frozenset(k for k, v in options.items() if v is not None)
    _check_each(problem, strategies, counts, out, options, shared, cli)
    name = getattr(problem, "name", problem)
    check_out(out, COMPARE_FILES, name, cli, "the compare")
    for s in strategies:
        for turn in range(int(repeats)):
            check_out(out, RESULT_FILES, name, cli, folder=_folder(out, s, turn))
    made = check_writable(out)
    lock = FolderLock(out, "compare")  # its own files; each run holds OUT/STRATEGY
    try:
        return _run_all(problem, strategies, counts, out, resume, int(repeats), options, shared,
                        cli)
    except ConfigError:  # refused: no folder left behind that this compare made
        lock.release()
        _remove_made(made)
        raise
    finally:
        lock.release()


def _check_each(problem, strategies, counts, out: Path, options, shared, cli: bool) -> None:
    """Every strategy's run checked (``api.check``) before any starts, and
    every refusal told in one line, so that one round trip tells them all:
    each distinct reason once (``_reasons``: an engine that cannot run a
    strategy, a batch its workers' parts cannot hold), then what to change
    here, the strategies to drop from ``--strategies`` to compare the rest.
    One reason that refuses all of them alike (a bad option) is raised as it
    is; all refused for different reasons, the line says that none runs
    with these options, and why each does not (``_refusal``)."""
    refused = {}
    for s in strategies:
        try:
            check(problem, s, counts[s], out=out / s, shared=shared, cli=cli,
                  **for_strategy(options, s))
        except ConfigError as err:
            refused[s] = err
    if not refused:
        return
    first = next(iter(refused.values()))
    runs = [s for s in strategies if s not in refused]
    reasons = _reasons(refused)
    if not runs and len(reasons) == 1:  # one reason for all: the run's own line
        if reasons[0] == str(first):
            raise first
        raise ConfigError(reasons[0]) from None
    where = "--strategies" if cli else "strategies"
    raise ConfigError(_refusal(reasons, list(refused), runs, where)) from None


_NAME = "\0"  # a strategy's own name in its reason, where reasons are grouped


def _reasons(refused: dict) -> list[str]:
    """Each distinct reason in ``refused`` (strategy: its ConfigError) once,
    in the strategies' order. Reasons that differ only in their strategy's
    name (``each async worker``, ``each hogwild worker``) are one, naming
    them all (``each async or hogwild worker``); a reason that names none
    of its strategies is prefixed by them (``sync, async: ...``)."""
    groups: dict[str, list[str]] = {}
    for s, err in refused.items():
        own = re.compile(rf"(?<![\w-]){re.escape(s)}(?![\w-])")
        groups.setdefault(own.sub(_NAME, str(err)), []).append(s)
    if len(groups) == 1 and _NAME not in next(iter(groups)):
        return list(groups)  # one reason for all: no need to say whose
    return [reason.replace(_NAME, _either(names)) if _NAME in reason
            else f"{', '.join(names)}: {reason}" for reason, names in groups.items()]


def _either(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _refusal(reasons: list[str], refused: list[str], runs: list[str], where: str) -> str:
    """The line for strategies refused before any run: every reason, then
    what to drop from ``where`` (``--strategies``, or ``strategies`` from
    Python) to compare those left, or, where none is left (for different
    reasons), that no strategy runs with these options."""
    said = "; ".join(reasons)
    if runs:
        return f"{said}; drop {', '.join(refused)} from {where} to compare {', '.join(runs)}"
    return f"no strategy in {where} runs with these options: {said}"


def _run_all(problem, strategies, counts, out: Path, resume, repeats: int, options,
             shared, cli: bool) -> Comparison:
    """Every strategy's turns, then the report; ``out`` is held; ``cli``:
    called by the command line (messages name its flags)."""
    if resume is None:  # bad options were refused above, before anything is removed
        _clear_previous(out)
    else:  # a checkpoint this command cannot resume is refused before any run
        _check_resumes(problem, strategies, counts, out, repeats, options, shared, cli)
    results, turns, failed = {}, {s: [] for s in strategies}, {}
    # a --resume with fewer strategies keeps the others' in RUNS, for a later compare to clear
    written = (_written(out) or {}) if resume is not None else {}
    try:
        for turn in range(repeats):
            for s in strategies:
                folder = _folder(out, s, turn)
                _note_written(out, written, s, turn)
                n = counts[s]
                given = for_strategy(options, s)
                result = (_ended(folder, problem, s, n, given, shared, cli)
                          if resume is not None else None)
                if result is None:
                    again = resume is not None and _resumable(folder)
                    try:
                        result = train(problem, strategy=s, workers=n, out=folder,
                                       raise_on_divergence=False, shared=shared, cli=cli,
                                       **given, **({"resume": str(folder)} if again else {}))
                    except (ConfigError, Interrupted):
                        raise
                    except MonsoonError as err:  # this strategy failed: the others go on
                        result = _failed_run(err, folder, problem, s, n)
                        failed[s if turn == 0 else f"{s} (turn {turn + 1})"] = result.summary
                results.setdefault(s, result)
                turns[s].append(result.summary)
    except Interrupted as err:
        raise _interrupted(err, out, strategies, results, turns, options, failed,
                           cli) from None
    comparison = Comparison(results, _write(out, strategies, results, turns, options), out)
    if failed:
        raise _failures(comparison, strategies, turns, failed, cli)
    return comparison


def _folder(out: Path, strategy: str, turn: int) -> Path:
    """The run folder of ``strategy``'s turn ``turn`` (0: the first)."""
    return out / strategy if turn == 0 else out / "repeats" / f"{strategy}-{turn + 1}"


def _check_resumes(problem, strategies, counts, out: Path, repeats: int, options,
                   shared, cli: bool) -> None:
    """Every run ``--resume`` would carry on from its checkpoint
    (``_resumable``) checked as its ``train`` will check it
    (``check_resume_of``): one taken with other settings is refused in one
    line before any run (else the runs before it would run again first, and
    the report be left out of step with their folders)."""
    for turn in range(repeats):
        for s in strategies:
            folder = _folder(out, s, turn)
            if _resumable(folder):
                check_resume_of(problem, s, counts[s], out=folder, shared=shared, cli=cli,
                                **for_strategy(options, s))


def _write(out: Path, strategies, results, turns, options) -> list[dict]:
    """comparison.csv, comparison.png and report.md of the strategies that ran."""
    ran = [s for s in strategies if turns[s]]
    name = next(iter(results.values())).summary["problem"]
    return write_comparison(out, name, [turns[s] for s in ran],
                            {s: results[s].history for s in ran},
                            target=options.get("target_loss"))


def _interrupted(err: Interrupted, out: Path, strategies, results, turns, options, failed,
                 cli: bool):
    """The compare's Interrupted: the report of what ran (the interrupted
    run marked, and any that failed), and the command that carries it on."""
    stopped = getattr(err, "result", None)
    if stopped is None:  # stopped before its run folder was written: nothing to add
        return err
    s = stopped.summary["strategy"]
    results.setdefault(s, stopped)
    turns[s].append(stopped.summary)
    _write(out, strategies, results, turns, options)
    again = ("resumes from its checkpoint" if stopped.summary.get("checkpoint")
             and "cannot be carried on" not in str(err) else "runs again from the start")
    left = [x for x in strategies if not turns[x]]
    message = (f"interrupted by {signal_name(err.signum)} during {s}, after "
               f"{stopped.summary['updates']} updates: {out / 'report.md'} has "
               f"{', '.join(x for x in strategies if turns[x])} ({s} interrupted"
               f"{''.join(f', {f} failed' for f in failed)})"
               f"{'; not run: ' + ', '.join(left) if left else ''}; to carry on, "
               f"{_carry_on(out, cli, 'compare')} (the runs that ended are kept, "
               f"{s} {again}"
               f"{''.join(f', {f} {_again(x)}' for f, x in failed.items())})")
    new = Interrupted(message, err.signum, out)
    new.result = stopped
    return new


def _again(summary: dict) -> str:
    """What ``--resume`` does with a failed run: the failure wrote a
    checkpoint there only where ``--resume`` takes it."""
    return ("resumes from its checkpoint" if summary.get("checkpoint")
            else "runs again from the start")


def _failed_run(err: MonsoonError, folder: Path, problem, strategy: str, workers: int):
    """A strategy's failed run as a ``Result``: its folder's (status
    "failed", the reason, the curve so far), or the reason alone where the
    failure wrote no folder."""
    result = _read_run(folder)
    if result is not None and result.summary.get("status") == "failed":
        return result
    summary = {"problem": getattr(problem, "name", problem), "strategy": strategy,
               "workers": workers, "status": "failed", "error": _first_line(err),
               "final_loss": None, "updates": 0, "checkpoint": None}
    return Result(summary, [], None, None)


def _failures(comparison: Comparison, strategies, turns, failed: dict, cli: bool) -> RunFailed:
    """The compare's error once every run has had its turn: which failed
    and why, the report of them all, and the command that runs them again."""
    out = comparison.out
    err = RunFailed("; ".join(f"{f} failed: {x.get('error')}" for f, x in failed.items())
                    + f": {out / 'report.md'} has "
                    f"{', '.join(s for s in strategies if turns[s])} ({', '.join(failed)} "
                    f"failed); to carry on, {_carry_on(out, cli, 'compare')} (the runs that "
                    "ended are kept, "
                    + ", ".join(f"{f} {_again(x)}" for f, x in failed.items()) + ")")
    err.run_dir = out
    err.comparison = comparison  # what the compare would have returned
    return err


ENDED = ("finished", "reached target", "converged", "diverged")
COSMETIC = ("progress", "resume", "resumed_from")  # they do not change a run's result


def _read_run(folder: Path):
    """The run in ``folder`` (its summary, curve and parameters) as a
    ``Result``; None where it holds none that can be read."""
    try:
        summary = read_summary(folder)  # a diverged run's "inf" loss as the float it was
        history = read_metrics(folder / "metrics.csv")
    except (OSError, ValueError):
        return None
    params = np.load(folder / "params.npy") if (folder / "params.npy").exists() else None
    return Result(summary, history, params, None, run_dir=folder)


def _ended(folder: Path, problem, strategy: str, workers: int, given: dict, shared,
           cli: bool):
    """The run in ``folder`` as a ``Result``, if it ended (``ENDED``) with the
    settings this command gives it (config.json against a fresh ``resolve``);
    else None (it runs, or resumes)."""
    run = _read_run(folder)
    if run is None or run.summary.get("status") not in ENDED:
        return None
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    resolved = resolve(problem, strategy, workers, {**given, "out": str(folder)}, shared, cli)
    # as ``train`` writes config.json: the settings, with what the strategy
    # and the engine resolved (a backend "auto" is the one it chose)
    wanted = json.loads(to_json({**resolved.config(), **resolved.strategy.describe(),
                                 **resolved.engine.describe()}))
    if any(config.get(k) != v for k, v in wanted.items() if k not in COSMETIC):
        return None
    return run


def _resumable(folder: Path) -> bool:
    """An interrupted run, or a failed one whose failure found a checkpoint
    ``--resume`` takes (its summary names it), with checkpoints there
    (train checks them)."""
    try:
        summary = read_summary(folder)
    except (OSError, ValueError):
        return False
    status = summary.get("status")
    return ((status == "interrupted" or status == "failed" and bool(summary.get("checkpoint")))
            and bool(checkpoint_files(folder / "checkpoints")))


def _clear_previous(out: Path) -> None:
    """Remove what an earlier compare wrote in ``out``: the run folders it
    wrote (``_written``: those its comparison.csv names, and those of
    strategies a ``--resume`` with fewer left out of it; their results and
    checkpoints; a folder is removed only once empty, so a user's files
    stay), its repeats, report and plots. Every folder to clear is checked
    writable first (``check_writable``): one that is not refuses the
    compare in one line, nothing removed."""
    written = _written(out)
    if written is None:  # no earlier compare's table: nothing here is known to be its
        return
    folders = [_folder(out, name, k) for name, turns in written.items() for k in range(turns)]
    folders = [f for f in folders if (f / "summary.json").exists()]
    for folder in folders:
        for sub in (folder, folder / "checkpoints", folder / "tb"):
            if sub.is_dir():
                check_writable(sub)
    for folder in folders:
        _remove_run(folder)
    _remove_empty(out / "repeats")
    for name in COMPARE_FILES:
        (out / name).unlink(missing_ok=True)


def _written(out: Path) -> dict[str, int] | None:
    """The strategies an earlier compare in ``out`` ran, each with its
    number of turns: those its comparison.csv names and those ``RUNS``
    keeps; None where there is neither."""
    runs, seen = [], False
    try:
        with open(out / "comparison.csv") as f:
            runs += [(r.get("strategy"), r.get("repeats")) for r in csv.DictReader(f)]
        seen = True
    except (OSError, csv.Error):
        pass
    try:
        runs += list(json.loads((out / RUNS).read_text()).items())
        seen = True
    except (OSError, ValueError, AttributeError):
        pass
    if not seen:
        return None
    found = {}
    for name, turns in runs:
        if isinstance(name, str) and name and "/" not in name and not name.startswith("."):
            try:
                found[name] = max(found.get(name, 1), int(turns or 1))
            except (TypeError, ValueError):
                found.setdefault(name, 1)
    return found


def _note_written(out: Path, written: dict, strategy: str, turn: int) -> None:
    """``strategy``'s turn ``turn`` (0: the first) added to ``RUNS``, before
    its run writes its folder."""
    if written.get(strategy, 0) < turn + 1:
        written[strategy] = turn + 1
        atomic_write(out / RUNS, json.dumps(written) + "\n")


def _remove_run(folder: Path) -> None:
    """A run folder's own files (``clear_results``, its checkpoints), then the
    folder if nothing else is left in it. Held while it is cleared
    (``FolderLock``): a run using it (a ``monsoon train --out`` of its own)
    refuses the compare in one line, and a killed run's lock file goes."""
    if not (folder / "summary.json").exists():
        return
    lock = FolderLock(folder)
    try:
        clear_results(folder, resuming=False)
        for path in checkpoint_files(folder / "checkpoints"):
            path.unlink(missing_ok=True)
    finally:
        lock.release()
    for sub in ("checkpoints", "tb", ""):
        _remove_empty(folder / sub if sub else folder)


def _remove_empty(folder: Path) -> None:
    try:
        os.rmdir(folder)
    except OSError:  # absent, or holds something not ours
        pass


"""``monsoon.train``: one call from a problem name to a finished, recorded run.

    import monsoon
    result = monsoon.train("exp", strategy="sync", workers=2, lr=0.01, epochs=50, seed=0)
    result.summary   # the dict written to summary.json
    result.history   # the rows of metrics.csv
    result.params    # final flat parameters (and result.model for torch problems)
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import __version__
from . import devices as _devices
from .config import RUN, resolve
from .record import checkpoints as _checkpoints
from .record.checkpoints import check_resume
from .monitor.lifecycle import StopSignals, on_stop, signal_name
from .monitor.processes import leave_if_re_running_main, single_blas_thread
from .compressors.messages import add_bytes_column
from .errors import ConfigError, Interrupted, MonsoonError, RunFailed, TrainingDiverged
from .problems import Problem
from .problems.buffers import combine as combine_buffers
from .record import Recorder, write_run_folder
from .record.recorder import (DIVERGED, OPTIONAL_COLUMNS, converged, reached_target,
                              not_finite_at_start, worse_than_start)
from .record.live import make_live
from .record.folder_lock import FolderLock
from .record.run_folder import (RESULT_FILES, SetAside, clear_results, refuse_writing_over,
                                save_model)


@dataclass
class Result:
    """One run's outcome: ``summary`` (summary.json's fields: status, final
    loss, speed, counts), ``history`` (the loss curve's rows, as
    metrics.csv), ``params`` (the trained parameter vector), ``problem``
    (the problem trained), ``run_dir`` (its run folder, if any),
    ``worker_params`` (each worker's own copy, where workers keep one) and
    ``state`` (a torch model's trained buffers); ``model`` rebuilds the
    trained torch module."""
    summary: dict
    history: list[dict]
    params: np.ndarray
    problem: Problem
    run_dir: Path | None = None
    worker_params: dict | None = None   # each worker's own copy, where it keeps one
    state: dict | None = None   # the trained buffers (BatchNorm statistics), torch problems

    @property
    def model(self):
        """The trained ``torch.nn.Module`` (torch problems only)."""
        if self.problem.model_at is None:
            raise AttributeError(f"problem {self.problem.name!r} has no torch model")
        model = self.problem.model_at(self.params)
        if self.state:  # this run's buffers, even if the problem has trained again since
            import torch

            named = dict(model.named_buffers())
            with torch.no_grad():
                for name, value in self.state.items():
                    named[name].copy_(torch.from_numpy(value))
        return model


def staleness_stats(counts: Counter) -> dict:
    total = sum(counts.values())
    if total == 0:
        return {"mean": None, "p50": None, "p99": None, "max": None}
    values = sorted(counts)
    mean = sum(v * c for v, c in counts.items()) / total

    def quantile(q):
        rank, seen = q * (total - 1), 0
        for v in values:
            seen += counts[v]
            if seen > rank:
                return v
        return values[-1]

    return {"mean": mean, "p50": quantile(0.5), "p99": quantile(0.99), "max": values[-1]}


def check_writable(out: Path) -> list[Path]:
    """The run folder can be created and written, before any worker starts;
    returns the folders this made, innermost first. The probe's name is
    this check's own: every torchrun rank checks the folder, and on one
    machine or a shared file system it is the same one."""
    made = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".monsoon-write-test-{uuid.uuid4().hex}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write the run folder {out}: {exc.strerror or exc}; "
                          "choose another --out") from None
    return made


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (innermost first) where they are still empty: a
    run refused before it began leaves no folder it made."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (another process's files), or gone
            return


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _resumable(resolved, w0, folder):
    """The checkpoint in ``folder`` that this very command would resume from
    with ``--resume`` (``check_resume``'s own checks, read whole), or None."""
    run = resolved.run
    try:
        return check_resume(resolved.engine, resolved.problem, resolved.strategy,
                            resolved.rule, w0, resolved.processes, run["batch_size"],
                            run["seed"], directory=folder)
    except (MonsoonError, OSError):
        return None


def _curve_so_far(recorder, saved) -> tuple[list[dict], dict]:
    """A failed run's curve (the recorder's snapshots so far, evaluated now,
    as a finished run's are) and the counts its summary gives: ``updates``,
    its last row's. Where the checkpoint the summary names (``saved``) is
    further on, the curve and counts are that checkpoint's (its rows,
    updates, examples, dropped and local steps), so the folder agrees with
    it: the torch engine's recorder lives in rank 0, lost with the run, and
    this process's holds no row. (A run whose engine returned, ``saved``
    None, gives the engine's counts.)"""
    try:
        rows = list(recorder.settled_rows())
    except Exception:  # noqa: BLE001 - the folder matters more than the curve
        rows = list(recorder.rows)
    done = rows[-1]["updates"] if rows else 0
    if saved is None or _checkpoints.applied(saved.meta) <= done:
        return rows, {"updates": done}
    meta = saved.meta
    counts = {"updates": _checkpoints.applied(meta), "examples": int(meta["examples"]),
              "dropped_updates": int(meta["dropped"])}
    if "local_updates" in meta:
        counts.update(local_updates=int(meta["local_updates"]),
                      dropped_local_updates=int(meta.get("dropped_local_updates", 0)))
    return [dict(r) for r in meta["rows"]], counts


def _failed(exc: Exception, resolved, recorder, out, elapsed: float, w0=None,
            res=None) -> MonsoonError:
    """The error the user sees when an engine fails mid-run: one line naming
    the worker or node (where the engine said), the reason, the run folder
    (written, with status "failed"; a resumed run's keeps the previous
    run's results, ``_keeps_previous``) and how to carry on: from a checkpoint
    that ``--resume`` with this command would take, if there is one. ``res``:
    the engine's result where the run ended and the evaluation after it
    failed; the folder then also holds its counts and trained model. Where
    the folder gets no summary (a resumed run's, one that could not be
    written), the previous run's results are given back only after this
    (``_end_aside``): the line says so then (``folder_line``, ``_given_back``)."""
    run, engine = resolved.run, resolved.engine
    reason = _first_line(exc)
    if not isinstance(exc, MonsoonError):
        what = f"the {run['engine']} engine" if res is None else "evaluating the trained model"
        reason = f"{what} failed: {type(exc).__name__}: {reason}"
    lost = [] if res is None else res.failed_workers
    if lost:  # the evaluation may fail for the failed workers' reason: both are told
        reason += "; " + ", ".join(f"worker {f['worker']} had failed: {f['error']}"
                                   for f in lost)
    saved = None
    folder = getattr(engine, "checkpoint_dir", None)
    if folder and w0 is not None and _checkpoints.checkpoint_files(folder):
        saved = _resumable(resolved, w0, folder)
    checkpoint = None if saved is None else str(saved.path)
    back = ""  # what the line adds once the previous run's results are back (``_given_back``)
    if out is None:
        where = "no run folder (give --out to keep one)"
    elif not getattr(engine, "writes_run_folder", True):
        where = f"rank 0, if it is alive, writes the run folder {out}"
    elif res is None and _keeps_previous(resolved):
        where, back = f"run folder {out}", ", which keeps the previous run's results"
    else:
        rows, counts = _curve_so_far(recorder, saved if res is None else None)
        summary = {"problem": run["problem"], "strategy": run["strategy"],
                   "engine": run["engine"], "workers": run["workers"], "seed": run["seed"],
                   "status": "failed", "error": reason,
                   "failed_worker": getattr(exc, "worker", None),
                   "final_loss": None, **counts,
                   "checkpoint": checkpoint, "total_time_s": elapsed,
                   "monsoon_version": __version__}
        if res is not None:
            summary.update(updates=res.updates, examples=res.examples,
                           wall_time_s=res.wall_time_s,
                           failed_workers=[{"worker": f["worker"], "error": f["error"]}
                                           for f in lost])
        try:
            write_run_folder(Path(out), {**resolved.config(), **engine.describe()}, summary,
                             rows)
            where = f"run folder {out}"
        except Exception as write_error:  # noqa: BLE001
            where = f"the run folder {out} could not be written ({_first_line(write_error)})"
            back = GIVEN_BACK
        else:
            if res is not None:
                where += _save_trained(Path(out), resolved, res)
    hint = (_resume_hint(resolved, out, f"from {Path(checkpoint).name}")
            if checkpoint and out is not None else "")
    message = f"{reason} ({where}){hint}"
    if isinstance(exc, MonsoonError):
        exc.args = (message,)
        err = exc
    else:
        err = RunFailed(message)
    err.run_dir = Path(out) if out is not None else None
    err.folder_line = f"{reason} ({where}{back}){hint}" if back else None
    return err


GIVEN_BACK = "; the previous run's results are back in place"


def _given_back(err: BaseException) -> None:
    """Say in ``err``'s line (``_failed``'s, ``_write_results``'s: its
    ``folder_line``, the line as it reads then; None where it does not
    change) that the previous run's results are back in its folder
    (``_end_aside`` gave them back)."""
    line = getattr(err, "folder_line", None)
    if line:
        err.args = (line,)


def _save_trained(out: Path, resolved, res) -> str:
    """The run's final parameters, with its workers' buffers combined per
    the strategy's policy, in ``out`` (``save_model``); what to add to the
    line where part of it could not be saved ("": all of it was). Buffers
    that cannot be loaded (what may have failed the evaluation) leave the
    parameters saved without them."""
    problem = resolved.problem
    missing = ""
    if res.worker_states:
        before = problem.state()
        try:
            problem.load_state(combine_buffers(res.worker_states, resolved.strategy.buffers))
        except Exception as exc:  # noqa: BLE001 - the parameters are saved all the same
            if before:
                problem.load_state(before)  # not half of them
            missing = f"; its model saved without the workers' buffers ({_first_line(exc)})"
    try:
        save_model(out, problem, res.params)
    except Exception as exc:  # noqa: BLE001
        return f"; its trained model could not be saved ({_first_line(exc)})"
    return missing


def _or_failed(call, resolved, recorder, out, t_start: float, w0, res=None):
    """``call()``; any failure but a refusal or a stop asked for ends as
    ``_failed`` says: one line and a run folder."""
    try:
        return call()
    except (ConfigError, Interrupted, TrainingDiverged, KeyboardInterrupt):
        raise  # refused before any work, or stopped on purpose: said as it is
    except Exception as exc:  # noqa: BLE001 - any failure: one line and a run folder
        err = _failed(exc, resolved, recorder, out, time.perf_counter() - t_start, w0, res)
        if err is exc:
            raise
        raise err from exc


def _resume_hint(resolved, out, what: str = "", checkpoint: bool = True) -> str:
    """The end of a stopped run's line: the command that carries it on from
    its checkpoint (``what``: which one), or why ``--resume`` would refuse
    it (``checkpoints.resume_refusal``, as ``check_resume`` asks), also
    where the engine wrote no checkpoint for that reason; nothing where
    there is no ``checkpoint`` otherwise."""
    from .record.checkpoints import resume_refusal

    refusal = resume_refusal(resolved.engine, resolved.problem, resolved.strategy)
    if refusal is not None:
        return f"; it cannot be carried on: {refusal}"
    if not checkpoint:
        return ""
    return f"; to carry on{' ' + what if what else ''}, {_carry_on(out, resolved.cli, 'train')}"


def _diverged_unsaved(resolved) -> str:
    """The end of a stopped run's line where its parameters are not finite
    and it wrote no checkpoint (``Checkpointer.save`` writes none of such
    parameters): a resume would have nothing to start from, so none is
    offered; the line says why, and that a new run with a lower learning
    rate is what to do instead."""
    return ("; it cannot be carried on: it diverged (its parameters are not finite) before "
            "it wrote any checkpoint; lower the learning rate "
            f"({RUN['lr'].named(resolved.cli)}) and run it again from the start")


def _carry_on(out, cli: bool, call: str) -> str:
    """How to carry a stopped run (or compare) in ``out`` on: the same command
    with ``--resume OUT``, or, from Python, ``call`` (train, compare) with
    ``resume="OUT"``."""
    if cli:  # a path with spaces pastes whole
        return f"run the same command with --resume {shlex.quote(str(out))}"
    return f"call {call} again with the same arguments and resume={json.dumps(str(out))}"


def check(problem="exp", strategy: str = "serial", workers: int = 1, *, out=None,
          shared=frozenset(), cli: bool = False, **options):
    """``train``'s configuration resolved and checked (``config.resolve``,
    the strategy's and engine's pre-flight included), with nothing started
    or written: what ``compare`` checks of every strategy before any runs.
    ``shared``: the options ``compare`` passes to every strategy; ``cli``:
    given on the command line (refusals name flags, not keywords)."""
    given = {k: v for k, v in options.items() if v is not None}
    if out is not None:
        given["out"] = folder_path(out)
    return resolve(problem, strategy, workers, given, frozenset(shared), cli)


def folder_path(out) -> str:
    """``out``, a run (or compare) folder, as a str: refused in one line
    where it is no path, or an empty one (it would be the current
    directory, whose own config.json and metrics.csv a run overwrites)."""
    if not isinstance(out, (str, os.PathLike)):
        raise ConfigError(f"out={out!r}: give the run folder as a path (a str or a "
                          "pathlib.Path)")
    if not str(out).strip():
        raise ConfigError(f"out={str(out)!r} names no folder (an empty one would be the "
                          "current directory, its own files overwritten): give the run "
                          "folder, e.g. out='runs/mine' (--out runs/mine)")
    return str(out)


def check_out(out: Path, names, problem: str, cli: bool, who: str = "a run",
              folder: Path | None = None) -> None:
    """Refuse ``who`` in ``out`` (or in ``folder``, a compare's run folder
    in it) that would write over a file monsoon did not write there, or
    the problem's own data file (``problem``: its name), in one line naming
    --out or out= (``cli``), before anything is written
    (``run_folder.refuse_writing_over``)."""
    given = f"--out {shlex.quote(str(out))}" if cli else f"out={str(out)!r}"
    if folder is not None:
        given += f": its run folder {folder}"
    refuse_writing_over(folder or out, names, _checkpoints.problem_file(problem), given, who)


def _no_checkpoint(resolved) -> str:
    """The end of an interrupted run's line where it wrote no checkpoint:
    why, where the strategy writes none (the pipeline's stages keep their
    slices to themselves), else nothing."""
    from .strategies.base import STAGES

    if STAGES in resolved.strategy.needs(resolved.processes):
        return (f"; it cannot be carried on: the {resolved.strategy.name} strategy writes no "
                "checkpoints yet, so --resume is refused; start a new run")
    return ""


def train(problem="exp", strategy: str = "serial", workers: int = 1, *, out=None,
          raise_on_divergence: bool = True, shared=frozenset(), cli: bool = False,
          **options) -> Result:
    """Train ``problem`` (a problem's name or a ``Problem``) with ``strategy``
    on ``workers`` workers. ``options`` are the run's options and those the
    chosen strategy, rule, engine and problem declare (``monsoon options``
    lists them all); one that none of them takes is refused, in one line
    that names the keyword (``cli``, which the ``monsoon`` command sets:
    the flag)."""
    leave_if_re_running_main()
    resolved = check(problem, strategy, workers, out=out, shared=shared, cli=cli, **options)
    run, problem = resolved.run, resolved.problem
    if out is not None and getattr(resolved.engine, "writes_run_folder", True):
        check_out(Path(out), RESULT_FILES, run["problem"], cli)
    made = check_writable(Path(out)) if out is not None else []
    # the run holds its folder until it is written whole; another run's is refused
    lock = FolderLock(Path(out) if out is not None and getattr(
        resolved.engine, "writes_run_folder", True) else None)
    try:
        w0, total = _start_point(resolved)
        # placed lazily, where each worker computes
        _devices.assign(problem, resolved.devices, run["precision"])
        try:
            return _train(resolved, problem, w0, total, out, raise_on_divergence)
        except ConfigError:  # refused (a --resume that does not fit): no folder left behind
            lock.release()
            _remove_empty(made)
            raise
        finally:
            _devices.release(problem)  # back to the CPU: results do not depend on the device
    finally:
        lock.release()


def _train(resolved, problem, w0, total, out, raise_on_divergence) -> Result:
    run, engine = resolved.run, resolved.engine
    virtual = engine.virtual_time
    recorder = Recorder(problem, total, run['target_loss'], evals=run['evals'],
                        progress=run['progress'], cost_aware=not virtual,
                        eval_share=run['eval_share'], tol=run['tol'],
                        label=f"{run['problem']} {run['strategy']} x{run['workers']}")
    # --target-loss, --tol: rows are evaluated as they are taken (cost-bounded,
    # ``Recorder._check_target``) and the first at the target, or converged,
    # stops the run, as a divergence does; a run on virtual time (the sim)
    # runs its budget
    recorder.check_target = ((run['target_loss'] is not None or run['tol'] is not None)
                             and not virtual)
    _checked_resume(resolved, w0, total)
    aside = None
    if out is not None and getattr(engine, "writes_run_folder", True):
        aside = _start_folder(Path(out), resolved, w0)
    try:
        result = _live_run(resolved, problem, w0, total, out, raise_on_divergence, recorder)
    except BaseException as exc:
        if _end_aside(aside, _ending(exc, out)):
            _given_back(exc)
        raise
    _end_aside(aside, "discard")
    return result


def _live_run(resolved, problem, w0, total, out, raise_on_divergence, recorder) -> Result:
    """``_run`` with the live series (TensorBoard, MLflow) written as it goes;
    none where another process writes the run folder (under torchrun, a
    rank other than 0: rank 0 writes the run's)."""
    run, engine = resolved.run, resolved.engine
    live = None
    if getattr(engine, "writes_run_folder", True):
        live = make_live(run, out, {**resolved.config(), **engine.describe()},
                         f"{run['problem']}-{run['strategy']}-x{run['workers']}",
                         lambda name: RUN[name].named(resolved.cli), bar=recorder.bar_enabled())
    recorder.live_writer = live if live is not None and live.series else None
    try:
        result = _run(resolved, problem, w0, total, out, raise_on_divergence, recorder)
    except BaseException as exc:
        if live is not None:  # the curve so far, and MLflow's run marked
            folder = getattr(exc, "run_dir", None) or getattr(
                getattr(exc, "result", None), "run_dir", None)
            status = "KILLED" if isinstance(exc, (Interrupted, KeyboardInterrupt)) else "FAILED"
            live.finish(None if getattr(exc, "result", None) is None else recorder.rows,
                        folder, status)
        raise
    if live is not None:
        live.finish(result.history, result.run_dir, "FINISHED")
    return result


def _end_aside(aside, how: str) -> bool:
    """A refused run gives the previous run's files back (``how``
    "restore"; its live writer is closed by then, so its own TensorBoard
    file goes); a run that ended without results of its own (no summary:
    a resumed run that failed, ``_keeps_previous``, or a new one whose
    folder could not be written) gives back the previous run's and keeps
    its checkpoints ("give_back"); any other end leaves the folder to this
    run's files ("discard"). A file system error here is a warning: the run's own
    error, or its result, is what the user gets. Returns whether the
    previous run's results are back in place (given back whole)."""
    if aside is None:
        return False
    results = how == "give_back" and aside.holds_results()
    try:
        getattr(aside, how)()
    except OSError as exc:
        print(f"monsoon: warning: the previous run's files set aside in {aside.out} "
              f"could not be {'removed' if how == 'discard' else 'given back'}: {exc}",
              file=sys.stderr)
        return False
    return results


def _keeps_previous(resolved) -> bool:
    """Whether a run's folder keeps the previous run's results where the
    run ends without results of its own: a resumed run's (a failure before
    its engine returned then writes no summary, ``_failed``), whose
    previous results are those of the run it carries on, as a rule."""
    return bool(getattr(resolved.engine, "resume_dir", None))


def _ending(exc: BaseException, out) -> str:
    """``_end_aside``'s ``how`` for a run that raised ``exc``: "restore"
    where it was refused; "give_back" where it wrote no summary (a resumed
    run's failure, ``_keeps_previous``; a new run's summary that could not
    be written; a stop the engine did not catch): the previous run's
    results stay the folder's; else "discard"."""
    if isinstance(exc, ConfigError):
        return "restore"
    if out is not None and not (Path(out) / "summary.json").exists():
        return "give_back"
    return "discard"


def _start_point(resolved) -> tuple[np.ndarray, int]:
    """The run's initial parameters and its budget in examples."""
    run, problem, budget = resolved.run, resolved.problem, resolved.budget
    w0 = problem.initial_params(run['seed']).astype(problem.dtype, copy=False)
    total = (budget.epochs * problem.n_examples if budget.epochs is not None
             else budget.steps * run['batch_size'])
    return w0, total


def _checked_resume(resolved, w0, total: int):
    """The checkpoint the run's ``--resume`` takes (None: it resumes
    nothing), or its refusal in one line (``CheckpointError``): another
    run's, or more done than the budget holds."""
    run = resolved.run
    found = check_resume(resolved.engine, resolved.problem, resolved.strategy, resolved.rule,
                         w0, resolved.processes, run['batch_size'], run['seed'])
    _check_resumed_budget(found, resolved.budget, resolved.problem, total)
    return found


def check_resume_of(problem="exp", strategy: str = "serial", workers: int = 1, *, out,
                    shared=frozenset(), cli: bool = False, **options):
    """What ``train(..., out=out, resume=out)`` would resume from, checked
    as ``train`` checks it before it starts (the checkpoint, or None), or
    its one-line refusal, with nothing started or written: ``compare
    --resume`` checks every run it would resume before any runs."""
    resolved = check(problem, strategy, workers, out=out, shared=shared, cli=cli,
                     **{**options, "resume": str(out)})
    return _checked_resume(resolved, *_start_point(resolved))


def _check_resumed_budget(found, budget, problem, total: int) -> None:
    """Refuse, in one line, a ``--resume`` whose checkpoint has done more
    examples than this run's budget (``total``) holds: the resumed run
    would do nothing and report the checkpoint's run under a budget it
    exceeded."""
    # the rows its steps drew: those taken and those left out (spark: ``examples_left_out``)
    done = 0 if found is None else int(found.meta.get("examples", 0)) + int(
        found.meta.get("examples_left_out", 0))
    if done <= total:
        return
    if budget.epochs is not None:
        asked, need = f"--epochs {budget.epochs}", f"--epochs {-(-done // problem.n_examples)}"
    else:
        asked, need = f"--steps {budget.steps}", "a larger --steps"
    raise _checkpoints.CheckpointError(
        f"--resume: checkpoint {found.path} has done {done} examples "
        f"({done / problem.n_examples:g} epochs), more than {asked} asks for ({total}); "
        f"resume with {need} or more, or start a new run without --resume")


def _start_folder(out: Path, resolved, w0) -> SetAside:
    """The run folder holds this run alone: a previous run's results
    (``clear_results``) and checkpoints of another run
    (``checkpoints.remove_others``) are set aside before any work starts, so
    that a run that fails never leaves its summary beside another run's
    model, nor advice naming another run's checkpoint; a new run that does
    not resume from this folder removes an earlier run's even where its
    settings are the same (a restarted attempt of a torchrun launch keeps
    those its launch wrote, ``Engine.restarted_launch``). A damaged checkpoint
    is never removed: resuming from this folder, ``load_latest`` names it
    and the one used instead; otherwise it is moved to ``.damaged``, in one
    line. What goes is set aside (``SetAside``, returned) until the run
    ends: a run refused once started gives it back, as does a run that
    ends without results of its own (no summary written: ``_end_aside``)."""
    aside = SetAside(out)
    try:
        _set_aside(out, resolved, w0, aside)
    except BaseException:
        aside.restore()
        raise
    aside.begins()
    return aside


def _set_aside(out: Path, resolved, w0, aside: SetAside) -> None:
    engine = resolved.engine
    clear_results(out, resuming=bool(getattr(engine, "resume_dir", None)), aside=aside)
    folder = getattr(engine, "checkpoint_dir", None)
    if folder:
        run, resume_dir = resolved.run, getattr(engine, "resume_dir", None)
        resuming = bool(resume_dir) and Path(resume_dir).resolve() == Path(folder).resolve()
        launch = None if resuming else engine.restarted_launch()
        _checkpoints.remove_others(folder, _checkpoints.identity(
            resolved.problem, resolved.strategy, resolved.rule, resolved.processes,
            run["batch_size"], run["seed"], engine.name, engine.settings),
            _checkpoints.shapes(w0, resolved.rule), resuming=resuming,
            keep_mine=resuming or launch is not None, remove=aside.keep, launch=launch)


def _model_declares(problem) -> dict:
    """What the model computes per worker, beside its parameters, as its
    problem declares it: ``buffers``, how many it has (BatchNorm's running
    statistics: ``Problem.state()``); ``random_draws``, where its training
    passes draw random numbers (``Problem.draws_random``: a torch model's
    Dropout). The report tells by them whether sync's steps can equal
    serial's."""
    state = problem.state()
    return {**({"buffers": len(state)} if state else {}),
            **({"random_draws": True} if problem.draws_random() else {})}


def _constant_loss(problem) -> float | None:
    """The best constant predictor's loss, where the problem knows it."""
    return None if problem.constant_loss is None else problem.constant_loss()


def _run(resolved, problem, w0, total, out, raise_on_divergence, recorder) -> Result:
    run, rule, strat, budget, engine = (resolved.run, resolved.rule, resolved.strategy,
                                        resolved.budget, resolved.engine)
    t_start = time.perf_counter()

    def train():
        # A torch problem's steps in this process (serial, the sim, worker
        # threads) put torch's intra-op threads beside OpenBLAS's, which
        # monsoon's own passes over the flat vector (asum, axpy) wake and
        # which then spin on the same cores: one BLAS thread for the run
        # (a 200k-parameter MLP's serial step was 15x slower otherwise).
        # Workers in processes set their own; a NumPy problem keeps its BLAS.
        with single_blas_thread() if problem.uses_torch else contextlib.nullcontext():
            return engine.run(problem, rule, strat, w0, resolved.processes, run['batch_size'],
                              run['seed'], budget, recorder)

    # engines that stop cleanly on SIGTERM/SIGINT say so (every built-in one);
    # ``late`` is entered inside, so no moment after the engine returns is left
    # to the default handlers, and the stop's repeats (``REPEAT_S``) stay its own
    with StopSignals(engine.stops_on_signal) as during:
        try:
            res = _or_failed(train, resolved, recorder, out, t_start, w0)
        finally:
            recorder.close()
        if res.follower:  # the torch engine's rank 0 records the run
            return Result({"follower": True}, [], res.params, problem)
        # a stop while the curve is evaluated and the folder written: the curve's
        # ends only (``Recorder.hurry``), and the folder written whole
        with StopSignals() as late:
            if not res.interrupted:  # one that came after the engine returned
                late.signum = during.signum
            with on_stop(recorder.hurry):
                return _settle(resolved, problem, res, recorder, out, t_start, w0,
                               raise_on_divergence, late)


def _write_results(out: Path, config: dict, summary: dict, rows, problem, params) -> Path:
    """The ended run's folder and trained model (``write_run_folder``,
    ``save_model``); a folder that cannot be written (a full disk, a folder
    made read-only) ends the run in one line (``RunFailed``), which says
    so, and, once they are (``_given_back``), that the previous run's
    results are back in place."""
    try:
        folder = write_run_folder(out, config, summary, rows)
        save_model(folder, problem, params)
    except OSError as exc:
        line = (f"the run ended ({summary['status']}) after {summary['updates']} updates, "
                f"but its run folder {out} could not be written ({_first_line(exc)})")
        err = RunFailed(line)
        err.run_dir, err.folder_line = out, line + GIVEN_BACK
        raise err from exc
    return folder


def _settle(resolved, problem, res, recorder, out, t_start, w0, raise_on_divergence,
            late) -> Result:
    """After the engine returned: the curve evaluated, the summary, the run
    folder and the result; an interrupted run, a divergence (where asked),
    and a stop asked for meanwhile (``late``: ``StopSignals``) are raised
    once the folder is written."""
    run, rule, strat, engine = resolved.run, resolved.rule, resolved.strategy, resolved.engine
    interrupted = res.interrupted
    if reached_target(res.stopped) and recorder.target_params is not None:
        res.params = recorder.target_params  # what met the target, not pushes landed after

    def evaluate():
        # The curve's snapshots are evaluated now, after the run, off its clock
        # (each with the buffers the engine took with it, else those the
        # monitor's model has); the final row with the trained buffers,
        # combined per the strategy's policy.
        recorder.settled_rows(final_updates=res.updates)
        if res.worker_states:
            problem.load_state(combine_buffers(res.worker_states, strat.buffers))
        return recorder.finish(res.wall_time_s, res.updates, res.examples, res.params,
                               res.examples_left_out or 0)

    # a failure here (a worker's bad data, met again over the whole set) ends
    # as an engine's does, the folder also holding what the run trained
    final = _or_failed(evaluate, resolved, recorder, out, t_start, w0, res)
    final_loss = final["loss"]
    at_target = res.stopped if reached_target(res.stopped) else None
    at_tol = res.stopped if converged(res.stopped) else None
    if at_target or at_tol:  # stopped where it was asked to: not a divergence
        res.stopped = None
    # the divergence message with the counts summary.json writes, not those
    # of the row that stopped the run
    local = None if res.local_updates is None else (res.local_updates, res.dropped_local_updates)
    res.stopped = recorder.restate(res.stopped, res.updates, res.dropped_updates, local)
    if res.stopped is None and not math.isfinite(final_loss):
        res.stopped = DIVERGED.format(loss=final_loss, updates=res.updates)
    if res.stopped:  # a divergence: from the start, no lower learning rate helps
        res.stopped = not_finite_at_start(recorder.rows) or res.stopped
    summary = {
        "problem": run["problem"],
        "strategy": run["strategy"],
        "engine": run["engine"],
        "backend": engine.backend_used,
        "rule": run["rule"],
        "workers": run["workers"],
        "seed": run['seed'],
        "final_loss": final_loss,
        **{k: v for k, v in final.items() if k in OPTIONAL_COLUMNS},
        "wall_time_s": res.wall_time_s,
        "startup_s": res.startup_s,
        "updates": res.updates,
        "examples": res.examples,
        "examples_per_s": res.examples / res.wall_time_s if res.wall_time_s > 0 else None,
        # the passes over the data that ran: the rows taken and those left out
        "epochs": (res.examples + (res.examples_left_out or 0)) / problem.n_examples,
        "staleness": staleness_stats(res.staleness),
        "staleness_counts": {int(k): int(v) for k, v in sorted(res.staleness.items())},
        "dropped_updates": res.dropped_updates,
        # the workers' local steps (local SGD, EASGD), in a unit of their own
        **({"local_updates": res.local_updates,
            "dropped_local_updates": res.dropped_local_updates} if local else {}),
        # rows drawn that no update used (spark: a BatchNorm's one-row share of a batch)
        **({"examples_left_out": res.examples_left_out}
           if res.examples_left_out is not None else {}),
        "late_gradients": res.late_gradients,
        "failed_workers": [{"worker": f["worker"], "error": f["error"]} for f in res.failed_workers],
        "time_to_target_s": recorder.time_to_target_s,
        "curve_rows_dropped": recorder.rows_dropped,  # past the curve's evaluation time
        "target_loss": run['target_loss'],
        "lr": run["lr"],
        "batch_size": run['batch_size'],
        "dtype": run["dtype"],
        "devices": _devices.summary_devices(resolved.devices),
        "precision": run["precision"],
        "shards": engine.shards_used,
        "n_params": problem.n_params,
        "n_examples": problem.n_examples,
        **_model_declares(problem),
        "status": "interrupted" if interrupted else "diverged" if res.stopped else
                  "reached target" if at_target else "converged" if at_tol else "finished",
        "total_time_s": time.perf_counter() - t_start,
        "monsoon_version": __version__,
    }
    if at_target:
        summary["stopped_at_target"] = at_target
    if at_tol:
        summary["stopped_converged"] = at_tol
    if res.stopped:
        summary["stopped"] = res.stopped
    elif not interrupted:
        warning = worse_than_start(recorder.rows, final_loss, _constant_loss(problem))
        if warning:
            summary["warning"] = warning
            print(f"monsoon: warning: {warning}", file=sys.stderr, flush=True)
    summary.update(res.extra)
    if "clock_staleness_counts" in res.extra:  # SSP: the staleness in clocks, as in updates
        summary["clock_staleness"] = staleness_stats(Counter(res.extra["clock_staleness_counts"]))
    summary.update({k: v for k, v in strat.describe().items()
                    if k not in ("strategy", "local_rule")})
    if strat.local_rule is not None:
        summary["outer_rule"] = rule.describe()
    if getattr(rule if strat.local_rule is None else strat.local_rule, "staleness_lr", False):
        summary["staleness_lr"] = True
    if summary.get("bytes_sent_per_update"):  # metrics.csv's bytes_sent column
        add_bytes_column(recorder.rows, summary["bytes_sent_per_update"])
    problem.keep_trained(res.params)  # the user's module ends trained, as serial's does
    result = Result(summary, recorder.rows, res.params, problem,
                    worker_params=res.worker_params or None,
                    state=problem.state())
    if out is not None:
        full_config = {**resolved.config(), "server_rule": rule.describe(), **strat.describe(),
                       **engine.describe(), "problem_info": problem.describe()}
        result.run_dir = _write_results(Path(out), full_config, summary, recorder.rows,
                                        problem, res.params)
    if interrupted:
        where = f"run folder {out}" if out is not None else "no run folder (give --out)"
        # its own newest checkpoint, else the one it resumed from: either carries it on
        saved = res.extra.get("checkpoint") or res.extra.get("resumed_from")
        hint = (_resume_hint(resolved, out, checkpoint=bool(saved))
                if out is not None else "") or _no_checkpoint(resolved)
        if not saved and not _checkpoints.finite(res.params):
            hint = _diverged_unsaved(resolved)
        err = Interrupted(f"interrupted by {signal_name(interrupted)} after {res.updates} "
                          f"updates: {where}{hint}", interrupted, result.run_dir)
        err.result = result
        raise err
    if res.stopped and raise_on_divergence:
        err = TrainingDiverged(res.stopped + (f" (run folder: {out})" if out else ""))
        err.result = result
        raise err
    if late.signum is not None:  # the run is whole: the stop cut its curve short at most
        where = f"run folder {out}" if out is not None else "no run folder (give --out)"
        cut = (f" ({recorder.rows_dropped} points of its curve not evaluated)"
               if recorder.rows_dropped else "")
        err = Interrupted(f"interrupted by {signal_name(late.signum)} after the run had "
                          f"finished: {where}{cut}", late.signum, result.run_dir)
        err.result = result
        raise err
    return result

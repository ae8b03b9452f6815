"""Live series: what a run shows while it trains (TensorBoard, MLflow, the bar).

Every worker already computes its mini-batch loss; each engine carries it
(with its examples, updates, staleness) in what it already moves: shared
memory counters (local), actor replies (ray), the collective's buffer
(torch), task results (spark), the event loop's state (sim). The monitor
(the driver, rank 0) hands those cumulative figures to ``LiveWriter.write``
at most every ``every`` seconds (``Recorder.live``), and once more when its
loop ends (``Due.live``'s ``final``: the run's final counts); the writer turns them
into one row: per worker, the mean mini-batch loss since the last row (the
smoothed loss), examples/s and updates; for the run, examples/s, updates,
dropped updates, staleness (mean and max since the last row) and bytes
sent where the engine counts them. Nothing here runs on a worker.

Sinks:

- TensorBoard event files under ``OUT/tb/`` (``events.py``: the file format,
  written with no dependency; ``pip install tensorboard`` to view them).
  One event per row holds all its tags (one record, one checksum). Tags
  group by prefix (TensorBoard: one chart per tag, in a section per
  prefix): ``loss/worker-K``, ``examples_per_s/worker-K``,
  ``updates/worker-K``, ``run/...``. The step
  is the run's examples so far, the event's time the run's start plus its
  clock (virtual time in the sim: TensorBoard's "relative" axis shows it).
  After the run, ``objective/loss`` (and accuracy, validation columns where
  present) is the exact full-data curve of ``metrics.csv``.
- MLflow (``--mlflow [URI]``): the run's config as parameters, the same
  series as metrics (batched, at most ``MLFLOW_BATCH`` a call, flushed every
  ``MLFLOW_FLUSH_S``) and the run folder as artifacts at the end. The first
  contact retries little, briefly (``MLFLOW_FIRST_CONTACT``): no server, one
  line within seconds, not after MLflow's minutes of retries.

Per-worker series stop at ``PER_WORKER_MAX`` workers (the sim runs
thousands); the run's series cover every worker. A writer is pickled (the
torch engine's rank 0 runs in a child process) without its open files: it
opens them again where it next writes, its event file by the path it began
(appended to), so a run has one event file whichever of its processes
write the live rows and the post-run curve.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from collections import Counter
from pathlib import Path

from ..errors import ConfigError
from .events import EventFile
from .folder_lock import LOCK_NAME

PER_WORKER_MAX = 64
MLFLOW_BATCH = 1000   # MLflow's cap on the metrics of one log_batch call
MLFLOW_PARAMS = 100   # and on its parameters
MLFLOW_FLUSH_S = 5.0
# The sink's first request to the tracking server, where the user has not set
# these: MLflow's defaults (7 retries with backoff, 120 s each) held a refused
# connection about 4 minutes in silence; these give up within about 20 s at
# worst (3 tries of 5 s), a refused connection within seconds.
MLFLOW_FIRST_CONTACT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                        "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
OBJECTIVE = ("loss", "accuracy", "val_loss", "val_accuracy")


# A worker's mini-batch losses as the live series read them, cumulative (a
# list, or a row of shared memory, of ``LOSS_CELLS``; ``add_loss``): the
# finite ones' sum and the low part that sum lost (Neumaier's compensation:
# a huge loss does not swallow the later ones, and a row's window of the
# totals is still its losses' mean), how many losses in all, and how many
# were +Inf, -Inf, NaN (kept out of the sum: they poison their row alone).
LOSS_CELLS = 6
LOSS_SUM, LOSS_COMP, LOSS_N = 0, 1, 2
_NON_FINITE = ((3, math.inf), (4, -math.inf), (5, math.nan))


def add_loss(cells, loss, n: int = 1) -> None:
    """Add ``loss``, the sum of ``n`` mini-batch losses, to ``cells``."""
    loss = float(loss)
    cells[LOSS_N] += n
    if not math.isfinite(loss):
        cells[3 if loss > 0 else 4 if loss < 0 else 5] += 1
        return
    total = float(cells[LOSS_SUM])
    added = total + loss
    cells[LOSS_COMP] += ((total - added) + loss if abs(total) >= abs(loss)
                         else (loss - added) + total)
    cells[LOSS_SUM] = added


def _losses(fig: dict) -> tuple | None:
    """A worker's cumulative losses in ``add_loss``'s cells (a copy), from
    ``losses`` or a plain ``loss_sum`` and ``loss_n``; None: neither."""
    if "losses" in fig:
        return tuple(float(v) for v in fig["losses"])
    if "loss_n" in fig:
        return (float(fig["loss_sum"]), 0.0, float(fig["loss_n"]), 0.0, 0.0, 0.0)
    return None


def _loss_window(now: tuple, before: tuple | None) -> tuple[float, float] | None:
    """(sum, count) of the losses between two cumulative readings (the sum
    +Inf, -Inf or NaN where one of them was); None: none."""
    before = before or (0.0,) * LOSS_CELLS
    n = now[LOSS_N] - before[LOSS_N]
    if n <= 0:
        return None
    bad = [value for i, value in _NON_FINITE if now[i] > before[i]]
    if bad:
        return sum(bad), n
    return (now[LOSS_SUM] - before[LOSS_SUM]) + (now[LOSS_COMP] - before[LOSS_COMP]), n


def _stale_window(now, before) -> tuple[float | None, float | None]:
    """Mean and max staleness of the updates between two cumulative
    readings: ``Counter`` (staleness -> count) or ``(sum, count, max since
    the last reading)``."""
    if now is None:
        return None, None
    if isinstance(now, Counter) or isinstance(now, dict):
        window = Counter(now)
        window.subtract(before or Counter())
        window = {k: c for k, c in window.items() if c > 0}
        n = sum(window.values())
        if not n:
            return None, None
        return sum(int(k) * c for k, c in window.items()) / n, float(max(map(int, window)))
    total, count, biggest = now
    prev_total, prev_count = (before[0], before[1]) if before else (0.0, 0)
    n = count - prev_count
    if n <= 0:
        return None, None
    return (total - prev_total) / n, float(biggest)


@contextlib.contextmanager
def _first_contact():
    """``MLFLOW_FIRST_CONTACT`` in the environment, each where the user has
    not set it, for the time of one request (MLflow reads them at each)."""
    unset = [k for k in MLFLOW_FIRST_CONTACT if k not in os.environ]
    os.environ.update({k: MLFLOW_FIRST_CONTACT[k] for k in unset})
    try:
        yield
    finally:
        for k in unset:
            os.environ.pop(k, None)


class MlflowSink:
    """One MLflow run: parameters at the start, metrics in batches, the run
    folder as artifacts at the end."""

    def __init__(self, uri: str | None, name: str, params: dict, tags: dict | None = None,
                 flag: str = "--mlflow"):
        """``flag``: how a refusal names the option (``mlflow=`` from Python)."""
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ConfigError(f"{flag} needs MLflow: pip install 'monsoon[mlflow]' "
                              f"(or drop {flag})") from None
        self.uri = uri
        try:
            # the bare flag: MLFLOW_TRACKING_URI or MLflow's default, resolved
            # here (MLflow 3's default, ./mlflow.db, is relative to this process's
            # folder): a copy of the sink in another process logs to the same store
            from mlflow import get_tracking_uri

            self.uri = uri or get_tracking_uri()
            client = MlflowClient(tracking_uri=self.uri)
            with _first_contact():
                found = client.get_experiment_by_name("monsoon")
            experiment = found.experiment_id if found else client.create_experiment("monsoon")
            run = client.create_run(experiment, run_name=name, tags=tags or {})
        except Exception as exc:  # noqa: BLE001 - MLflow's reason, in one line
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if not uri:
                where = f" (MLflow default: {self.uri})"
            else:  # from Python, the keyword and its value: mlflow='http://...'
                where = repr(uri) if flag.endswith("=") else " " + uri
            raise ConfigError(f"{flag}{where}: {reason}") from None
        self.run_id = run.info.run_id
        self._client = client
        self._pending: list = []
        self._flushed = time.monotonic()
        from mlflow.entities import Param

        items = [Param(str(k)[:250], str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), MLFLOW_PARAMS):
            client.log_batch(self.run_id, params=items[i:i + MLFLOW_PARAMS])

    def __getstate__(self):
        self.flush()
        return {"uri": self.uri, "run_id": self.run_id, "_pending": [],
                "_flushed": 0.0, "_client": None}

    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def metrics(self, values: dict, step: int, wall: float) -> None:
        from mlflow.entities import Metric

        ms = int(wall * 1000)
        self._pending.extend(Metric(k, float(v), ms, int(step)) for k, v in values.items())
        if (len(self._pending) >= MLFLOW_BATCH
                or time.monotonic() - self._flushed >= MLFLOW_FLUSH_S):
            self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        for i in range(0, len(pending), MLFLOW_BATCH):
            self.client().log_batch(self.run_id, metrics=pending[i:i + MLFLOW_BATCH])
        self._flushed = time.monotonic()

    def finish(self, folder: Path | None, status: str) -> None:
        """The run folder as artifacts, but its lock (``folder_lock``: held
        now, it says which process runs there, not what the run made)."""
        self.flush()
        client = self.client()
        if folder is not None and Path(folder).is_dir():
            for entry in sorted(Path(folder).iterdir()):
                if entry.name == LOCK_NAME:
                    continue
                if entry.is_dir():
                    client.log_artifacts(self.run_id, str(entry), entry.name)
                else:
                    client.log_artifact(self.run_id, str(entry))
        client.set_terminated(self.run_id, status)


class LiveWriter:
    """Rows of live series, written to TensorBoard and MLflow (where asked)
    and kept as ``last`` for the progress bar."""

    def __init__(self, every: float = 1.0, tb_dir: Path | None = None,
                 mlflow: MlflowSink | None = None):
        self.every = every
        self.tb_dir = Path(tb_dir) if tb_dir is not None else None
        self.mlflow = mlflow
        self.next = 0.0
        self.wall0 = time.time()
        self.rows = 0
        self.last: dict = {}
        self._prev: dict | None = None
        self._tb = None
        self._tb_path = None  # the run's event file, once begun (``open``)

    @property
    def series(self) -> bool:
        """Whether it writes live series (``every`` above 0), or only the
        post-run curve."""
        return self.every > 0

    def __getstate__(self):
        self.flush()
        state = dict(self.__dict__)
        state["_tb"] = None
        return state

    # -- during the run -------------------------------------------------------
    def due(self, now: float) -> bool:
        return now >= self.next

    def write(self, now: float, examples: int, updates: int, workers: dict | None = None,
              staleness=None, dropped: int | None = None, bytes_sent: int | None = None) -> dict:
        """One row from cumulative figures: ``workers`` maps a rank to any of
        ``losses`` (``add_loss``'s cells), or ``loss_sum`` and ``loss_n``
        (cumulative: the row has their mean since the last row), or ``loss``
        (a recent value), ``examples``, ``updates``;
        ``staleness`` is a Counter or ``(sum, count, max since last)``."""
        self.next = now + self.every
        prev = self._prev or {"now": 0.0, "examples": 0, "workers": {}, "staleness": None}
        dt = now - prev["now"]
        values: dict[str, float] = {"run/examples": examples, "run/updates": updates}
        if dt > 0 and self._prev is not None:
            values["run/examples_per_s"] = (examples - prev["examples"]) / dt
        if dropped is not None:
            values["run/dropped_updates"] = dropped
        if bytes_sent is not None:
            values["run/bytes_sent"] = bytes_sent
        mean, worst = _stale_window(staleness, prev["staleness"])
        if mean is not None:
            values["run/staleness_mean"], values["run/staleness_max"] = mean, worst
        loss_sum = loss_n = 0.0
        seen = {}
        for rank, fig in sorted((workers or {}).items())[:PER_WORKER_MAX]:
            was = prev["workers"].get(rank, {})
            tag = f"worker-{rank}"
            losses = _losses(fig)
            if losses is not None:
                window = _loss_window(losses, was.get("losses"))
                if window is not None:
                    values[f"loss/{tag}"] = window[0] / window[1]
                    loss_sum, loss_n = loss_sum + window[0], loss_n + window[1]
            elif fig.get("loss") is not None and math.isfinite(fig["loss"]):
                values[f"loss/{tag}"] = fig["loss"]
                loss_sum, loss_n = loss_sum + fig["loss"], loss_n + 1
            if "examples" in fig and dt > 0 and rank in prev["workers"]:
                values[f"examples_per_s/{tag}"] = (fig["examples"] - was.get("examples", 0)) / dt
            if "updates" in fig:
                values[f"updates/{tag}"] = fig["updates"]
            seen[rank] = dict(fig, **({"losses": losses} if losses is not None else {}))
        if loss_n:
            values["run/minibatch_loss"] = loss_sum / loss_n
        self._prev = {"now": now, "examples": examples, "workers": seen,
                      "staleness": Counter(staleness) if isinstance(staleness, (dict, Counter))
                      else staleness}
        values = {k: float(v) for k, v in values.items() if v is not None}
        self._emit(values, examples, now)
        self.rows += 1
        self.last = {"loss": values.get("run/minibatch_loss"),
                     "examples_per_s": values.get("run/examples_per_s"),
                     "staleness_max": values.get("run/staleness_max", self.last.get(
                         "staleness_max"))}
        return values

    def _emit(self, values: dict, step: int, now: float) -> None:
        wall = self.wall0 + now
        if self.tb_dir is not None:
            self._tensorboard(values, step, wall)
        if self.mlflow is not None:
            self.mlflow.metrics(values, step, wall)

    def open(self) -> "LiveWriter":
        """Open the event file now (before the run's clock starts); a
        writer that crossed to another process opens the same file again
        where it writes."""
        if self._tb is None and self.tb_dir is not None:
            self._tb = EventFile(self.tb_dir, path=self._tb_path)
            self._tb_path = self._tb.path
        return self

    def _tensorboard(self, values: dict, step: int, wall: float) -> None:
        self.open()
        self._tb.scalars(values, int(step), wall)

    # -- after the run ---------------------------------------------------------
    def curve(self, rows: list[dict]) -> None:
        """The exact full-data curve (``metrics.csv``'s rows) under ``objective/``."""
        for row in rows:
            values = {f"objective/{k}": float(row[k]) for k in OBJECTIVE
                      if row.get(k) is not None}
            values["objective/epoch"] = float(row["epoch"])
            self._emit(values, int(row["examples"]), float(row["time_s"]))

    def flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()
        if self.mlflow is not None:
            self.mlflow.flush()

    def finish(self, rows: list[dict] | None, folder: Path | None, status: str) -> None:
        """Write the post-run curve, close the files; MLflow gets the run
        folder and ``status`` (FINISHED, FAILED, KILLED)."""
        try:
            if rows:
                self.curve(rows)
        finally:
            self.close()
            if self.mlflow is not None:
                mlflow, self.mlflow = self.mlflow, None
                mlflow.finish(folder, status)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def make_live(run: dict, out, config: dict, label: str, named, bar: bool = False
              ) -> LiveWriter | None:
    """The run's live writer, or None when nothing would read it (no run
    folder, no MLflow, no progress bar, or ``live_every`` 0). With
    ``live_every`` 0 and ``tensorboard`` asked for, a writer of no live
    series (``series`` False): only the post-run ``objective/`` curve.
    ``named(name)``: how a refusal names an option (``Option.named``: its
    flag, or from Python its keyword)."""
    every = run.get("live_every") or 0.0
    want_tb = run.get("tensorboard")
    if every <= 0:
        if run.get("mlflow") is not None:
            raise ConfigError(f"{named('mlflow')} logs the live series: give "
                              f"{named('live_every')} above 0")
        if not want_tb:
            return None
    tb_dir = None
    if out is not None and want_tb is not False:
        tb_dir = Path(out) / "tb"
    elif want_tb and out is None:
        raise ConfigError(f"{named('tensorboard')} writes under the run folder: "
                          f"give {named('out')}")
    sink = None
    if run.get("mlflow") is not None:
        uri = None if run["mlflow"] in ("", "auto") else run["mlflow"]
        sink = MlflowSink(uri, label, config, tags={"monsoon.out": str(out or "")},
                          flag=named("mlflow"))
    if tb_dir is None and sink is None and not bar:
        return None
    return LiveWriter(every, tb_dir, sink).open()


def add_figures(workers: dict, rank: int, loss_sum: float, loss_n: int, examples: int,
                updates: int | None = None) -> None:
    """Add to worker ``rank``'s cumulative figures in ``workers``, the form
    ``LiveWriter.write`` reads (``updates``: where the engine counts them)."""
    fig = workers.setdefault(rank, {"losses": [0.0] * LOSS_CELLS, "examples": 0})
    losses = list(fig["losses"])  # a new list: a copy of ``workers`` read meanwhile keeps its own
    add_loss(losses, loss_sum, loss_n)
    fig["losses"] = losses
    fig["examples"] += examples
    if updates is not None:
        fig["updates"] = fig.get("updates", 0) + updates
